//! The index's hash table: joined key → value, for point lookups, that never stops its shard
//! to grow.
//!
//! A general-purpose hash map grows by moving every entry into a table twice the size in one
//! call: at a million objects that call took 0.4 s, at seven million 3.3 s, and the shard
//! answers nothing meanwhile. This table grows a step at a time instead:
//!
//! - **Entries** (key and value) live in a slab of fixed chunks and never move; a freed slot
//!   joins a free list threaded through the slab. So growth copies no entry, and iteration is a
//!   walk of dense memory.
//! - **Slots** are one `u64` each: 32 bits of the key's hash (the tag) and the entry's number.
//!   A slot's home is the tag's top bits, so a slot moves to a larger table without its key
//!   being read or hashed again. Linear probing, at most three quarters full; a removal shifts
//!   the slots after it back instead of leaving a tombstone.
//! - **Growth**: when the slots would pass three quarters full, a table of twice as many slots
//!   is allocated zeroed (the kernel maps it on first touch, so allocating costs no pass over
//!   it) and takes every insert; the old slots drain into it `DRAIN_SLOTS_PER_CHANGE` at a time
//!   with each insert and removal, in slot order. A lookup tries the new slots, then the old
//!   ones past the drain's cursor (those before it have moved). Draining ends long before the
//!   new table could fill (`grow_if_full`).
//!
//! Probe chains: keys come from clients, so the hash is foldhash seeded at random per process
//! (a client cannot choose keys that collide), and the load never passes three quarters, where
//! a lookup reads two slots on average. The longest chain of a million slots three quarters
//! full is a few hundred slots (a test bounds it): contiguous memory whose slots are told
//! apart by their tags without reading an entry.

use std::hash::BuildHasher;
use std::rc::Rc;

/// Entries per slab chunk: a chunk is allocated whole and never moves.
const CHUNK_ENTRIES: usize = 4096;

/// The fewest slots a table has.
const SLOTS_MIN: usize = 64;

/// Old slots moved into the new table with each insert or removal while it drains. Draining
/// a table of `n` slots takes `n / 16` changes; the new table (`2n` slots, three eighths full
/// when it began) fills to three quarters only after `3n / 4` inserts.
const DRAIN_SLOTS_PER_CHANGE: usize = 16;

/// An empty slot.
const EMPTY: u64 = 0;

/// A slot of a draining table whose entry was removed before it moved (only the draining table
/// holds these: the live one shifts slots back instead).
const TOMBSTONE: u64 = u32::MAX as u64;

/// The most entries a table holds: three quarters of 2^32 slots, the most a 32-bit tag
/// addresses (entry numbers plus one then fit in 32 bits, short of the tombstone).
const ENTRIES_MAX: usize = 3 << 30;

/// One entry of the slab: a key and its value, or a link of the free list.
enum Entry<V> {
    Used(Rc<[u8]>, V),
    /// The next free entry's number plus one; 0 ends the list.
    Free(u32),
}

/// A used slot's word: the tag and the entry's number plus one.
fn slot_word(tag: u32, entry: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(entry + 1)
}

/// The tag of a used slot's word.
fn slot_tag(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The entry number of a used slot's word.
fn slot_entry(word: u64) -> u32 {
    word as u32 - 1
}

/// Open-addressing slots: each is `slot_word(tag, entry)`, `EMPTY` or `TOMBSTONE`.
struct Slots {
    words: Vec<u64>,
    /// 32 minus the number of bits of a slot's position: a tag's home is `tag >> shift`.
    shift: u32,
}

impl Slots {
    fn new(count: usize) -> Slots {
        assert!(count.is_power_of_two() && count >= SLOTS_MIN);
        Slots {
            // Zeroed memory: a large table is mapped by the kernel page by page on first
            // touch, so its allocation takes no pass over it.
            words: vec![EMPTY; count],
            shift: 32 - count.trailing_zeros(),
        }
    }

    fn len(&self) -> usize {
        self.words.len()
    }

    fn mask(&self) -> usize {
        self.words.len() - 1
    }

    fn home(&self, tag: u32) -> usize {
        // `checked_shr`: a table of 2^32 slots has a shift of 0.
        tag.checked_shr(self.shift).unwrap_or(0) as usize
    }

    /// The position of the slot for `tag` whose entry `is_key` accepts, starting at its home
    /// and stopping at the first empty slot.
    fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<usize> {
        let mask = self.mask();
        let mut position = self.home(tag);
        loop {
            let word = self.words[position];
            if word == EMPTY {
                return None;
            }
            if word != TOMBSTONE && slot_tag(word) == tag && is_key(slot_entry(word)) {
                return Some(position);
            }
            position = (position + 1) & mask;
        }
    }

    /// Place `entry` under `tag` in the first empty slot from its home (the caller keeps the
    /// load below three quarters, so there is one).
    fn place(&mut self, tag: u32, entry: u32) {
        let mask = self.mask();
        let mut position = self.home(tag);
        while self.words[position] != EMPTY {
            position = (position + 1) & mask;
        }
        self.words[position] = slot_word(tag, entry);
    }

    /// Empty the slot at `position` and shift back the slots after it that may move closer to
    /// their home, so that every probe chain stays unbroken without a tombstone.
    fn remove_at(&mut self, position: usize) {
        let mask = self.mask();
        let mut hole = position;
        let mut next = (position + 1) & mask;
        loop {
            let word = self.words[next];
            if word == EMPTY {
                break;
            }
            let home = self.home(slot_tag(word));
            // The slot may fill the hole if the hole lies on its chain: between its home and
            // where it is, going round.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.words[hole] = word;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.words[hole] = EMPTY;
    }
}

/// The table before the last growth, moving into the new one a step at a time.
struct Draining {
    slots: Slots,
    /// Slots before this position have moved.
    cursor: usize,
}

/// A hash table from joined keys (held as `Rc<[u8]>`, shared with the index's ordered views) to
/// `V`, with no pause to grow (see the module's comment).
pub struct KeyTable<V> {
    hasher: foldhash::fast::RandomState,
    chunks: Vec<Vec<Entry<V>>>,
    /// The first free entry's number plus one; 0 when none is free.
    free: u32,
    len: usize,
    slots: Slots,
    draining: Option<Draining>,
    /// Tests keep only some bits of each tag and set others, so that tags collide and chains
    /// wrap round the end of the slots.
    #[cfg(test)]
    tag_bits: (u32, u32),
}

impl<V> Default for KeyTable<V> {
    fn default() -> Self {
        KeyTable::with_capacity(0)
    }
}

impl<V> KeyTable<V> {
    /// A table that holds `entries` without growing.
    pub fn with_capacity(entries: usize) -> KeyTable<V> {
        assert!(
            entries <= ENTRIES_MAX,
            "{entries} entries are more than a table holds"
        );
        let slots = (entries * 4 / 3 + 1).next_power_of_two().max(SLOTS_MIN);
        KeyTable {
            hasher: foldhash::fast::RandomState::default(),
            chunks: Vec::new(),
            free: 0,
            len: 0,
            slots: Slots::new(slots),
            draining: None,
            #[cfg(test)]
            tag_bits: (u32::MAX, 0),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn tag(&self, key: &[u8]) -> u32 {
        let tag = (self.hasher.hash_one(key) >> 32) as u32;
        #[cfg(test)]
        let tag = tag & self.tag_bits.0 | self.tag_bits.1;
        tag
    }

    fn entry(&self, number: u32) -> &Entry<V> {
        let number = number as usize;
        &self.chunks[number / CHUNK_ENTRIES][number % CHUNK_ENTRIES]
    }

    fn entry_mut(&mut self, number: u32) -> &mut Entry<V> {
        let number = number as usize;
        &mut self.chunks[number / CHUNK_ENTRIES][number % CHUNK_ENTRIES]
    }

    fn holds(&self, number: u32, key: &[u8]) -> bool {
        matches!(self.entry(number), Entry::Used(held, _) if **held == *key)
    }

    /// Where `key` is: in the live slots (`true`) or the draining ones (`false`), the slot's
    /// position, and its entry's number.
    fn locate(&self, key: &[u8]) -> Option<(bool, usize, u32)> {
        self.locate_tagged(key, self.tag(key))
    }

    fn locate_tagged(&self, key: &[u8], tag: u32) -> Option<(bool, usize, u32)> {
        if let Some(position) = self.slots.find(tag, |number| self.holds(number, key)) {
            return Some((true, position, slot_entry(self.slots.words[position])));
        }
        let draining = self.draining.as_ref()?;
        let position = draining.slots.find(tag, |number| self.holds(number, key))?;
        // A slot before the cursor has moved: the key is not in the old slots any more (it
        // was removed after it moved, else the live slots would have it).
        (position >= draining.cursor)
            .then(|| (false, position, slot_entry(draining.slots.words[position])))
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.get_key_value(key).map(|(_, value)| value)
    }

    pub fn get_key_value(&self, key: &[u8]) -> Option<(&Rc<[u8]>, &V)> {
        let (_, _, number) = self.locate(key)?;
        match self.entry(number) {
            Entry::Used(key, value) => Some((key, value)),
            Entry::Free(_) => unreachable!("a slot names a free entry"),
        }
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        let (_, _, number) = self.locate(key)?;
        match self.entry_mut(number) {
            Entry::Used(_, value) => Some(value),
            Entry::Free(_) => unreachable!("a slot names a free entry"),
        }
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.locate(key).is_some()
    }

    /// Insert `value` under `key`; returns the value it replaces (the key held is kept).
    pub fn insert(&mut self, key: Rc<[u8]>, value: V) -> Option<V> {
        let tag = self.tag(&key);
        if let Some((_, _, number)) = self.locate_tagged(&key, tag) {
            let Entry::Used(_, existing) = self.entry_mut(number) else {
                unreachable!("a slot names a free entry")
            };
            return Some(std::mem::replace(existing, value));
        }
        assert!(self.len < ENTRIES_MAX, "a shard's index is full");
        self.grow_if_full();
        let number = self.allocate(key, value);
        self.slots.place(tag, number);
        self.len += 1;
        self.drain_step();
        None
    }

    /// Remove `key`; returns its key and value.
    pub fn remove_entry(&mut self, key: &[u8]) -> Option<(Rc<[u8]>, V)> {
        let (live, position, number) = self.locate(key)?;
        if live {
            self.slots.remove_at(position);
        } else {
            let draining = self.draining.as_mut().expect("found in the draining slots");
            draining.slots.words[position] = TOMBSTONE;
        }
        let next_free = self.free;
        let entry = std::mem::replace(self.entry_mut(number), Entry::Free(next_free));
        self.free = number + 1;
        self.len -= 1;
        self.drain_step();
        match entry {
            Entry::Used(key, value) => Some((key, value)),
            Entry::Free(_) => unreachable!("a slot names a free entry"),
        }
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        self.remove_entry(key).map(|(_, value)| value)
    }

    /// Every (key, value), in the slab's order (no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (&Rc<[u8]>, &V)> {
        self.chunks
            .iter()
            .flatten()
            .filter_map(|entry| match entry {
                Entry::Used(key, value) => Some((key, value)),
                Entry::Free(_) => None,
            })
    }

    fn allocate(&mut self, key: Rc<[u8]>, value: V) -> u32 {
        if self.free != 0 {
            let number = self.free - 1;
            let entry = std::mem::replace(self.entry_mut(number), Entry::Used(key, value));
            let Entry::Free(next) = entry else {
                unreachable!("the free list names a used entry")
            };
            self.free = next;
            return number;
        }
        if self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.len() == CHUNK_ENTRIES)
        {
            self.chunks.push(Vec::with_capacity(CHUNK_ENTRIES));
        }
        let number = (self.chunks.len() - 1) * CHUNK_ENTRIES;
        let chunk = self.chunks.last_mut().expect("a chunk with room");
        let number = number + chunk.len();
        chunk.push(Entry::Used(key, value));
        number as u32
    }

    /// Before an insert: if one more entry would fill the slots past three quarters, begin
    /// moving them into a table twice the size. The previous growth has always finished by
    /// then (see `DRAIN_SLOTS_PER_CHANGE`); if it has not, it finishes now.
    fn grow_if_full(&mut self) {
        if (self.len + 1) * 4 <= self.slots.len() * 3 {
            return;
        }
        while self.draining.is_some() {
            self.drain_step();
        }
        let larger = Slots::new(self.slots.len() * 2);
        let old = std::mem::replace(&mut self.slots, larger);
        self.draining = Some(Draining {
            slots: old,
            cursor: 0,
        });
    }

    /// Move the next `DRAIN_SLOTS_PER_CHANGE` old slots into the live table; drop the old
    /// table once all have moved.
    fn drain_step(&mut self) {
        let Some(draining) = self.draining.as_mut() else {
            return;
        };
        let end = (draining.cursor + DRAIN_SLOTS_PER_CHANGE).min(draining.slots.len());
        for &word in &draining.slots.words[draining.cursor..end] {
            if word != EMPTY && word != TOMBSTONE {
                self.slots.place(slot_tag(word), slot_entry(word));
            }
        }
        draining.cursor = end;
        if end == draining.slots.len() {
            self.draining = None;
        }
    }

    /// Every slot's structure, checked after each change in the randomized tests: no empty slot
    /// between a live slot and its home, no tombstone in the live slots, every used entry named
    /// by exactly one slot (live, or draining at or after the cursor) whose tag is its key's.
    #[cfg(test)]
    fn assert_consistent(&self) {
        let mut named = vec![0u8; self.chunks.len() * CHUNK_ENTRIES];
        let mut check = |slots: &Slots, from: usize, live: bool| {
            let mask = slots.mask();
            for (position, &word) in slots.words.iter().enumerate().skip(from) {
                if word == EMPTY || word == TOMBSTONE {
                    assert!(!live || word == EMPTY, "a tombstone in the live slots");
                    continue;
                }
                let (tag, number) = (slot_tag(word), slot_entry(word));
                let Entry::Used(key, _) = self.entry(number) else {
                    panic!("slot {position} names free entry {number}");
                };
                assert_eq!(self.tag(key), tag, "slot {position}'s tag is not its key's");
                named[number as usize] += 1;
                if live {
                    let mut between = slots.home(tag);
                    while between != position {
                        assert_ne!(
                            slots.words[between], EMPTY,
                            "a chain broken before {position}"
                        );
                        between = (between + 1) & mask;
                    }
                }
            }
        };
        check(&self.slots, 0, true);
        if let Some(draining) = &self.draining {
            check(&draining.slots, draining.cursor, false);
        }
        let mut used = 0;
        for (number, entry) in self.chunks.iter().flatten().enumerate() {
            let expected = u8::from(matches!(entry, Entry::Used(..)));
            assert_eq!(
                named[number], expected,
                "entry {number} named {} times",
                named[number]
            );
            used += usize::from(expected);
        }
        assert_eq!(used, self.len);
        assert!(self.len * 4 <= self.slots.len() * 3);
    }

    /// The longest probe chain of the live slots: the most slots a lookup reads.
    #[cfg(test)]
    fn longest_chain(&self) -> usize {
        let mask = self.slots.mask();
        let mut longest = 0;
        for (position, &word) in self.slots.words.iter().enumerate() {
            if word != EMPTY {
                let home = self.slots.home(slot_tag(word));
                longest = longest.max((position.wrapping_sub(home) & mask) + 1);
            }
        }
        longest
    }
}

impl<V> std::ops::Index<&[u8]> for KeyTable<V> {
    type Output = V;

    fn index(&self, key: &[u8]) -> &V {
        self.get(key).expect("a key the table holds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(number: u64) -> Rc<[u8]> {
        Rc::from(format!("datasets\0train/sample-{number:010}.jpg").into_bytes())
    }

    /// xorshift64*: the same operations for the same seed.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    fn assert_same(table: &KeyTable<u64>, model: &HashMap<Rc<[u8]>, u64>) {
        assert_eq!(table.len(), model.len());
        for (key, value) in model {
            assert_eq!(table.get(key), Some(value), "{key:?}");
        }
        let mut seen: Vec<u64> = table.iter().map(|(_, value)| *value).collect();
        let mut expected: Vec<u64> = model.values().copied().collect();
        seen.sort_unstable();
        expected.sort_unstable();
        assert_eq!(seen, expected);
    }

    #[test]
    fn inserts_removals_and_lookups_agree_with_a_hash_map_through_many_growths() {
        // Whole tags, then tags of a few values (whole-tag collisions everywhere), then tags near
        // the top (chains that wrap round the end of the slots).
        for (seed, tag_bits, keys, steps) in [
            (1u64, (u32::MAX, 0), 20_000, 60_000u64),
            (2, (u32::MAX, 0), 20_000, 60_000),
            (3, (u32::MAX, 0), 300, 20_000),
            (4, (0xf000_000f, 0), 300, 20_000),
            (5, (0xf000_0000, 0), 300, 20_000),
            (6, (0x0300_0003, 0xfc00_0000), 200, 20_000),
            (7, (0x00ff_0000, 0xff00_0000), 2_000, 20_000),
        ] {
            let mut random = Random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut table = KeyTable {
                tag_bits,
                ..KeyTable::default()
            };
            let mut model = HashMap::new();
            // Keys from a small range, so that removals and re-inserts of the same key happen
            // while a growth drains; more inserts than removals, so that it grows. The share
            // of removals rises halfway, so that the table empties again.
            for step in 0..steps {
                let number = random.next() % keys;
                let key = key(number);
                let removals = if step < steps / 2 { 3 } else { 6 };
                match random.next() % 10 {
                    draw if draw < 9 - removals => {
                        assert_eq!(table.insert(key.clone(), step), model.insert(key, step))
                    }
                    draw if draw < 9 => assert_eq!(table.remove(&key), model.remove(&key)),
                    _ => assert_eq!(table.get(&key), model.get(&key)),
                }
                if keys <= 300 || step % 1_000 == 0 || (keys <= 2_000 && step % 16 == 0) {
                    table.assert_consistent();
                }
                if step % 5_000 == 0 {
                    assert_same(&table, &model);
                }
            }
            assert_same(&table, &model);
            // Remove everything: the table ends empty, every lookup misses.
            for key in model.keys() {
                assert!(table.remove(key).is_some());
            }
            table.assert_consistent();
            assert!(table.is_empty());
            assert_eq!(table.iter().count(), 0);
            assert!(!table.contains_key(&key(1)));
        }
    }

    #[test]
    fn a_key_removed_after_it_moved_is_not_found_in_the_old_slots() {
        let mut table = KeyTable::default();
        // Fill to the edge of growth, then grow with one insert: the rest drain later.
        let mut number = 0;
        while table.draining.is_none() {
            table.insert(key(number), number);
            number += 1;
        }
        let cursor = table.draining.as_ref().unwrap().cursor;
        assert!(cursor < table.draining.as_ref().unwrap().slots.len());
        // Remove every key in turn while the drain runs, checking each is gone at once.
        for removed in 0..number {
            assert_eq!(table.remove(&key(removed)), Some(removed));
            assert!(table.get(&key(removed)).is_none(), "key {removed}");
        }
        assert!(table.is_empty());
    }

    #[test]
    fn no_change_moves_more_than_a_step_of_slots_and_growth_never_waits_for_a_drain() {
        let count = 1_000_000u64;
        let mut table = KeyTable::default();
        let mut growths = 0;
        for number in 0..count {
            let slots_before = table.slots.len();
            let drain_before = table.draining.as_ref().map(|draining| draining.cursor);
            table.insert(key(number), number);
            if table.slots.len() != slots_before {
                growths += 1;
                assert_eq!(
                    drain_before, None,
                    "a growth began before the last one drained"
                );
            } else if let Some(before) = drain_before {
                let after = table
                    .draining
                    .as_ref()
                    .map_or(usize::MAX, |draining| draining.cursor);
                let moved = after.min(slots_before / 2) - before;
                assert!(moved <= DRAIN_SLOTS_PER_CHANGE, "{moved} slots moved");
            }
        }
        assert!(growths >= 14, "{growths} growths");
        assert_eq!(table.len(), count as usize);
        for number in (0..count).step_by(997) {
            assert_eq!(table.get(&key(number)), Some(&number));
        }
        assert!(
            table.longest_chain() <= 128,
            "a probe chain of {} slots",
            table.longest_chain()
        );
    }

    #[test]
    fn probe_chains_stay_short_at_the_highest_load() {
        // A million slots filled to one entry short of growing: three quarters full.
        let mut table = KeyTable::with_capacity(700_000);
        assert_eq!(table.slots.len(), 1 << 20);
        let mut number = 0;
        while (table.len() + 1) * 4 <= table.slots.len() * 3 {
            table.insert(key(number), number);
            number += 1;
        }
        assert!(table.draining.is_none());
        // Measured 143-239 slots over three runs; a chain is contiguous memory, and its slots
        // are told apart by their 32-bit tags without reading an entry, so even 512 is 4 KiB
        // read in order.
        assert!(
            table.longest_chain() <= 512,
            "a probe chain of {} slots",
            table.longest_chain()
        );
    }

    #[test]
    fn an_entry_costs_its_key_and_value_and_one_word_per_slot() {
        assert_eq!(
            std::mem::size_of::<Entry<[u64; 9]>>(),
            std::mem::size_of::<(Rc<[u8]>, [u64; 9])>(),
            "the free list costs an entry nothing"
        );
    }
}
