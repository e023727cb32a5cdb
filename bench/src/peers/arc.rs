//! ARC (Megiddo and Modha, FAST'03): a recency list T1 and a frequency list T2, each with a ghost
//! list of the keys it evicted (B1, B2), and a target `p` for T1's share that moves toward
//! whichever ghost list is hit. The rules are libCacheSim's (`ARC.c`), so that its published
//! miss counts check this one: with capacities in bytes, `p` moves by the ratio of the ghost
//! lists' bytes (at least 1) per ghost hit, as there; B1 is trimmed when T1 and B1 together
//! would pass the capacity, B2 when all four lists pass twice the capacity.

use super::list::LinkedSet;
use super::Peer;

/// Which ghost list the current miss was found in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ghost {
    Recent,
    Frequent,
}

pub struct Arc {
    capacity: u64,
    t1: LinkedSet,
    t2: LinkedSet,
    b1: LinkedSet,
    b2: LinkedSet,
    /// T1's target, in capacity units.
    p: f64,
    /// The ghost list the last ghost hit came from, until an insert uses it (as libCacheSim keeps
    /// it: a ghost hit that is not inserted leaves it set).
    last_ghost: Option<Ghost>,
}

impl Arc {
    pub fn new(capacity: u64) -> Arc {
        Arc {
            capacity,
            t1: LinkedSet::new(),
            t2: LinkedSet::new(),
            b1: LinkedSet::new(),
            b2: LinkedSet::new(),
            p: 0.0,
            last_ghost: None,
        }
    }

    /// REPLACE: evict T1's tail into B1 when T1 is above its target (or T2 is empty), else T2's
    /// tail into B2.
    fn replace(&mut self) {
        let t1 = self.t1.units() as f64;
        let from_t1 = (self.t1.units() > 0
            && (t1 > self.p || (t1 == self.p && self.last_ghost == Some(Ghost::Frequent))))
            || self.t2.units() == 0;
        if from_t1 {
            let (key, charge, _) = self.t1.pop_tail().expect("T1 holds the victim");
            self.b1.push_head(key, charge, 0);
        } else {
            let (key, charge, _) = self.t2.pop_tail().expect("T2 holds the victim");
            self.b2.push_head(key, charge, 0);
        }
    }

    /// One eviction for a miss of `charge` found in no list (the paper's case IV).
    fn evict_for_new(&mut self, charge: u64) {
        if self.t1.units() + self.b1.units() + charge > self.capacity {
            if self.b1.units() > 0 {
                self.b1.pop_tail();
                self.replace();
            } else {
                self.t1.pop_tail();
            }
        } else {
            let all = self.t1.units() + self.b1.units() + self.t2.units() + self.b2.units();
            if all >= 2 * self.capacity && self.b2.units() > 0 {
                self.b2.pop_tail();
            }
            self.replace();
        }
    }
}

impl Peer for Arc {
    fn access(&mut self, key: u64, charge: u64) -> bool {
        if let Some((charge, _)) = self.t1.remove(key) {
            self.last_ghost = None;
            self.t2.push_head(key, charge, 0);
            return true;
        }
        if self.t2.move_to_head(key) {
            self.last_ghost = None;
            return true;
        }
        let mut ghost = None;
        if self.b1.contains(key) {
            let delta = (self.b2.units() as f64 / self.b1.units() as f64).max(1.0);
            self.p = (self.p + delta).min(self.capacity as f64);
            self.b1.remove(key);
            ghost = Some(Ghost::Recent);
        } else if self.b2.contains(key) {
            let delta = (self.b1.units() as f64 / self.b2.units() as f64).max(1.0);
            self.p = (self.p - delta).max(0.0);
            self.b2.remove(key);
            ghost = Some(Ghost::Frequent);
        }
        if ghost.is_some() {
            self.last_ghost = ghost;
        }
        if charge > self.capacity {
            return false;
        }
        while self.t1.units() + self.t2.units() + charge > self.capacity {
            if ghost.is_some() {
                self.replace();
            } else {
                self.evict_for_new(charge);
            }
        }
        if ghost.is_some() {
            self.last_ghost = None;
            self.t2.push_head(key, charge, 0);
        } else {
            self.t1.push_head(key, charge, 0);
        }
        false
    }

    fn resident_units(&self) -> u64 {
        self.t1.units() + self.t2.units()
    }
}
