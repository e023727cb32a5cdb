//! LIRS (Jiang and Zhang, SIGMETRICS'02): keys are ranked by their inter-reference recency.
//! LIR keys (most of the cache) sit in the stack S; resident HIR keys (1% of the cache, as in
//! libCacheSim) sit in the queue Q, and in S too while their last access is recent enough.
//! A HIR key accessed again while in S becomes LIR, and the LIR key at S's bottom goes to Q; S
//! is pruned so that its bottom is always a LIR key. S also remembers keys evicted from Q
//! (non-resident HIR), bounded to the cache's capacity in their charges, oldest forgotten first.

use super::list::LinkedSet;
use super::Peer;

const HIR_SHARE: f64 = 0.01;
/// A key in S is a LIR key.
const LIR: u8 = 1;
/// A key in S is resident (LIR keys always are).
const RESIDENT: u8 = 2;

pub struct Lirs {
    capacity: u64,
    lir_capacity: u64,
    stack: LinkedSet,
    queue: LinkedSet,
    /// Non-resident HIR keys still in S, oldest at the tail.
    non_resident: LinkedSet,
    lir_units: u64,
}

impl Lirs {
    pub fn new(capacity: u64) -> Lirs {
        let hir_capacity = ((capacity as f64 * HIR_SHARE) as u64).max(1);
        Lirs {
            capacity,
            lir_capacity: capacity.saturating_sub(hir_capacity),
            stack: LinkedSet::new(),
            queue: LinkedSet::new(),
            non_resident: LinkedSet::new(),
            lir_units: 0,
        }
    }

    fn resident(&self) -> u64 {
        self.lir_units + self.queue.units()
    }

    /// Drops HIR keys from S's bottom until a LIR key is there.
    fn prune(&mut self) {
        while let Some((key, _, mark)) = self.stack.tail() {
            if mark & LIR != 0 {
                break;
            }
            self.stack.pop_tail();
            if mark & RESIDENT == 0 {
                self.non_resident.remove(key);
            }
        }
    }

    /// Turns LIR keys at S's bottom into resident HIR keys until the LIR keys fit their share.
    fn demote_lir(&mut self) {
        while self.lir_units > self.lir_capacity {
            let Some((key, charge, _)) = self.stack.pop_tail() else {
                break;
            };
            self.lir_units -= charge;
            self.queue.push_head(key, charge, 0);
            self.prune();
        }
    }

    /// Evicts resident HIR keys (Q's front) until `charge` more fits; each stays in S, if it
    /// is there, as non-resident.
    fn make_room(&mut self, charge: u64) {
        while self.resident() + charge > self.capacity {
            let Some((key, victim_charge, _)) = self.queue.pop_tail() else {
                // Only LIR keys are resident: the one at S's bottom (pruned) goes.
                self.prune();
                let Some((_, victim_charge, _)) = self.stack.pop_tail() else {
                    return;
                };
                self.lir_units -= victim_charge;
                self.prune();
                continue;
            };
            if self.stack.set_mark(key, 0) {
                self.non_resident.push_head(key, victim_charge, 0);
                while self.non_resident.units() > self.capacity {
                    let (forgotten, ..) = self.non_resident.pop_tail().expect("over the bound");
                    self.stack.remove(forgotten);
                }
            }
        }
    }
}

impl Peer for Lirs {
    fn access(&mut self, key: u64, charge: u64) -> bool {
        match self.stack.mark(key) {
            Some(mark) if mark & LIR != 0 => {
                self.stack.move_to_head(key);
                self.prune();
                return true;
            }
            Some(mark) if mark & RESIDENT != 0 => {
                // A resident HIR key with a recent enough access: it becomes LIR.
                let (charge, _) = self.queue.remove(key).expect("a resident HIR key is in Q");
                self.stack.move_to_head(key);
                self.stack.set_mark(key, LIR | RESIDENT);
                self.lir_units += charge;
                self.demote_lir();
                return true;
            }
            Some(_) => {
                // A non-resident HIR key still in S: a miss, and it comes back as LIR.
                self.non_resident.remove(key);
                if charge > self.lir_capacity {
                    self.stack.remove(key);
                    return false;
                }
                self.make_room(charge);
                self.stack.remove(key);
                self.stack.push_head(key, charge, LIR | RESIDENT);
                self.lir_units += charge;
                self.demote_lir();
                return false;
            }
            None => {}
        }
        if let Some((held, _)) = self.queue.remove(key) {
            // A resident HIR key whose last access left S: it stays HIR.
            self.queue.push_head(key, held, 0);
            self.stack.push_head(key, held, RESIDENT);
            return true;
        }
        if charge > self.capacity - self.lir_capacity && self.lir_units + charge > self.lir_capacity
        {
            return false;
        }
        if self.lir_units + charge <= self.lir_capacity {
            // Filling up: new keys are LIR until the LIR share is full.
            self.make_room(charge);
            self.stack.push_head(key, charge, LIR | RESIDENT);
            self.lir_units += charge;
            return false;
        }
        self.make_room(charge);
        self.stack.push_head(key, charge, RESIDENT);
        self.queue.push_head(key, charge, 0);
        false
    }

    fn resident_units(&self) -> u64 {
        self.resident()
    }
}
