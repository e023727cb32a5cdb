//! Hill climbing on the hit ratio, to size the admission window (as Caffeine does, after
//! Einziger et al., "Adaptive Software Cache Management", Middleware'18).
//!
//! The climber watches one sample of requests at a time. At the end of a sample it compares the
//! hit ratio with the previous sample's: if it improved, the last move was good and the next goes
//! the same way; if it worsened, the next goes the other way. Steps decay geometrically while the
//! hit ratio is stable and jump back to full size when it moves a lot, which is how a workload
//! that swings between recency and frequency is followed.

/// A full step, in percent of the capacity.
const STEP_PERCENT: f64 = 6.25;
/// A change of hit ratio this large (absolute) means the workload changed: restart with full
/// steps.
const RESTART_THRESHOLD: f64 = 0.05;
/// Each sample's step is this fraction of the last one while the hit ratio is stable.
const STEP_DECAY: f64 = 0.98;

pub(crate) struct HillClimber {
    capacity_units: f64,
    hits: u64,
    misses: u64,
    previous_hit_ratio: f64,
    /// The last move, signed, in capacity units: positive grew the window. The first move
    /// shrinks it, toward frequency: a workload with no reuse (a scan) never changes the hit
    /// ratio, so the climber keeps going the way it started, and that must be the safe way.
    step: f64,
}

impl HillClimber {
    pub(crate) fn new(capacity_units: u64) -> HillClimber {
        let capacity_units = capacity_units as f64;
        HillClimber {
            capacity_units,
            hits: 0,
            misses: 0,
            previous_hit_ratio: 0.0,
            step: -capacity_units * STEP_PERCENT / 100.0,
        }
    }

    pub(crate) fn record(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    /// When `sample_size` requests have been recorded, the window change to make (in capacity
    /// units, signed) and a new sample begins; before that, nothing.
    pub(crate) fn adjustment(&mut self, sample_size: u64) -> Option<i64> {
        let requests = self.hits + self.misses;
        if requests < sample_size {
            return None;
        }
        let hit_ratio = self.hits as f64 / requests as f64;
        let change = hit_ratio - self.previous_hit_ratio;
        let direction = if change >= 0.0 { self.step } else { -self.step };
        let full_step = self.capacity_units * STEP_PERCENT / 100.0;
        self.step = if change.abs() >= RESTART_THRESHOLD {
            full_step.copysign(direction)
        } else {
            direction * STEP_DECAY
        };
        self.previous_hit_ratio = hit_ratio;
        self.hits = 0;
        self.misses = 0;
        Some(direction.round() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_direction_while_the_hit_ratio_improves_and_reverses_when_it_falls() {
        let mut climber = HillClimber::new(1600);
        let sample = 100;
        let run_sample = |climber: &mut HillClimber, hits: u64| {
            for request in 0..sample {
                climber.record(request < hits);
            }
            climber.adjustment(sample).expect("a full sample")
        };
        // From 0 to 50%: a big change, full step in the first direction (shrink).
        assert_eq!(run_sample(&mut climber, 50), -100);
        // Slightly better: same direction, decayed.
        assert_eq!(run_sample(&mut climber, 52), -100);
        let decayed = run_sample(&mut climber, 53);
        assert!(decayed < 0 && decayed > -100, "{decayed}");
        // Worse: reverse.
        assert!(run_sample(&mut climber, 51) > 0);
    }

    #[test]
    fn waits_for_a_full_sample() {
        let mut climber = HillClimber::new(1000);
        climber.record(true);
        assert_eq!(climber.adjustment(2), None);
        climber.record(false);
        assert!(climber.adjustment(2).is_some());
    }
}
