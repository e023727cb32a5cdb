//! S3-FIFO (Yang et al., SOSP'23): three FIFO queues. New objects enter a small queue (a tenth of
//! the cache) that filters one-hit wonders quickly; an object accessed while there moves to the
//! main queue when it reaches the small queue's tail, the others leave and their keys go to a
//! ghost queue. A miss on a key in the ghost goes straight to the main queue. The main queue is a
//! CLOCK with a two-bit counter: a tail object with a count is reinserted at the head with the
//! count lowered, one without is evicted.

use std::collections::{HashMap, VecDeque};

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
        } else if self.ghost.remove(key) {
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

    /// Evicts one object: from the small queue while it holds its share or more (or the main
    /// queue is empty), else from the main queue.
    fn evict_one(&mut self, evicted: &mut Vec<u64>) {
        let small_full = self.table.queue_used(SMALL) >= self.small_capacity;
        let main_empty = self.table.queue_objects(MAIN) == 0;
        if (small_full || main_empty) && self.evict_small(evicted) {
            return;
        }
        self.evict_main(evicted);
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
                self.ghost.insert(entry.key, charge);
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

/// Keys recently evicted from the small queue, oldest first, up to a capacity in the cache's
/// unit. A key found in the ghost is forgotten at once; its place in the queue stays (and
/// counts) until it reaches the front, which keeps removal O(1) and the queue bounded.
struct Ghost {
    capacity: u64,
    used: u64,
    /// (key, charge, sequence number) in insertion order.
    queue: VecDeque<(u64, u64, u64)>,
    /// Key → the sequence number of its live place in `queue`.
    live: HashMap<u64, u64, foldhash::fast::RandomState>,
    next_sequence: u64,
}

impl Ghost {
    fn new(capacity: u64) -> Ghost {
        Ghost {
            capacity,
            used: 0,
            queue: VecDeque::new(),
            live: HashMap::default(),
            next_sequence: 0,
        }
    }

    fn insert(&mut self, key: u64, charge: u64) {
        if charge > self.capacity {
            return;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.queue.push_back((key, charge, sequence));
        self.live.insert(key, sequence);
        self.used += charge;
        while self.used > self.capacity {
            let (old_key, old_charge, old_sequence) =
                self.queue.pop_front().expect("used > 0 means a queued key");
            self.used -= old_charge;
            if self.live.get(&old_key) == Some(&old_sequence) {
                self.live.remove(&old_key);
            }
        }
    }

    /// Forgets `key`; returns whether it was remembered.
    fn remove(&mut self, key: u64) -> bool {
        self.live.remove(&key).is_some()
    }
}
