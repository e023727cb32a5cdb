//! hydrant's policy: a SIEVE main queue behind a W-TinyLFU admission filter with an adaptive
//! window.
//!
//! New objects enter a small LRU window. When the window holds more than its share, its oldest
//! object (the candidate) asks to join the main queue; if the main queue has no room, the
//! candidate competes with the object the main queue's hand would evict (the victim). A
//! candidate that was read again while in the window joins without a duel (S3-FIFO's rule for
//! its small queue: two reads close together are evidence enough); any other candidate stays
//! only if the frequency sketch has seen it more often than the victim. The window lets a burst
//! of new objects prove themselves before frequency judges them (recency), the sketch keeps
//! one-hit wonders and scans from flushing the main queue (frequency), and the hand keeps hits
//! cheap: a hit in the main queue raises a small counter (to 3), nothing moves, and the hand
//! takes one from each count it passes (SIEVE with S3-FIFO's counter for its bit).
//!
//! A candidate that loses its duel is remembered in a ghost (keys only, up to 90% of the
//! capacity, S3-FIFO's ghost). If it is requested again while remembered it skips the window
//! and enters the main queue: an object that comes back soon after losing was not a one-hit
//! wonder, and making it prove itself in the window a second time costs a miss each time round.
//!
//! The sketch's counts are halved once when the cache first evicts: while it filled, every
//! object was admitted, and counts gathered then would otherwise outweigh the workload that
//! follows for a whole aging period (on a trace shorter than that period, for its whole length).
//!
//! No fixed window suits every workload: a loop or a scan wants almost none, a burst of recency
//! wants a large one. The window's share follows shadow caches that try several shares on the
//! same requests ([`WindowChooser`]). A candidate the sketch finds warm but not warmer than the
//! victim is admitted with a small probability, so that an attacker who inflates a victim's count
//! cannot lock every newcomer out.

use super::ghost::Ghost;
use super::random::Random;
use super::sketch::FrequencySketch;
use super::table::{QueueId, Table, PINNED};
use super::window_chooser::{WindowChooser, WINDOW_PERCENT_INITIAL};
use super::{Access, Capacity, EvictionPolicy};

const WINDOW: QueueId = 0;
const MAIN: QueueId = 1;

/// The main queue's counter ceiling: a hit adds one, the hand takes one as it passes.
const MAIN_FREQUENCY_MAX: u8 = 3;

/// A candidate seen at least this often is warm: it may win against a victim at least as frequent,
/// with probability 1 / `WARM_ADMIT_ONE_IN`.
const WARM_FREQUENCY_MIN: u8 = 6;
const WARM_ADMIT_ONE_IN: u64 = 128;
/// The ghost of candidates that lost their duel remembers this share of the capacity, in
/// percent: a loser that returns within about a main queue's worth of losers joins the main
/// queue at once.
const GHOST_PERCENT: u64 = 90;
/// The population a byte-sized cache's sketch starts from; it grows with the cache.
const BYTE_CACHE_EXPECTED_OBJECTS_INITIAL: u64 = 1024;
/// The seed of [`TinyLfuSieve::new`]; [`TinyLfuSieve::with_seed`] picks another.
const SEED_DEFAULT: u64 = 0x6879_6472_616e_7400;

/// W-TinyLFU admission in front of SIEVE, with a window sized by shadow caches.
pub struct TinyLfuSieve {
    cache: WindowedCache,
    chooser: WindowChooser,
    /// The shadows' evictions, dropped at once; kept to reuse its allocation.
    shadow_evicted: Vec<u64>,
}

impl TinyLfuSieve {
    pub fn new(capacity: Capacity) -> TinyLfuSieve {
        TinyLfuSieve::with_seed(capacity, SEED_DEFAULT)
    }

    /// A policy whose hashing and coin flips start from `seed` (one per instance, so that
    /// neighbouring shards do not share their collisions).
    pub fn with_seed(capacity: Capacity, seed: u64) -> TinyLfuSieve {
        TinyLfuSieve::build(capacity, seed, 1)
    }

    /// A policy whose shadow caches see at least one key in `sample_one_in_min` (rounded up to
    /// a power of two), whatever the capacity: for a cache on the path of every hit, where the
    /// shadows' work is most of the policy's. The DRAM tier's (`DRAM_SHADOW_SAMPLE_ONE_IN_MIN`).
    pub fn with_shadow_sampling(capacity: Capacity, sample_one_in_min: u64) -> TinyLfuSieve {
        TinyLfuSieve::build(capacity, SEED_DEFAULT, sample_one_in_min)
    }

    fn build(capacity: Capacity, seed: u64, sample_one_in_min: u64) -> TinyLfuSieve {
        TinyLfuSieve {
            cache: WindowedCache::new(capacity, seed, WINDOW_PERCENT_INITIAL),
            chooser: WindowChooser::new(capacity, seed, sample_one_in_min),
            shadow_evicted: Vec::new(),
        }
    }

    /// The window's current share, in capacity units.
    pub fn window_target(&self) -> u64 {
        self.cache.window_target
    }

    /// Feeds the shadows one request and applies their verdict at the end of a period.
    fn choose_window(&mut self, key: u64, size_bytes: u64) {
        let resident_objects = self.cache.table.len() as u64;
        if let Some(window_percent) = self.chooser.observe(
            key,
            size_bytes,
            resident_objects,
            self.cache.window_percent,
            &mut self.shadow_evicted,
        ) {
            if self.cache.has_evicted {
                self.cache.set_window_percent(window_percent);
            }
        }
    }
}

/// The window, the main queue, the sketch and the ghost, with the window's share set from
/// outside: the real cache's by the chooser, a shadow's fixed.
pub(crate) struct WindowedCache {
    table: Table,
    sketch: FrequencySketch,
    ghost: Ghost,
    random: Random,
    /// The window's share, in capacity units.
    window_target: u64,
    window_percent: u64,
    /// Whether the cache has been full once: until then, the shadows' misses are the cold misses
    /// of a fill, and say nothing about the window.
    has_evicted: bool,
}

impl WindowedCache {
    pub(crate) fn new(capacity: Capacity, seed: u64, window_percent: u64) -> WindowedCache {
        let units = capacity.units();
        let expected_objects = match capacity {
            Capacity::Objects(objects) => objects,
            Capacity::Bytes(_) => BYTE_CACHE_EXPECTED_OBJECTS_INITIAL,
        };
        let mut cache = WindowedCache {
            table: Table::new(capacity),
            sketch: FrequencySketch::new(expected_objects, seed),
            ghost: Ghost::new(units * GHOST_PERCENT / 100),
            random: Random::new(seed.rotate_left(32)),
            window_target: 0,
            window_percent: 0,
            has_evicted: false,
        };
        cache.set_window_percent(window_percent);
        cache
    }

    fn set_window_percent(&mut self, window_percent: u64) {
        assert!(window_percent <= 100);
        self.window_percent = window_percent;
        self.window_target = self.table.capacity_units() * window_percent / 100;
    }

    /// A read: a hit marks the object (in the window) or counts it (in the main queue); a miss
    /// admits it into the window, or into the main queue if it lost a duel lately.
    pub(crate) fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        self.sketch.increment(key);
        match self.table.find(key) {
            Some(slot) => {
                match self.table.entry(slot).queue {
                    WINDOW => {
                        self.table.move_to_head(WINDOW, slot);
                        self.table.entry_mut(slot).visited = true;
                    }
                    MAIN => {
                        let entry = self.table.entry_mut(slot);
                        entry.frequency = (entry.frequency + 1).min(MAIN_FREQUENCY_MAX);
                    }
                    _ => {}
                }
                Access::Hit
            }
            None => {
                let queue = if self.ghost.remove(key).is_some() {
                    MAIN
                } else {
                    WINDOW
                };
                self.admit(key, size_bytes, queue, evicted)
            }
        }
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
        // An object that skips the window (a write, or a loser back from the ghost) starts
        // counted once, so that the hand passes it on its first lap like any object just used.
        self.table.entry_mut(slot).frequency = u8::from(queue == MAIN);
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
                (Some(candidate), false) => self.enter_main(candidate),
                (Some(candidate), true) => {
                    // A write that entered the main queue directly is never the victim: it was
                    // stored without a duel.
                    let loser = match self.table.counted_victim(MAIN) {
                        Some(victim)
                            if self.table.entry(victim).key != new_key
                                && self.admits(candidate, victim) =>
                        {
                            victim
                        }
                        _ => candidate,
                    };
                    if loser == candidate {
                        let entry = self.table.entry(candidate);
                        let charge = self.table.charge(entry.size_bytes);
                        self.ghost.insert(entry.key, charge, 0);
                    }
                    new_key_kept &= self.evict(loser, new_key, evicted);
                }
                (None, true) => {
                    // The window is within its share, so the main queue is over its own; the
                    // window gives way only for a write that entered the main queue directly.
                    let victim = match self.table.counted_victim(MAIN) {
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

    /// Moves the window's candidate into the main queue. A read while in the window counts as a
    /// hit there, so that the hand passes such a candidate once, like an object just used.
    fn enter_main(&mut self, candidate: u32) {
        self.table.move_to_head(MAIN, candidate);
        let entry = self.table.entry_mut(candidate);
        entry.frequency = u8::from(entry.visited);
        entry.visited = false;
    }

    /// Evicts `slot`; returns false if it was `new_key`, which is then not reported.
    fn evict(&mut self, slot: u32, new_key: u64, evicted: &mut Vec<u64>) -> bool {
        if !self.has_evicted {
            // The fill ends: its counts are halved as at the end of an aging period.
            self.sketch.age();
            self.has_evicted = true;
        }
        if self.table.entry(slot).key == new_key {
            self.table.unlink(slot);
            self.table.release(slot);
            return false;
        }
        self.table.evict(slot, evicted);
        true
    }

    /// TinyLFU's duel: whether the window's candidate should displace the main queue's victim. A
    /// candidate read again while in the window wins it outright.
    fn admits(&mut self, candidate: u32, victim: u32) -> bool {
        if self.table.entry(candidate).visited {
            return true;
        }
        let candidate_frequency = self.sketch.frequency(self.table.entry(candidate).key);
        let victim_frequency = self.sketch.frequency(self.table.entry(victim).key);
        if candidate_frequency > victim_frequency {
            return true;
        }
        candidate_frequency >= WARM_FREQUENCY_MIN && self.random.one_in(WARM_ADMIT_ONE_IN)
    }
}

impl EvictionPolicy for TinyLfuSieve {
    fn name(&self) -> &'static str {
        "hydrant"
    }

    fn capacity(&self) -> Capacity {
        self.cache.table.capacity()
    }

    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        let access = self.cache.access(key, size_bytes, evicted);
        self.choose_window(key, size_bytes);
        access
    }

    fn insert(
        &mut self,
        key: u64,
        size_bytes: u64,
        pinned: bool,
        evicted: &mut Vec<u64>,
    ) -> Access {
        if self.cache.table.find(key).is_some() {
            self.access(key, size_bytes, evicted);
            if pinned {
                self.cache.table.set_pinned(key, true, MAIN);
            }
            return Access::Hit;
        }
        self.cache.sketch.increment(key);
        // A write is stored already: it skips the window's duel and enters the main queue (or
        // the pinned queue) directly.
        let queue = if pinned { PINNED } else { MAIN };
        let access = self.cache.admit(key, size_bytes, queue, evicted);
        self.choose_window(key, size_bytes);
        access
    }

    fn remove(&mut self, key: u64) -> bool {
        self.cache.table.remove(key)
    }

    fn set_pinned(&mut self, key: u64, pinned: bool) -> bool {
        // An object that was worth pinning has been admitted already: it re-enters the main queue.
        self.cache.table.set_pinned(key, pinned, MAIN)
    }

    fn contains(&self, key: u64) -> bool {
        self.cache.table.find(key).is_some()
    }

    fn len(&self) -> usize {
        self.cache.table.len()
    }

    fn used_bytes(&self) -> u64 {
        self.cache.table.used_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_of(cache: &WindowedCache, key: u64) -> Option<QueueId> {
        cache
            .table
            .find(key)
            .map(|slot| cache.table.entry(slot).queue)
    }

    /// Pushes `key` out of a full cache of often-seen objects with a window of 10: it loses its
    /// duel and goes to the ghost.
    fn lose_duel(cache: &mut WindowedCache, key: u64, next_new_key: &mut u64) {
        let mut evicted = Vec::new();
        cache.access(key, 1, &mut evicted);
        for _ in 0..10 {
            cache.access(*next_new_key, 1, &mut evicted);
            *next_new_key += 1;
        }
        assert_eq!(queue_of(cache, key), None);
    }

    #[test]
    fn a_loser_back_from_the_ghost_skips_the_window_and_one_long_gone_does_not() {
        let mut cache = WindowedCache::new(Capacity::Objects(100), 1, 10);
        let mut evicted = Vec::new();
        // Seen three times, so that the residents still count once after the sketch is halved
        // at the first eviction.
        for _ in 0..3 {
            for key in 0..100 {
                cache.access(key, 1, &mut evicted);
            }
        }
        let mut next_new_key = 10_000;
        lose_duel(&mut cache, 1_000, &mut next_new_key);
        // Back soon: straight into the main queue, counted once.
        cache.access(1_000, 1, &mut evicted);
        assert_eq!(queue_of(&cache, 1_000), Some(MAIN));
        let slot = cache.table.find(1_000).expect("resident");
        assert_eq!(cache.table.entry(slot).frequency, 1);

        lose_duel(&mut cache, 2_000, &mut next_new_key);
        // Two hundred losers later the ghost (90 objects) has forgotten it: the window again.
        for _ in 0..20 {
            lose_duel(&mut cache, next_new_key + 1_000_000, &mut next_new_key);
        }
        cache.access(2_000, 1, &mut evicted);
        assert_eq!(queue_of(&cache, 2_000), Some(WINDOW));
    }
}
