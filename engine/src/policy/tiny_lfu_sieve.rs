//! hydrant's policy: a SIEVE main queue behind a W-TinyLFU admission filter with an adaptive
//! window.
//!
//! New objects enter a small LRU window. When the window holds more than its share, its oldest
//! object (the candidate) asks to join the main queue; if the main queue has no room, the
//! candidate competes with the object SIEVE would evict (the victim), and whichever the frequency
//! sketch has seen more often stays. The window lets a burst of new objects prove themselves
//! before frequency judges them (recency), the sketch keeps one-hit wonders and scans from
//! flushing the main queue (frequency), and SIEVE keeps hits cheap (a bit set, nothing moved).
//!
//! No fixed window suits every workload: a loop or a scan wants almost none, a burst of recency
//! wants a large one. A hill climber resizes the window from the hit ratio of each sample. A
//! candidate the sketch finds warm but not warmer than the victim is admitted with a small
//! probability, so that an attacker who inflates a victim's count cannot lock every newcomer out.

use super::climber::HillClimber;
use super::random::Random;
use super::sketch::FrequencySketch;
use super::table::{QueueId, Table, PINNED};
use super::{Access, Capacity, EvictionPolicy};

const WINDOW: QueueId = 0;
const MAIN: QueueId = 1;

/// The window's initial share of the capacity, in percent (W-TinyLFU's 1%); the climber moves it.
const WINDOW_INITIAL_PERCENT: u64 = 1;
/// The window never grows beyond this share of the capacity, in percent, so that frequency
/// always guards most of the cache.
const WINDOW_MAX_PERCENT: u64 = 80;
/// A candidate seen at least this often is warm: it may win against a victim at least as frequent,
/// with probability 1 / `WARM_ADMIT_ONE_IN`.
const WARM_FREQUENCY_MIN: u8 = 6;
const WARM_ADMIT_ONE_IN: u64 = 128;
/// The population a byte-sized cache's sketch starts from; it grows with the cache.
const BYTE_CACHE_EXPECTED_OBJECTS_INITIAL: u64 = 1024;
/// The seed of [`TinyLfuSieve::new`]; [`TinyLfuSieve::with_seed`] picks another.
const SEED_DEFAULT: u64 = 0x6879_6472_616e_7400;

/// W-TinyLFU admission in front of SIEVE, with a hill-climbing window.
pub struct TinyLfuSieve {
    table: Table,
    sketch: FrequencySketch,
    climber: HillClimber,
    random: Random,
    /// The window's share, in capacity units.
    window_target: u64,
    window_max: u64,
    /// Whether the cache has been full once; the climber waits for it, because the hit ratio
    /// while filling says nothing about the window.
    has_evicted: bool,
}

impl TinyLfuSieve {
    pub fn new(capacity: Capacity) -> TinyLfuSieve {
        TinyLfuSieve::with_seed(capacity, SEED_DEFAULT)
    }

    /// A policy whose hashing and coin flips start from `seed` (one per instance, so that
    /// neighbouring shards do not share their collisions).
    pub fn with_seed(capacity: Capacity, seed: u64) -> TinyLfuSieve {
        let units = capacity.units();
        let expected_objects = match capacity {
            Capacity::Objects(objects) => objects,
            Capacity::Bytes(_) => BYTE_CACHE_EXPECTED_OBJECTS_INITIAL,
        };
        TinyLfuSieve {
            table: Table::new(capacity),
            sketch: FrequencySketch::new(expected_objects, seed),
            climber: HillClimber::new(units),
            random: Random::new(seed.rotate_left(32)),
            window_target: units * WINDOW_INITIAL_PERCENT / 100,
            window_max: units * WINDOW_MAX_PERCENT / 100,
            has_evicted: false,
        }
    }

    /// The window's current share, in capacity units.
    pub fn window_target(&self) -> u64 {
        self.window_target
    }

    /// Links a new object at the head of `queue` and makes room for it.
    fn admit(
        &mut self,
        key: u64,
        size_bytes: u64,
        queue: QueueId,
        evicted: &mut Vec<u64>,
    ) -> Access {
        let charge = self.table.charge(size_bytes);
        if !self.table.can_fit(charge) {
            return Access::MissRejected;
        }
        let slot = self.table.allocate(key, size_bytes);
        self.table.push_head(queue, slot);
        // A write that skips the window starts visited, so that the hand passes it on its first
        // lap like any object that has just been used.
        self.table.entry_mut(slot).visited = queue == MAIN;
        if let Capacity::Bytes(_) = self.table.capacity() {
            self.sketch.ensure_capacity(self.table.len() as u64);
        }
        let admitted = self.make_room(key, evicted);
        if admitted {
            Access::MissAdmitted
        } else {
            Access::MissRejected
        }
    }

    /// Moves the window's overflow into the main queue and evicts until the cache fits. Returns
    /// false if `new_key` itself lost its place (it is not reported as evicted: it never was
    /// resident as far as the caller knows).
    fn make_room(&mut self, new_key: u64, evicted: &mut Vec<u64>) -> bool {
        let capacity = self.table.capacity_units();
        let mut new_key_kept = true;
        loop {
            let over_capacity = self.table.used() > capacity;
            let window_over = self.table.queue_used(WINDOW) > self.window_target;
            let candidate = if window_over {
                self.table.tail(WINDOW)
            } else {
                None
            };
            match (candidate, over_capacity) {
                (Some(candidate), false) => self.table.move_to_head(MAIN, candidate),
                (Some(candidate), true) => {
                    // A write that entered the main queue directly is never the victim: it was
                    // stored without a duel.
                    let loser = match self.table.sieve_victim(MAIN) {
                        Some(victim)
                            if self.table.entry(victim).key != new_key
                                && self.admits(candidate, victim) =>
                        {
                            victim
                        }
                        _ => candidate,
                    };
                    new_key_kept &= self.evict(loser, new_key, evicted);
                }
                (None, true) => {
                    // The window is within its share, so the main queue is over its own; the
                    // window gives way only for a write that entered the main queue directly.
                    let victim = match self.table.sieve_victim(MAIN) {
                        Some(victim) if self.table.entry(victim).key != new_key => Some(victim),
                        main_victim => self.table.tail(WINDOW).or(main_victim),
                    }
                    .expect("an unpinned entry while over capacity");
                    new_key_kept &= self.evict(victim, new_key, evicted);
                }
                (None, false) => return new_key_kept,
            }
        }
    }

    /// Evicts `slot`; returns false if it was `new_key`, which is then not reported.
    fn evict(&mut self, slot: u32, new_key: u64, evicted: &mut Vec<u64>) -> bool {
        self.has_evicted = true;
        if self.table.entry(slot).key == new_key {
            self.table.unlink(slot);
            self.table.release(slot);
            return false;
        }
        self.table.evict(slot, evicted);
        true
    }

    /// TinyLFU's duel: whether the window's candidate should displace the main queue's victim.
    fn admits(&mut self, candidate: u32, victim: u32) -> bool {
        let candidate_frequency = self.sketch.frequency(self.table.entry(candidate).key);
        let victim_frequency = self.sketch.frequency(self.table.entry(victim).key);
        if candidate_frequency > victim_frequency {
            return true;
        }
        candidate_frequency >= WARM_FREQUENCY_MIN && self.random.one_in(WARM_ADMIT_ONE_IN)
    }

    /// Feeds the climber one request and applies its verdict at the end of a sample.
    fn climb(&mut self, hit: bool) {
        if !self.has_evicted {
            return;
        }
        self.climber.record(hit);
        if let Some(change) = self.climber.adjustment(self.sketch.sample_size()) {
            self.window_target = self
                .window_target
                .saturating_add_signed(change)
                .min(self.window_max);
        }
    }
}

impl EvictionPolicy for TinyLfuSieve {
    fn name(&self) -> &'static str {
        "hydrant"
    }

    fn capacity(&self) -> Capacity {
        self.table.capacity()
    }

    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        self.sketch.increment(key);
        let access = match self.table.find(key) {
            Some(slot) => {
                match self.table.entry(slot).queue {
                    WINDOW => self.table.move_to_head(WINDOW, slot),
                    MAIN => self.table.entry_mut(slot).visited = true,
                    _ => {}
                }
                Access::Hit
            }
            None => self.admit(key, size_bytes, WINDOW, evicted),
        };
        self.climb(access.is_hit());
        access
    }

    fn insert(
        &mut self,
        key: u64,
        size_bytes: u64,
        pinned: bool,
        evicted: &mut Vec<u64>,
    ) -> Access {
        if self.table.find(key).is_some() {
            self.access(key, size_bytes, evicted);
            if pinned {
                self.table.set_pinned(key, true, MAIN);
            }
            return Access::Hit;
        }
        self.sketch.increment(key);
        // A write is stored already: it skips the window's duel and enters the main queue (or
        // the pinned queue) directly.
        let queue = if pinned { PINNED } else { MAIN };
        self.admit(key, size_bytes, queue, evicted)
    }

    fn remove(&mut self, key: u64) -> bool {
        self.table.remove(key)
    }

    fn set_pinned(&mut self, key: u64, pinned: bool) -> bool {
        // An object that was worth pinning has been admitted already: it re-enters the main queue.
        self.table.set_pinned(key, pinned, MAIN)
    }

    fn contains(&self, key: u64) -> bool {
        self.table.find(key).is_some()
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn used_bytes(&self) -> u64 {
        self.table.used_bytes()
    }
}
