//! First in, first out: one queue; hits change nothing, the oldest object is evicted.

use super::table::{QueueId, Table, PINNED};
use super::{Access, Capacity, EvictionPolicy};

const QUEUE: QueueId = 0;

/// FIFO over a slab-linked queue.
pub struct Fifo {
    table: Table,
}

impl Fifo {
    pub fn new(capacity: Capacity) -> Fifo {
        Fifo {
            table: Table::new(capacity),
        }
    }

    fn admit(&mut self, key: u64, size_bytes: u64, pinned: bool, evicted: &mut Vec<u64>) -> Access {
        let queue = if pinned { PINNED } else { QUEUE };
        self.table
            .admit(key, size_bytes, queue, evicted, |table| table.tail(QUEUE))
    }
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn capacity(&self) -> Capacity {
        self.table.capacity()
    }

    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access {
        if self.table.find(key).is_some() {
            return Access::Hit;
        }
        self.admit(key, size_bytes, false, evicted)
    }

    fn insert(
        &mut self,
        key: u64,
        size_bytes: u64,
        pinned: bool,
        evicted: &mut Vec<u64>,
    ) -> Access {
        if self.table.find(key).is_some() {
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
