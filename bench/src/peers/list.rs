//! An ordered set of keys with a charge each (bytes or one unit): a doubly linked list over a
//! slab, indexed by a map, so that every operation the peers need is O(1).

use std::collections::HashMap;

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    key: u64,
    charge: u64,
    /// A policy's own mark for the key (LIRS: whether it is a LIR block, whether resident).
    mark: u8,
    /// Toward the head (newer).
    previous: u32,
    /// Toward the tail (older); the free list's link for a free node.
    next: u32,
}

/// Keys from the head (newest) to the tail (oldest), with the sum of their charges.
pub struct LinkedSet {
    slots: HashMap<u64, u32>,
    nodes: Vec<Node>,
    free: u32,
    head: u32,
    tail: u32,
    units: u64,
}

impl LinkedSet {
    pub fn new() -> LinkedSet {
        LinkedSet {
            slots: HashMap::new(),
            nodes: Vec::new(),
            free: NONE,
            head: NONE,
            tail: NONE,
            units: 0,
        }
    }

    /// The charges of every key held, together.
    pub fn units(&self) -> u64 {
        self.units
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.slots.contains_key(&key)
    }

    /// The key's mark, if it is held.
    pub fn mark(&self, key: u64) -> Option<u8> {
        self.slots
            .get(&key)
            .map(|&slot| self.nodes[slot as usize].mark)
    }

    /// Changes a held key's mark; false when the key is not held.
    pub fn set_mark(&mut self, key: u64, mark: u8) -> bool {
        match self.slots.get(&key) {
            Some(&slot) => {
                self.nodes[slot as usize].mark = mark;
                true
            }
            None => false,
        }
    }

    /// Adds `key` (not held) at the head.
    pub fn push_head(&mut self, key: u64, charge: u64, mark: u8) {
        let node = Node {
            key,
            charge,
            mark,
            previous: NONE,
            next: self.head,
        };
        let slot = if self.free == NONE {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        } else {
            let slot = self.free;
            self.free = self.nodes[slot as usize].next;
            self.nodes[slot as usize] = node;
            slot
        };
        let previous = self.slots.insert(key, slot);
        assert!(previous.is_none(), "key {key} pushed twice");
        if self.head != NONE {
            self.nodes[self.head as usize].previous = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
        self.units += charge;
    }

    fn unlink(&mut self, slot: u32) {
        let Node { previous, next, .. } = self.nodes[slot as usize];
        if previous == NONE {
            self.head = next;
        } else {
            self.nodes[previous as usize].next = next;
        }
        if next == NONE {
            self.tail = previous;
        } else {
            self.nodes[next as usize].previous = previous;
        }
    }

    /// Takes `key` out; returns its charge and mark, or `None` when it was not held.
    pub fn remove(&mut self, key: u64) -> Option<(u64, u8)> {
        let slot = self.slots.remove(&key)?;
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        let taken = (node.charge, node.mark);
        self.units -= node.charge;
        node.next = self.free;
        self.free = slot;
        Some(taken)
    }

    /// Moves a held key to the head; false when it is not held.
    pub fn move_to_head(&mut self, key: u64) -> bool {
        let Some(&slot) = self.slots.get(&key) else {
            return false;
        };
        if self.head != slot {
            self.unlink(slot);
            self.nodes[slot as usize].previous = NONE;
            self.nodes[slot as usize].next = self.head;
            self.nodes[self.head as usize].previous = slot;
            self.head = slot;
        }
        true
    }

    /// The oldest key, its charge and its mark.
    pub fn tail(&self) -> Option<(u64, u64, u8)> {
        (self.tail != NONE).then(|| {
            let node = &self.nodes[self.tail as usize];
            (node.key, node.charge, node.mark)
        })
    }

    /// Takes the oldest key out: its key, charge and mark.
    pub fn pop_tail(&mut self) -> Option<(u64, u64, u8)> {
        let (key, charge, mark) = self.tail()?;
        self.remove(key);
        Some((key, charge, mark))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_leave_from_the_tail_in_order_and_moves_reorder_them() {
        let mut set = LinkedSet::new();
        for key in 1..=4 {
            set.push_head(key, key * 10, 0);
        }
        assert_eq!(set.units(), 100);
        assert!(set.move_to_head(1));
        assert_eq!(set.remove(3), Some((30, 0)));
        assert!(set.set_mark(2, 7));
        let order: Vec<u64> = std::iter::from_fn(|| set.pop_tail().map(|(key, ..)| key)).collect();
        assert_eq!(order, vec![2, 4, 1]);
        assert_eq!((set.len(), set.units()), (0, 0));
        // Freed nodes are reused.
        set.push_head(9, 1, 0);
        assert_eq!(set.tail(), Some((9, 1, 0)));
    }
}
