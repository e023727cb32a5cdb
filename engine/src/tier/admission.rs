//! Admission to the NVMe tier of what the origin returned on a miss.
//!
//! While the store has free regions, everything is admitted: nothing is displaced. Once it is
//! full, each admission makes reclaim evict older objects, so a miss is admitted only if its key
//! was seen before in the recent past (a W-TinyLFU frequency sketch with a doorkeeper: a scan of
//! one-hit objects larger than the tier does not flush it). Every admission also takes its bytes
//! from a write budget in bytes per second (a token bucket), which bounds the flash writes that
//! cache fills cause. Writes by clients are never subject to either: they are the data.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::time::Instant;

use crate::key::ObjectKey;
use crate::policy::FrequencySketch;

/// Sightings (this one included) a key needs in the current sketch period to displace others.
const ADMIT_FREQUENCY_MIN: u8 = 2;
/// The sketch starts sized for this many distinct keys and grows with the store's objects.
const SKETCH_OBJECTS_MIN: u64 = 65_536;
/// The budget's bucket holds this many seconds of rate, so short bursts pass whole.
const BUDGET_BURST_SECONDS: f64 = 1.0;

/// Counters of one shard's admission decisions.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdmissionStats {
    pub admitted: u64,
    pub admitted_bytes: u64,
    /// Refused: the store is full and the key was not seen before.
    pub rejected_cold: u64,
    /// Refused: the write budget was spent.
    pub rejected_budget: u64,
}

struct TokenBucket {
    bytes_per_second: f64,
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    fn take(&mut self, bytes: u64) -> bool {
        let now = Instant::now();
        let capacity = self.bytes_per_second * BUDGET_BURST_SECONDS;
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.bytes_per_second).min(capacity);
        self.refilled = now;
        if self.tokens >= bytes as f64 {
            self.tokens -= bytes as f64;
            true
        } else {
            false
        }
    }
}

pub struct NvmeAdmission {
    sketch: RefCell<FrequencySketch>,
    budget: Option<RefCell<TokenBucket>>,
    hasher: foldhash::fast::FixedState,
    stats: RefCell<AdmissionStats>,
}

impl NvmeAdmission {
    /// `bytes_per_second`: the write budget for admissions (`None`: unbounded).
    pub fn new(bytes_per_second: Option<u64>) -> NvmeAdmission {
        NvmeAdmission {
            sketch: RefCell::new(FrequencySketch::new(SKETCH_OBJECTS_MIN, 0x6164_6d69_7474)),
            budget: bytes_per_second.map(|rate| {
                RefCell::new(TokenBucket {
                    bytes_per_second: rate as f64,
                    tokens: rate as f64 * BUDGET_BURST_SECONDS,
                    refilled: Instant::now(),
                })
            }),
            hasher: foldhash::fast::FixedState::with_seed(0x6e76_6d65),
            stats: RefCell::default(),
        }
    }

    /// A read of `key` missed NVMe and goes to the origin: one sighting.
    pub fn record_miss(&self, key: &ObjectKey, store_objects: u64) {
        let mut sketch = self.sketch.borrow_mut();
        sketch.ensure_capacity(store_objects.max(SKETCH_OBJECTS_MIN));
        sketch.increment(self.hasher.hash_one(key.as_bytes()));
    }

    /// Whether `bytes` read from the origin for `key` may be written to NVMe now.
    /// `store_has_room`: the store can take them without evicting anything.
    pub fn admit(&self, key: &ObjectKey, bytes: u64, store_has_room: bool) -> bool {
        let mut stats = self.stats.borrow_mut();
        if !store_has_room {
            let seen = self
                .sketch
                .borrow()
                .frequency(self.hasher.hash_one(key.as_bytes()));
            if seen < ADMIT_FREQUENCY_MIN {
                stats.rejected_cold += 1;
                return false;
            }
        }
        if let Some(budget) = &self.budget {
            if !budget.borrow_mut().take(bytes) {
                stats.rejected_budget += 1;
                return false;
            }
        }
        stats.admitted += 1;
        stats.admitted_bytes += bytes;
        true
    }

    pub fn stats(&self) -> AdmissionStats {
        *self.stats.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("data", name).unwrap()
    }

    #[test]
    fn with_room_everything_is_admitted_and_when_full_only_keys_seen_before() {
        let admission = NvmeAdmission::new(None);
        admission.record_miss(&key("a"), 0);
        assert!(admission.admit(&key("a"), 4096, true));
        assert!(!admission.admit(&key("a"), 4096, false), "seen once");
        admission.record_miss(&key("a"), 0);
        assert!(admission.admit(&key("a"), 4096, false), "seen twice");
        let stats = admission.stats();
        assert_eq!((stats.admitted, stats.rejected_cold), (2, 1));
    }

    #[test]
    fn the_write_budget_bounds_admitted_bytes() {
        let admission = NvmeAdmission::new(Some(1 << 20));
        let mut admitted = 0u64;
        for index in 0..64 {
            if admission.admit(&key(&format!("k{index}")), 64 << 10, true) {
                admitted += 64 << 10;
            }
        }
        // One second of burst (1 MiB) plus what refilled while the loop ran.
        assert!(
            ((1 << 20)..(1 << 20) + (256 << 10)).contains(&admitted),
            "{admitted}"
        );
        assert!(admission.stats().rejected_budget > 0);
    }
}
