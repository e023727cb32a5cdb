//! The bookkeeping every policy shares: a slab of entries linked into a few intrusive doubly linked
//! queues, a map from key to slot, and the capacity ledger.
//!
//! Entries live in one `Vec` and refer to each other by slot number, so that linking, unlinking and
//! moving an entry never allocates; freed slots are chained into a free list and reused. Once the
//! cache has reached its steady population nothing here allocates again (the map keeps its buckets
//! when keys leave it).
//!
//! Every queue runs from its head (newest) to its tail (oldest): `next` points toward the tail and
//! `previous` toward the head. Pinned entries sit in a queue of their own, [`PINNED`], which no
//! policy ever takes a victim from, so skipping them costs nothing.

use std::collections::HashMap;

use super::{Access, Capacity};

/// The slot number that means "no entry" in a link.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// A queue's number: an index into [`Table::queues`].
pub(crate) type QueueId = u8;

/// The queue of pinned entries, shared by every policy; policies number their own queues from 0.
pub(crate) const PINNED: QueueId = 2;

/// Two queues for a policy (FIFO, LRU and SIEVE use one; S3-FIFO and hydrant's use two) and the
/// pinned queue.
const QUEUES: usize = 3;

/// One cached object's metadata.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub(crate) key: u64,
    pub(crate) size_bytes: u64,
    /// Toward the head (newer).
    previous: u32,
    /// Toward the tail (older); the free list's link for a free slot.
    next: u32,
    /// The queue this entry is linked into.
    pub(crate) queue: QueueId,
    /// SIEVE's visited bit (hydrant's policy: read again while in its window).
    pub(crate) visited: bool,
    /// S3-FIFO's small access counter (0 to 3), and that of hydrant's main queue.
    pub(crate) frequency: u8,
}

/// The head, tail and totals of one queue.
#[derive(Clone, Copy, Debug)]
struct Queue {
    head: u32,
    tail: u32,
    objects: u64,
    bytes: u64,
}

impl Queue {
    const EMPTY: Queue = Queue {
        head: NO_SLOT,
        tail: NO_SLOT,
        objects: 0,
        bytes: 0,
    };
}

/// Slab, key map, queues and capacity.
pub(crate) struct Table {
    capacity: Capacity,
    slots: HashMap<u64, u32, foldhash::fast::RandomState>,
    entries: Vec<Entry>,
    free_head: u32,
    queues: [Queue; QUEUES],
    /// SIEVE's hand in each queue: the next entry it looks at, moving toward the head; `NO_SLOT`
    /// means it starts again from the tail.
    hands: [u32; QUEUES],
}

impl Table {
    pub(crate) fn new(capacity: Capacity) -> Table {
        // A cache counted in objects knows its population up front; reserving it now keeps the
        // first fill from rehashing. A byte-counted cache learns its population as it fills.
        let expected_objects = match capacity {
            Capacity::Objects(objects) => usize::try_from(objects).unwrap_or(0).min(1 << 24),
            Capacity::Bytes(_) => 0,
        };
        Table {
            capacity,
            slots: HashMap::with_capacity_and_hasher(expected_objects, Default::default()),
            entries: Vec::with_capacity(expected_objects),
            free_head: NO_SLOT,
            queues: [Queue::EMPTY; QUEUES],
            hands: [NO_SLOT; QUEUES],
        }
    }

    pub(crate) fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// How much of the capacity an object of `size_bytes` takes: its bytes, or one object.
    pub(crate) fn charge(&self, size_bytes: u64) -> u64 {
        match self.capacity {
            Capacity::Bytes(_) => size_bytes,
            Capacity::Objects(_) => 1,
        }
    }

    pub(crate) fn capacity_units(&self) -> u64 {
        self.capacity.units()
    }

    /// The capacity a queue's entries take together.
    pub(crate) fn queue_used(&self, queue: QueueId) -> u64 {
        let totals = &self.queues[usize::from(queue)];
        match self.capacity {
            Capacity::Bytes(_) => totals.bytes,
            Capacity::Objects(_) => totals.objects,
        }
    }

    pub(crate) fn queue_objects(&self, queue: QueueId) -> u64 {
        self.queues[usize::from(queue)].objects
    }

    /// The capacity all entries take together.
    pub(crate) fn used(&self) -> u64 {
        (0..QUEUES as QueueId)
            .map(|queue| self.queue_used(queue))
            .sum()
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.queues.iter().map(|queue| queue.bytes).sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether an object of `charge` could ever be made to fit: it is no larger than the cache,
    /// and the unpinned part of the cache, were it all evicted, would hold it.
    pub(crate) fn can_fit(&self, charge: u64) -> bool {
        let pinned = self.queue_used(PINNED);
        charge <= self.capacity_units().saturating_sub(pinned)
    }

    /// Whether `charge` more would still fit without evicting.
    pub(crate) fn fits(&self, charge: u64) -> bool {
        self.used() + charge <= self.capacity_units()
    }

    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        self.slots.get(&key).copied()
    }

    pub(crate) fn entry(&self, slot: u32) -> &Entry {
        &self.entries[slot as usize]
    }

    pub(crate) fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        &mut self.entries[slot as usize]
    }

    /// Takes a slot for a new key; the caller links it into a queue next.
    pub(crate) fn allocate(&mut self, key: u64, size_bytes: u64) -> u32 {
        let entry = Entry {
            key,
            size_bytes,
            previous: NO_SLOT,
            next: NO_SLOT,
            queue: PINNED,
            visited: false,
            frequency: 0,
        };
        let slot = if self.free_head == NO_SLOT {
            let slot = u32::try_from(self.entries.len()).expect("fewer than 2^32 entries");
            assert!(slot != NO_SLOT, "the slab is full");
            self.entries.push(entry);
            slot
        } else {
            let slot = self.free_head;
            self.free_head = self.entries[slot as usize].next;
            self.entries[slot as usize] = entry;
            slot
        };
        let previous = self.slots.insert(key, slot);
        assert!(previous.is_none(), "key {key} allocated twice");
        slot
    }

    /// Returns an unlinked slot to the free list and forgets its key.
    pub(crate) fn release(&mut self, slot: u32) {
        let key = self.entries[slot as usize].key;
        let removed = self.slots.remove(&key);
        assert_eq!(removed, Some(slot), "released slot does not own its key");
        self.entries[slot as usize].next = self.free_head;
        self.free_head = slot;
    }

    pub(crate) fn tail(&self, queue: QueueId) -> Option<u32> {
        some_slot(self.queues[usize::from(queue)].tail)
    }

    /// The entry one step toward the head.
    pub(crate) fn previous(&self, slot: u32) -> Option<u32> {
        some_slot(self.entries[slot as usize].previous)
    }

    /// Links an unlinked slot at the head of `queue`.
    pub(crate) fn push_head(&mut self, queue: QueueId, slot: u32) {
        let old_head = self.queues[usize::from(queue)].head;
        let entry = &mut self.entries[slot as usize];
        entry.previous = NO_SLOT;
        entry.next = old_head;
        entry.queue = queue;
        let size_bytes = entry.size_bytes;
        if old_head == NO_SLOT {
            self.queues[usize::from(queue)].tail = slot;
        } else {
            self.entries[old_head as usize].previous = slot;
        }
        let totals = &mut self.queues[usize::from(queue)];
        totals.head = slot;
        totals.objects += 1;
        totals.bytes += size_bytes;
    }

    /// Unlinks a slot from whatever queue holds it; the slot stays allocated.
    pub(crate) fn unlink(&mut self, slot: u32) {
        let Entry {
            previous,
            next,
            queue,
            size_bytes,
            ..
        } = self.entries[slot as usize];
        let totals = &mut self.queues[usize::from(queue)];
        if previous == NO_SLOT {
            debug_assert_eq!(totals.head, slot);
            totals.head = next;
        } else {
            self.entries[previous as usize].next = next;
        }
        let totals = &mut self.queues[usize::from(queue)];
        if next == NO_SLOT {
            debug_assert_eq!(totals.tail, slot);
            totals.tail = previous;
        } else {
            self.entries[next as usize].previous = previous;
        }
        // A hand resting on the leaving entry moves one step toward the head, where it would
        // have gone next anyway.
        if self.hands[usize::from(queue)] == slot {
            self.hands[usize::from(queue)] = previous;
        }
        let totals = &mut self.queues[usize::from(queue)];
        totals.objects -= 1;
        totals.bytes -= size_bytes;
        let entry = &mut self.entries[slot as usize];
        entry.previous = NO_SLOT;
        entry.next = NO_SLOT;
    }

    /// Moves a linked slot to the head of `queue` (its own or another).
    pub(crate) fn move_to_head(&mut self, queue: QueueId, slot: u32) {
        self.unlink(slot);
        self.push_head(queue, slot);
    }

    /// SIEVE's choice in `queue`: the hand moves from where it rests toward the head (wrapping to
    /// the tail), clearing visited bits, and stops at the first entry not visited. The hand stays
    /// on that entry; evicting it moves the hand on. Amortised O(1): each step clears a bit that
    /// a hit had to set.
    pub(crate) fn sieve_victim(&mut self, queue: QueueId) -> Option<u32> {
        self.hand_victim(queue, |entry| std::mem::take(&mut entry.visited))
    }

    /// SIEVE's hand with a counter for a bit (the main queue of S3-FIFO, as a hand instead of
    /// reinsertion): the hand moves as in [`Table::sieve_victim`], takes one from the
    /// `frequency` of each entry it passes, and stops at the first whose count is 0.
    pub(crate) fn counted_victim(&mut self, queue: QueueId) -> Option<u32> {
        self.hand_victim(queue, |entry| {
            let counted = entry.frequency > 0;
            entry.frequency = entry.frequency.saturating_sub(1);
            counted
        })
    }

    /// The hand of `queue` moves from where it rests toward the head (wrapping to the tail) while
    /// `passes` spares the entry under it (and spends what spared it), and rests on the first
    /// entry it does not spare.
    fn hand_victim(
        &mut self,
        queue: QueueId,
        mut passes: impl FnMut(&mut Entry) -> bool,
    ) -> Option<u32> {
        let tail = self.tail(queue)?;
        let mut slot = some_slot(self.hands[usize::from(queue)]).unwrap_or(tail);
        while passes(&mut self.entries[slot as usize]) {
            slot = self.previous(slot).unwrap_or(tail);
        }
        self.hands[usize::from(queue)] = slot;
        Some(slot)
    }

    /// Moves an entry into the pinned queue, out of every eviction's reach. Returns false when it
    /// was pinned already.
    pub(crate) fn pin(&mut self, slot: u32) -> bool {
        if self.entries[slot as usize].queue == PINNED {
            return false;
        }
        self.move_to_head(PINNED, slot);
        true
    }

    /// Moves a pinned entry back to the head of `queue`, as if newly inserted there. Returns false
    /// when it was not pinned.
    pub(crate) fn unpin(&mut self, slot: u32, queue: QueueId) -> bool {
        if self.entries[slot as usize].queue != PINNED {
            return false;
        }
        self.move_to_head(queue, slot);
        let entry = &mut self.entries[slot as usize];
        entry.visited = false;
        entry.frequency = 0;
        true
    }

    /// Sets or clears a key's pin; an unpinned entry re-enters at the head of `queue`. Returns
    /// false when the key is absent.
    pub(crate) fn set_pinned(&mut self, key: u64, pinned: bool, queue: QueueId) -> bool {
        let Some(slot) = self.find(key) else {
            return false;
        };
        if pinned {
            self.pin(slot);
        } else {
            self.unpin(slot, queue);
        }
        true
    }

    /// Unlinks and frees a key's entry wherever it is. Returns false when the key is absent.
    pub(crate) fn remove(&mut self, key: u64) -> bool {
        let Some(slot) = self.find(key) else {
            return false;
        };
        self.unlink(slot);
        self.release(slot);
        true
    }

    /// Evicts an entry: unlinks and frees it and reports its key.
    pub(crate) fn evict(&mut self, slot: u32, evicted: &mut Vec<u64>) {
        debug_assert_ne!(self.entries[slot as usize].queue, PINNED);
        let key = self.entries[slot as usize].key;
        self.unlink(slot);
        self.release(slot);
        evicted.push(key);
    }

    /// The miss path of a policy with one queue: evicts `choose_victim`'s picks until an object of
    /// `size_bytes` fits, then links it at the head of `queue`.
    pub(crate) fn admit(
        &mut self,
        key: u64,
        size_bytes: u64,
        queue: QueueId,
        evicted: &mut Vec<u64>,
        mut choose_victim: impl FnMut(&mut Table) -> Option<u32>,
    ) -> Access {
        let charge = self.charge(size_bytes);
        if !self.can_fit(charge) {
            return Access::MissRejected;
        }
        while !self.fits(charge) {
            // `can_fit` has just shown that the unpinned entries hold enough to make room.
            let victim = choose_victim(self).expect("an unpinned entry while over capacity");
            self.evict(victim, evicted);
        }
        let slot = self.allocate(key, size_bytes);
        self.push_head(queue, slot);
        Access::MissAdmitted
    }

    /// The keys of a queue from head to tail, for tests.
    #[cfg(test)]
    pub(crate) fn keys(&self, queue: QueueId) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut slot = self.queues[usize::from(queue)].head;
        while slot != NO_SLOT {
            keys.push(self.entries[slot as usize].key);
            slot = self.entries[slot as usize].next;
        }
        keys
    }
}

fn some_slot(slot: u32) -> Option<u32> {
    (slot != NO_SLOT).then_some(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_state_reuses_freed_slots() {
        let mut table = Table::new(Capacity::Objects(64));
        let mut evicted = Vec::new();
        let mut next_key = 0;
        let mut admit = |table: &mut Table, evicted: &mut Vec<u64>| {
            next_key += 1;
            table.admit(next_key, 1, 0, evicted, |table| table.sieve_victim(0))
        };
        for _ in 0..1_000 {
            admit(&mut table, &mut evicted);
        }
        let slots = table.entries.len();
        for _ in 0..1_000 {
            admit(&mut table, &mut evicted);
        }
        assert_eq!(slots, 64);
        assert_eq!(table.entries.len(), slots);
        assert_eq!(table.len(), 64);
        assert_eq!(evicted.len(), 2_000 - 64);
    }

    #[test]
    fn queues_link_and_unlink_in_order() {
        let mut table = Table::new(Capacity::Bytes(1_000));
        let slots: Vec<u32> = (1..=4)
            .map(|key| {
                let slot = table.allocate(key, 10 * key);
                table.push_head(0, slot);
                slot
            })
            .collect();
        assert_eq!(table.keys(0), vec![4, 3, 2, 1]);
        table.move_to_head(1, slots[1]);
        table.unlink(slots[3]);
        table.release(slots[3]);
        assert_eq!(table.keys(0), vec![3, 1]);
        assert_eq!(table.keys(1), vec![2]);
        assert_eq!(table.queue_used(0), 40);
        assert_eq!(table.queue_used(1), 20);
        assert_eq!(table.used_bytes(), 60);
        assert_eq!(table.find(4), None);
        assert!(table.pin(slots[0]));
        assert!(!table.pin(slots[0]));
        assert_eq!(table.keys(PINNED), vec![1]);
        assert_eq!(table.tail(0), Some(slots[2]));
    }

    #[test]
    fn the_hand_steps_toward_the_head_when_its_entry_leaves() {
        let mut table = Table::new(Capacity::Objects(10));
        let slots: Vec<u32> = (1..=3)
            .map(|key| {
                let slot = table.allocate(key, 1);
                table.push_head(0, slot);
                slot
            })
            .collect();
        table.entry_mut(slots[0]).visited = true;
        // The hand clears 1 and rests on 2.
        assert_eq!(table.sieve_victim(0), Some(slots[1]));
        assert!(!table.entry(slots[0]).visited);
        table.unlink(slots[1]);
        table.release(slots[1]);
        // From 2's place the hand moves on to 3, not back to the tail.
        assert_eq!(table.sieve_victim(0), Some(slots[2]));
    }

    #[test]
    fn the_counted_hand_passes_an_entry_as_often_as_its_count() {
        let mut table = Table::new(Capacity::Objects(10));
        let slots: Vec<u32> = (1..=2)
            .map(|key| {
                let slot = table.allocate(key, 1);
                table.push_head(0, slot);
                slot
            })
            .collect();
        table.entry_mut(slots[0]).frequency = 2;
        // From the tail: 1 (2 → 1), 2 (0) stops the hand.
        assert_eq!(table.counted_victim(0), Some(slots[1]));
        assert_eq!(table.entry(slots[0]).frequency, 1);
        // A hit on the entry under the hand: it is passed (1 → 0), and so is 1 (1 → 0) after the
        // wrap to the tail; then 2 is at 0.
        table.entry_mut(slots[1]).frequency = 1;
        assert_eq!(table.counted_victim(0), Some(slots[1]));
        assert_eq!(table.entry(slots[0]).frequency, 0);
        assert_eq!(table.counted_victim(0), Some(slots[1]));
    }
}
