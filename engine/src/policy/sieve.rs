//! SIEVE (Zhang et al., NSDI'24): one FIFO queue and a visited bit per object. New objects enter
//! at the head; a hit only sets the bit, so hits never move anything. To evict, a hand moves from
//! the tail toward the head, clearing set bits, and evicts the first object whose bit is clear;
//! the hand stays where it stopped, so objects inserted behind it wait a whole lap.

use super::table::{QueueId, Table, PINNED};
use super::{Access, Capacity, EvictionPolicy};

const QUEUE: QueueId = 0;

/// SIEVE over a slab-linked queue.
pub struct Sieve {
    table: Table,
}

impl Sieve {
    pub fn new(capacity: Capacity) -> Sieve {
        Sieve {
            table: Table::new(capacity),
        }
    }

    fn admit(&mut self, key: u64, size_bytes: u64, pinned: bool, evicted: &mut Vec<u64>) -> Access {
        let queue = if pinned { PINNED } else { QUEUE };
        self.table.admit(key, size_bytes, queue, evicted, |table| {
            table.sieve_victim(QUEUE)
        })
    }
}

impl EvictionPolicy for Sieve {
    fn name(&self) -> &'static str {
        "sieve"
    }

    fn capacity(&self) -> Capacity {
        self.table.capacity()
    }

    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        match self.table.find(key) {
            Some(slot) => {
                self.table.entry_mut(slot).visited = true;
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
                self.table.set_pinned(key, true, QUEUE);
            }
            return Access::Hit;
        }
        self.admit(key, size_bytes, pinned, evicted)
    }

    fn remove(&mut self, key: u64) -> bool {
        self.table.remove(key)
    }

    fn set_pinned(&mut self, key: u64, pinned: bool) -> bool {
        self.table.set_pinned(key, pinned, QUEUE)
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
