//! A checkpoint's view of the index: the records as they were at the instant it began, handed
//! out in order a batch at a time while the index goes on changing, so that taking a checkpoint
//! pauses the shard for a batch, not for the whole index.
//!
//! Copy on write, per record: until the walk has passed a key, the first change to it (a new
//! version, a removal, a flag, a chunk moved by reclaim; a key that was not indexed being
//! installed) first saves its record as it was (or that it was absent) beside the walk. The walk
//! merges the ordered views with what was saved, and prefers the saved record: a key never
//! changed since the instant holds the record it held then. Only changes during a checkpoint
//! cost anything, and each key is saved at most once, so what is saved is bounded by the keys
//! changed while the checkpoint is taken (and by the index's size).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;

use super::{is_origin_chunk_joined, Index, ObjectRecord, SharedKey};

/// Where a checkpoint's walk of the index is, and the records changed ahead of it.
#[derive(Default)]
pub(crate) struct Snapshot {
    /// The walk is in the chunk keys (it has done the listed ones).
    in_chunks: bool,
    /// The last key handed out in the current view; `None` before its first.
    cursor: Option<SharedKey>,
    /// Keys changed since the instant that the walk had not passed, with their record then
    /// (`None`: not indexed then), the listed keys and the chunk keys apart.
    saved_listed: BTreeMap<SharedKey, Option<ObjectRecord>>,
    saved_chunks: BTreeMap<SharedKey, Option<ObjectRecord>>,
    finished: bool,
}

impl Snapshot {
    /// Whether the walk has handed out (or passed over) `key`'s place.
    fn passed(&self, key: &[u8]) -> bool {
        if self.finished {
            return true;
        }
        match (self.in_chunks, is_origin_chunk_joined(key)) {
            (false, true) => false,
            (true, false) => true,
            _ => self.cursor.as_deref().is_some_and(|cursor| key <= cursor),
        }
    }
}

impl Index {
    /// Begin a checkpoint's snapshot of the index as it is now (one at a time).
    pub(crate) fn begin_snapshot(&mut self) {
        assert!(self.snapshot.is_none(), "one snapshot at a time");
        self.snapshot = Some(Snapshot::default());
    }

    /// Drop the snapshot (its walk finished, or the checkpoint failed), and what it saved.
    pub(crate) fn end_snapshot(&mut self) {
        self.snapshot = None;
    }

    /// Records changed ahead of the walk and saved for it.
    pub(crate) fn snapshot_saved(&self) -> usize {
        self.snapshot.as_ref().map_or(0, |snapshot| {
            snapshot.saved_listed.len() + snapshot.saved_chunks.len()
        })
    }

    /// Hand `visit` the snapshot's next records, the listed keys in byte order and then the chunk
    /// keys in byte order, as they were when it began, until `visit` returns false (it has had
    /// enough for now) or there are no more. Returns true when the walk has handed out every
    /// record.
    pub(crate) fn snapshot_step(
        &mut self,
        mut visit: impl FnMut(&[u8], &ObjectRecord) -> bool,
    ) -> bool {
        let Index {
            objects,
            listed,
            chunks,
            snapshot,
            ..
        } = self;
        let snapshot = snapshot.as_mut().expect("a snapshot is being taken");
        while !snapshot.finished {
            let (view, saved) = if snapshot.in_chunks {
                (&*chunks, &snapshot.saved_chunks)
            } else {
                (&*listed, &snapshot.saved_listed)
            };
            let after = match &snapshot.cursor {
                Some(cursor) => Bound::Excluded(&**cursor),
                None => Bound::Unbounded,
            };
            let mut live = view.range::<[u8], _>((after, Bound::Unbounded)).peekable();
            let mut saved = saved.range::<[u8], _>((after, Bound::Unbounded)).peekable();
            let mut last: Option<&SharedKey> = None;
            let mut enough = false;
            loop {
                let take_saved = match (live.peek(), saved.peek()) {
                    (None, None) => break,
                    (Some(_), None) => false,
                    (None, Some(_)) => true,
                    (Some(key), Some((saved_key, _))) => match key.cmp(saved_key) {
                        Ordering::Less => false,
                        Ordering::Greater => true,
                        Ordering::Equal => {
                            live.next();
                            true
                        }
                    },
                };
                let (key, record) = if take_saved {
                    let (key, record) = saved.next().expect("peeked");
                    (key, record.as_ref())
                } else {
                    let key = live.next().expect("peeked");
                    (key, Some(&objects[&key[..]]))
                };
                last = Some(key);
                if let Some(record) = record {
                    if !visit(key, record) {
                        enough = true;
                        break;
                    }
                }
            }
            let last = last.cloned();
            if let Some(last) = last {
                snapshot.cursor = Some(last);
            }
            if enough {
                return false;
            }
            if snapshot.in_chunks {
                snapshot.finished = true;
                snapshot.saved_listed.clear();
                snapshot.saved_chunks.clear();
            } else {
                snapshot.in_chunks = true;
                snapshot.cursor = None;
                snapshot.saved_listed.clear();
            }
        }
        true
    }

    /// Before `key`'s record changes: if a snapshot's walk has yet to reach it and it was not
    /// saved already, save it as it is (or that it is absent).
    pub(super) fn preserve(&mut self, key: &[u8]) {
        let Some(snapshot) = self.snapshot.as_mut() else {
            return;
        };
        if snapshot.passed(key) {
            return;
        }
        let saved = if is_origin_chunk_joined(key) {
            &mut snapshot.saved_chunks
        } else {
            &mut snapshot.saved_listed
        };
        if saved.contains_key(key) {
            return;
        }
        let (shared, record) = match self.objects.get_key_value(key) {
            Some((shared, record)) => (shared.clone(), Some(record.clone())),
            None => (SharedKey::from(key), None),
        };
        saved.insert(shared, record);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        Chunks, Location, ObjectKey, PackedStamp, RECORD_FLAG_DIRTY, RECORD_FLAG_VISITED,
    };
    use super::*;

    /// xorshift64*: the same operations for the same seed.
    struct Random(u64);

    impl Random {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
        }
    }

    /// One of 300 keys: listed ones in two buckets, and every seventh a chunk key.
    fn key(number: u64) -> ObjectKey {
        let bucket = if number.is_multiple_of(2) { "a" } else { "b" };
        let key = ObjectKey::new(bucket, &format!("k/{number:04}")).unwrap();
        if number.is_multiple_of(7) {
            key.origin_chunk(number, 1).unwrap()
        } else {
            key
        }
    }

    fn record(seq: u64, random: &mut Random) -> ObjectRecord {
        let location = |block| Location {
            region: 1,
            block,
            first_crc: seq as u32,
        };
        ObjectRecord {
            seq,
            bytes: random.below(10_000),
            flags: 0,
            chunks: if random.below(4) == 0 {
                Chunks::Many((1..=3).map(location).collect())
            } else {
                Chunks::One(location(1))
            },
            stamp: PackedStamp::default(),
        }
    }

    /// What a checkpoint keeps of a record (not the visited bit).
    fn kept((key, record): (&[u8], &ObjectRecord)) -> (Vec<u8>, ObjectRecord) {
        let mut record = record.clone();
        record.flags &= !RECORD_FLAG_VISITED;
        (key.to_vec(), record)
    }

    /// A snapshot's walk, interleaved with every kind of change at random, hands out exactly the
    /// records indexed when it began, in order; and the index's own state stays whole.
    #[test]
    fn a_snapshot_walk_sees_the_index_as_it_began_whatever_changes_meanwhile() {
        for seed in 1..=200u64 {
            let mut random = Random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut index = Index::default();
            let mut seq = 0;
            for _ in 0..random.below(200) {
                seq += 1;
                let record = record(seq, &mut random);
                index.install(key(random.below(300)), record);
            }
            let expected: Vec<_> = index.records_in_order().map(kept).collect();
            index.begin_snapshot();
            let mut walked = Vec::new();
            let mut finished = false;
            while !finished {
                for _ in 0..random.below(12) {
                    let key = key(random.below(300));
                    match random.below(5) {
                        0 | 1 => {
                            seq += 1;
                            let record = record(seq, &mut random);
                            index.install(key, record);
                        }
                        2 => {
                            index.remove_older(&key, seq + 1, false);
                        }
                        3 => {
                            if let Some(record) = index.get_mut(&key) {
                                record.flags ^= RECORD_FLAG_DIRTY;
                                record.chunks.set(
                                    0,
                                    Location {
                                        region: 9,
                                        block: 9,
                                        first_crc: 9,
                                    },
                                );
                            }
                        }
                        _ => {
                            index.set_visited(&key, random.below(2) == 0);
                        }
                    }
                }
                let mut budget = random.below(20);
                finished = index.snapshot_step(|key, record| {
                    walked.push(kept((key, record)));
                    budget = budget.saturating_sub(1);
                    budget > 0
                });
            }
            assert_eq!(walked, expected, "seed {seed}");
            assert_eq!(index.snapshot_saved(), 0, "a finished walk keeps nothing");
            index.end_snapshot();
            super::super::tests::assert_in_step(&index);
        }
    }

    /// Changes behind the walk save nothing; changes ahead save each key once; reads, and keys
    /// looked for and not found, save nothing.
    #[test]
    fn only_keys_ahead_of_the_walk_are_saved_and_each_once() {
        let mut random = Random(7);
        let mut index = Index::default();
        for number in 1..=6 {
            index.install(key(number), record(number, &mut random));
        }
        index.begin_snapshot();
        let mut handed = 0;
        assert!(!index.snapshot_step(|_, _| {
            handed += 1;
            handed < 3
        }));
        // Handed out: the first three listed keys in byte order.
        let passed: Vec<Vec<u8>> = index
            .listed
            .iter()
            .take(3)
            .map(|key| key.to_vec())
            .collect();
        for key in &passed {
            let key = ObjectKey::from_joined(key);
            index.get_mut(&key).unwrap().flags ^= 1;
        }
        assert_eq!(index.snapshot_saved(), 0);
        let ahead = ObjectKey::from_joined(&index.listed.iter().nth(4).unwrap().clone());
        index.get_mut(&ahead).unwrap().flags ^= 1;
        index.get_mut(&ahead).unwrap().flags ^= 1;
        index.install(key(100), record(100, &mut random));
        index.set_visited(&key(5), true);
        assert!(index.get_mut(&key(200)).is_none());
        assert_eq!(
            index.snapshot_saved(),
            2,
            "the key ahead once, and the new key"
        );
        index.end_snapshot();
    }
}
