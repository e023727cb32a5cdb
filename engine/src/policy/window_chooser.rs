//! Sizing the admission window by miniature simulation (after Waldspurger et al., "Cache
//! Modeling and Optimization using Miniature Simulations", USENIX ATC'17).
//!
//! No fixed window suits every workload: a loop or a scan wants almost none, a burst of recency
//! wants most of the cache. Hill climbing on the hit ratio compares one sample with the previous
//! one, so a change of phase in the workload looks like the effect of the last move and steers it
//! the wrong way about as often as the right way. The chooser instead runs a few shadow caches
//! side by side, each with its own fixed window share, on the same requests at the same time:
//! every phase hits all of them alike, and the shadow with the fewest recent misses names the
//! window for the real cache.
//!
//! A shadow holds no data, only keys. A large cache's shadows see a hashed sample of the keys
//! (one in `sample_one_in`) with the capacity scaled down alike, so that the shadows together stay
//! a small fraction of the real policy's memory and of its work per request.

use super::random::mix;
use super::tiny_lfu_sieve::WindowedCache;
use super::Capacity;

/// The window shares the shadows try, in percent of the capacity. The smallest is W-TinyLFU's
/// 1%; the largest leaves a tenth of the cache to frequency.
pub(crate) const WINDOW_PERCENTS: [u64; 5] = [1, 10, 35, 65, 90];
/// The share the real cache starts with (10%, S3-FIFO's small queue): a window that already
/// catches a second read soon after the first while the shadows learn. One of the shadows'
/// shares, so that the chooser can compare against it.
pub(crate) const WINDOW_PERCENT_INITIAL: u64 = WINDOW_PERCENTS[1];
/// A shadow simulates at most about this many objects; a larger cache's shadows sample its keys.
const SHADOW_OBJECTS_MAX: u64 = 16_384;
/// A byte-sized cache's population is unknown when the shadows are sized; assuming objects this
/// large overestimates nothing that matters: the shadows then sample fewer keys than they could.
const BYTE_CACHE_OBJECT_BYTES_ASSUMED: u64 = 64 * 1024;
/// The chooser decides once per this many requests per resident object.
const PERIOD_REQUESTS_PER_OBJECT: u64 = 4;
/// The shortest period, in requests, so that a nearly empty cache does not decide on noise.
const PERIOD_REQUESTS_MIN: u64 = 256;
/// Each period, a shadow's score (its misses, discounted) keeps this fraction of the old score:
/// the last ten or so periods count, so the choice follows the workload's phases without
/// jumping at every blip.
const SCORE_DECAY: f64 = 0.9;
/// The window moves only to a shadow that missed at least this fraction less than the shadow of
/// the current window: a move costs the real cache the misses of refilling its queues, which the
/// shadows, whose windows never move, do not see (on cloudPhysicsIO, moving on any lead made the
/// real cache worse than staying).
const SWITCH_MARGIN: f64 = 0.02;

struct Shadow {
    cache: WindowedCache,
    window_percent: u64,
    misses_in_period: u64,
    /// Misses over the past periods, each period's discounted by `SCORE_DECAY`.
    score: f64,
}

/// Shadow caches with different windows, and which of them has missed least lately.
pub(crate) struct WindowChooser {
    shadows: Vec<Shadow>,
    /// A shadow sees the keys whose hash is 0 modulo this (a power of two).
    sample_one_in: u64,
    seed: u64,
    requests_left: u64,
}

impl WindowChooser {
    /// Shadows for a cache of `capacity`, seeing at least one key in `sample_one_in_min` (a
    /// larger cache's shadows see fewer).
    pub(crate) fn new(capacity: Capacity, seed: u64, sample_one_in_min: u64) -> WindowChooser {
        let objects_estimate = match capacity {
            Capacity::Objects(objects) => objects,
            Capacity::Bytes(bytes) => bytes / BYTE_CACHE_OBJECT_BYTES_ASSUMED,
        };
        let sample_one_in = (objects_estimate / SHADOW_OBJECTS_MAX)
            .max(sample_one_in_min)
            .max(1)
            .next_power_of_two();
        let shadow_capacity = match capacity {
            Capacity::Objects(objects) => Capacity::Objects((objects / sample_one_in).max(1)),
            Capacity::Bytes(bytes) => Capacity::Bytes((bytes / sample_one_in).max(1)),
        };
        let shadows = WINDOW_PERCENTS
            .iter()
            .map(|&window_percent| Shadow {
                cache: WindowedCache::new(shadow_capacity, seed, window_percent),
                window_percent,
                misses_in_period: 0,
                score: 0.0,
            })
            .collect();
        WindowChooser {
            shadows,
            sample_one_in,
            seed: mix(seed ^ 0x7368_6164_6f77),
            requests_left: PERIOD_REQUESTS_MIN,
        }
    }

    /// Replays one request in the shadows (if its key is in the sample). At the end of a period,
    /// returns the window share to use, in percent: that of the shadow that missed least lately
    /// if it beat the shadow of `current_percent` by `SWITCH_MARGIN`, else `current_percent`. The
    /// next period lasts `PERIOD_REQUESTS_PER_OBJECT` requests per object of `resident_objects`.
    pub(crate) fn observe(
        &mut self,
        key: u64,
        size_bytes: u64,
        resident_objects: u64,
        current_percent: u64,
        evicted: &mut Vec<u64>,
    ) -> Option<u64> {
        if mix(key ^ self.seed) & (self.sample_one_in - 1) == 0 {
            for shadow in &mut self.shadows {
                if !shadow.cache.access(key, size_bytes, evicted).is_hit() {
                    shadow.misses_in_period += 1;
                }
            }
            // The shadows' evictions are theirs alone: nothing outside holds their keys.
            evicted.clear();
        }
        self.requests_left -= 1;
        if self.requests_left > 0 {
            return None;
        }
        self.requests_left =
            (resident_objects * PERIOD_REQUESTS_PER_OBJECT).max(PERIOD_REQUESTS_MIN);
        let mut current_score = f64::INFINITY;
        let mut best: Option<(f64, u64)> = None;
        for shadow in &mut self.shadows {
            shadow.score = shadow.score * SCORE_DECAY + shadow.misses_in_period as f64;
            shadow.misses_in_period = 0;
            if shadow.window_percent == current_percent {
                current_score = shadow.score;
            }
            // Strictly fewer: on a tie the smaller window (listed first) wins.
            if best.is_none_or(|(score, _)| shadow.score < score) {
                best = Some((shadow.score, shadow.window_percent));
            }
        }
        match best {
            Some((score, window_percent)) if score < current_score * (1.0 - SWITCH_MARGIN) => {
                Some(window_percent)
            }
            _ => Some(current_percent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_cache_samples_its_keys_and_a_small_one_does_not() {
        assert_eq!(
            WindowChooser::new(Capacity::Objects(1000), 1, 1).sample_one_in,
            1
        );
        assert_eq!(
            WindowChooser::new(Capacity::Objects(1 << 20), 1, 1).sample_one_in,
            64
        );
        assert_eq!(
            WindowChooser::new(Capacity::Bytes(1 << 30), 1, 1).sample_one_in,
            1
        );
        // A floor applies to a small cache and is rounded up to a power of two; a larger
        // cache's own sampling wins over a lower floor.
        assert_eq!(
            WindowChooser::new(Capacity::Bytes(256 << 20), 1, 16).sample_one_in,
            16
        );
        assert_eq!(
            WindowChooser::new(Capacity::Objects(1000), 1, 12).sample_one_in,
            16
        );
        assert_eq!(
            WindowChooser::new(Capacity::Objects(1 << 20), 1, 16).sample_one_in,
            64
        );
    }

    #[test]
    fn picks_the_largest_window_when_only_recency_pays() {
        // Each key is read twice, 150 requests apart, in a cache of 200: only a window larger
        // than about 150 objects catches the second read.
        let mut chooser = WindowChooser::new(Capacity::Objects(200), 1, 1);
        let mut evicted = Vec::new();
        let mut choice = None;
        for request in 0..100_000u64 {
            let key = if request % 2 == 0 {
                request / 2
            } else {
                request / 2 - 75.min(request / 2)
            };
            if let Some(window_percent) = chooser.observe(key, 1, 200, 1, &mut evicted) {
                choice = Some(window_percent);
            }
        }
        assert_eq!(choice, Some(90));
    }

    #[test]
    fn picks_the_smallest_window_on_a_loop_larger_than_the_cache() {
        let mut chooser = WindowChooser::new(Capacity::Objects(100), 1, 1);
        let mut evicted = Vec::new();
        let mut choice = None;
        for request in 0..100_000u64 {
            if let Some(window_percent) = chooser.observe(request % 150, 1, 100, 1, &mut evicted) {
                choice = Some(window_percent);
            }
        }
        assert_eq!(choice, Some(1));
    }
}
