//! A ghost queue: the keys (no data) of objects evicted lately, each with a tag saying where it was
//! evicted from. A miss on a key the ghost remembers means the cache let that object go too early.

use std::collections::{HashMap, VecDeque};

/// Keys recently evicted, oldest first, up to a capacity in the cache's unit. A key found in the
/// ghost is forgotten at once; its place in the queue stays (and counts) until it reaches the
/// front, which keeps removal O(1) and the queue bounded.
pub(crate) struct Ghost {
    capacity: u64,
    used: u64,
    /// (key, charge, sequence number) in insertion order.
    queue: VecDeque<(u64, u64, u64)>,
    /// Key → the sequence number of its live place in `queue`, and its tag.
    live: HashMap<u64, (u64, u8), foldhash::fast::RandomState>,
    next_sequence: u64,
}

impl Ghost {
    pub(crate) fn new(capacity: u64) -> Ghost {
        Ghost {
            capacity,
            used: 0,
            queue: VecDeque::new(),
            live: HashMap::default(),
            next_sequence: 0,
        }
    }

    pub(crate) fn insert(&mut self, key: u64, charge: u64, tag: u8) {
        if charge > self.capacity {
            return;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.queue.push_back((key, charge, sequence));
        self.live.insert(key, (sequence, tag));
        self.used += charge;
        while self.used > self.capacity {
            let (old_key, old_charge, old_sequence) =
                self.queue.pop_front().expect("used > 0 means a queued key");
            self.used -= old_charge;
            if self.live.get(&old_key).map(|&(sequence, _)| sequence) == Some(old_sequence) {
                self.live.remove(&old_key);
            }
        }
    }

    /// Forgets `key`; returns its tag if it was remembered.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u8> {
        self.live.remove(&key).map(|(_, tag)| tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_latest_keys_up_to_its_capacity() {
        let mut ghost = Ghost::new(3);
        for key in 1..=4 {
            ghost.insert(key, 1, key as u8);
        }
        assert_eq!(ghost.remove(1), None);
        assert_eq!(ghost.remove(3), Some(3));
        assert_eq!(ghost.remove(3), None);
        // A removed key's place still counts until it reaches the front.
        ghost.insert(5, 1, 0);
        assert_eq!(ghost.remove(2), None);
        assert_eq!(ghost.remove(4), Some(4));
        assert_eq!(ghost.remove(5), Some(0));
    }
}
