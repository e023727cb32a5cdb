//! S3-FIFO (Yang et al., SOSP'23): three FIFO queues. New objects enter a small queue (a tenth of
//! the cache) that filters one-hit wonders quickly; an object accessed while there moves to the
//! main queue when it reaches the small queue's tail, the others leave and their keys go to a
//! ghost queue. A miss on a key in the ghost goes straight to the main queue. The main queue is a
//! CLOCK with a two-bit counter: a tail object with a count is reinserted at the head with the
//! count lowered, one without is evicted.

use super::ghost::Ghost;
use super::table::{QueueId, Table, PINNED};
use super::{Access, Capacity, EvictionPolicy};

const SMALL: QueueId = 0;
const MAIN: QueueId = 1;

/// The small queue's share of the capacity, in percent (the paper's 10%).
const SMALL_SHARE_PERCENT: u64 = 10;
/// The ghost queue remembers keys worth this share of the capacity, in percent, as many as the
/// main queue holds (the paper's choice).
const GHOST_SHARE_PERCENT: u64 = 90;
/// The access counter saturates here (two bits).
const FREQUENCY_MAX: u8 = 3;

/// S3-FIFO over slab-linked queues.
pub struct S3Fifo {
    table: Table,
    small_capacity: u64,
    ghost: Ghost,
}

impl S3Fifo {
    pub fn new(capacity: Capacity) -> S3Fifo {
        let units = capacity.units();
        S3Fifo {
            table: Table::new(capacity),
            small_capacity: (units * SMALL_SHARE_PERCENT / 100).max(1),
            ghost: Ghost::new(units * GHOST_SHARE_PERCENT / 100),
        }
    }

    fn admit(&mut self, key: u64, size_bytes: u64, pinned: bool, evicted: &mut Vec<u64>) -> Access {
        let charge = self.table.charge(size_bytes);
        if !self.table.can_fit(charge) {
            return Access::MissRejected;
        }
        let queue = if pinned {
            PINNED
        } else if self.ghost.remove(key).is_some() {
            MAIN
        } else if charge > self.small_capacity {
            // An object larger than the small queue would flush it whole; like libCacheSim's
            // implementation we do not admit it.
            return Access::MissRejected;
        } else {
            SMALL
        };
        while !self.table.fits(charge) {
            self.evict_one(evicted);
        }
        let slot = self.table.allocate(key, size_bytes);
        self.table.push_head(queue, slot);
        Access::MissAdmitted
    }

    /// Evicts one object: from the main queue when it holds more than its share (objects promoted
    /// from the small queue push it over) or the small queue is empty, else from the small queue.
    fn evict_one(&mut self, evicted: &mut Vec<u64>) {
        let main_capacity =
            self.table.capacity_units() - self.small_capacity.min(self.table.capacity_units());
        let main_over = self.table.queue_used(MAIN) > main_capacity;
        let small_empty = self.table.queue_objects(SMALL) == 0;
        if main_over || small_empty || !self.evict_small(evicted) {
            self.evict_main(evicted);
        }
    }

    /// Walks the small queue's tail: accessed objects move to the main queue, the first object
    /// not accessed is evicted into the ghost. Returns false if the small queue ran empty first.
    fn evict_small(&mut self, evicted: &mut Vec<u64>) -> bool {
        while let Some(slot) = self.table.tail(SMALL) {
            let entry = *self.table.entry(slot);
            if entry.frequency > 0 {
                self.table.move_to_head(MAIN, slot);
                self.table.entry_mut(slot).frequency = 0;
            } else {
                let charge = self.table.charge(entry.size_bytes);
                self.ghost.insert(entry.key, charge, SMALL);
                self.table.evict(slot, evicted);
                return true;
            }
        }
        false
    }

    /// Walks the main queue's tail: objects with a count go back to the head with one less, the
    /// first without one is evicted. Ends within four laps (the counter's range).
    fn evict_main(&mut self, evicted: &mut Vec<u64>) {
        while let Some(slot) = self.table.tail(MAIN) {
            let entry = self.table.entry_mut(slot);
            if entry.frequency > 0 {
                entry.frequency -= 1;
                self.table.move_to_head(MAIN, slot);
            } else {
                self.table.evict(slot, evicted);
                return;
            }
        }
        panic!("S3-FIFO over capacity with no unpinned object");
    }
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn capacity(&self) -> Capacity {
        self.table.capacity()
    }

    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        match self.table.find(key) {
            Some(slot) => {
                let entry = self.table.entry_mut(slot);
                entry.frequency = (entry.frequency + 1).min(FREQUENCY_MAX);
                Access::Hit
            }
            None => self.admit(key, size_bytes, false, evicted),
        }
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
        self.admit(key, size_bytes, pinned, evicted)
    }

    fn remove(&mut self, key: u64) -> bool {
        self.table.remove(key)
    }

    fn set_pinned(&mut self, key: u64, pinned: bool) -> bool {
        // An object that was worth pinning has proven itself: it re-enters the main queue.
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
