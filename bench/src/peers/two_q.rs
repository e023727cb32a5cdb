//! 2Q (Johnson and Shasha, VLDB'94), full version: new keys enter a FIFO A1in (a quarter of the
//! cache); keys leaving it are remembered in a ghost FIFO A1out (keys worth half the cache); a
//! miss found in A1out goes to the LRU list Am. Hits in A1in do not move a key. The rules and
//! shares are libCacheSim's (`TwoQ.c`): the cache evicts from A1in while it holds more than its
//! share, else from Am, and Am and A1out each keep to their own share.

use super::list::LinkedSet;
use super::Peer;

const A1IN_SHARE: f64 = 0.25;
const A1OUT_SHARE: f64 = 0.5;

pub struct TwoQ {
    capacity: u64,
    a1in: LinkedSet,
    a1in_capacity: u64,
    a1out: LinkedSet,
    a1out_capacity: u64,
    am: LinkedSet,
    am_capacity: u64,
}

impl TwoQ {
    pub fn new(capacity: u64) -> TwoQ {
        let a1in_capacity = (capacity as f64 * A1IN_SHARE) as u64;
        TwoQ {
            capacity,
            a1in: LinkedSet::new(),
            a1in_capacity,
            a1out: LinkedSet::new(),
            a1out_capacity: (capacity as f64 * A1OUT_SHARE) as u64,
            am: LinkedSet::new(),
            am_capacity: capacity - a1in_capacity,
        }
    }

    /// Adds `key` at the head of `list`, first evicting from its tail until it fits `capacity`;
    /// a key larger than the list is not added.
    fn push_bounded(list: &mut LinkedSet, capacity: u64, key: u64, charge: u64) {
        if charge > capacity {
            return;
        }
        while list.units() + charge > capacity {
            list.pop_tail();
        }
        list.push_head(key, charge, 0);
    }

    fn evict_one(&mut self) -> bool {
        if self.a1in.units() > self.a1in_capacity {
            let (key, charge, _) = self.a1in.pop_tail().expect("A1in is over its share");
            Self::push_bounded(&mut self.a1out, self.a1out_capacity, key, charge);
            return true;
        }
        self.am.pop_tail().is_some()
    }
}

impl Peer for TwoQ {
    fn access(&mut self, key: u64, charge: u64) -> bool {
        if self.a1in.contains(key) {
            return true;
        }
        let remembered = self.a1out.remove(key).is_some();
        if self.am.move_to_head(key) {
            return true;
        }
        if charge > self.a1in_capacity {
            return false;
        }
        while self.a1in.units() + self.am.units() + charge > self.capacity {
            if !self.evict_one() {
                break;
            }
        }
        if remembered {
            Self::push_bounded(&mut self.am, self.am_capacity, key, charge);
        } else {
            self.a1in.push_head(key, charge, 0);
        }
        false
    }

    fn resident_units(&self) -> u64 {
        self.a1in.units() + self.am.units()
    }
}
