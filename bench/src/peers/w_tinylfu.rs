//! W-TinyLFU (Einziger et al., TOS 2017), as Caffeine builds it: new keys enter an LRU window
//! (1% of the cache); a key leaving the window is admitted to the main cache (a segmented LRU,
//! 80% protected, 20% probation) only if the frequency sketch says it is seen more often than
//! the victim it would replace. The window's size is fixed (Caffeine's hill climber is left
//! out: hydrant's own policy is the adaptive one this is compared with). The sketch is
//! hydrant's (`FrequencySketch`), counting every access.

use hydrant_engine::policy::FrequencySketch;

use super::list::LinkedSet;
use super::Peer;

const WINDOW_SHARE: f64 = 0.01;
const PROTECTED_SHARE: f64 = 0.8;
const SKETCH_SEED: u64 = 0x7769_6e64_6f77;

pub struct WTinyLfu {
    capacity: u64,
    window: LinkedSet,
    window_capacity: u64,
    probation: LinkedSet,
    protected: LinkedSet,
    protected_capacity: u64,
    sketch: FrequencySketch,
}

impl WTinyLfu {
    pub fn new(capacity: u64) -> WTinyLfu {
        let window_capacity = ((capacity as f64 * WINDOW_SHARE) as u64).max(1);
        let main = capacity.saturating_sub(window_capacity);
        WTinyLfu {
            capacity,
            window: LinkedSet::new(),
            window_capacity,
            probation: LinkedSet::new(),
            protected: LinkedSet::new(),
            protected_capacity: (main as f64 * PROTECTED_SHARE) as u64,
            sketch: FrequencySketch::new(0, SKETCH_SEED),
        }
    }

    fn main_units(&self) -> u64 {
        self.probation.units() + self.protected.units()
    }

    /// The main cache's next victim: probation's tail, else protected's.
    fn victim(&self) -> Option<(u64, u64)> {
        self.probation
            .tail()
            .or_else(|| self.protected.tail())
            .map(|(key, charge, _)| (key, charge))
    }

    fn evict(&mut self, key: u64) {
        if self.probation.remove(key).is_none() {
            self.protected.remove(key);
        }
    }

    /// Offers a key leaving the window to the main cache.
    fn admit(&mut self, key: u64, charge: u64) {
        let main_capacity = self.capacity - self.window_capacity;
        if charge > main_capacity {
            return;
        }
        while self.main_units() + charge > main_capacity {
            let (victim, _) = self.victim().expect("the main cache holds something");
            if self.sketch.frequency(key) <= self.sketch.frequency(victim) {
                return;
            }
            self.evict(victim);
        }
        self.probation.push_head(key, charge, 0);
    }
}

impl Peer for WTinyLfu {
    fn access(&mut self, key: u64, charge: u64) -> bool {
        let population = (self.window.len() + self.probation.len() + self.protected.len()) as u64;
        self.sketch.ensure_capacity(population);
        self.sketch.increment(key);
        if self.window.move_to_head(key) || self.protected.move_to_head(key) {
            return true;
        }
        if let Some((charge, _)) = self.probation.remove(key) {
            self.protected.push_head(key, charge, 0);
            while self.protected.units() > self.protected_capacity {
                let (demoted, charge, _) = self.protected.pop_tail().expect("over its share");
                self.probation.push_head(demoted, charge, 0);
            }
            return true;
        }
        if charge > self.capacity {
            return false;
        }
        self.window.push_head(key, charge, 0);
        while self.window.units() > self.window_capacity {
            let (candidate, charge, _) = self.window.pop_tail().expect("over its share");
            self.admit(candidate, charge);
        }
        false
    }

    fn resident_units(&self) -> u64 {
        self.window.units() + self.main_units()
    }
}
