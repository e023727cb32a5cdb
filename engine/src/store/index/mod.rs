//! The in-memory index of one shard: (bucket, key) → the newest version's chunk locations.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::rc::Rc;

use crate::key::{is_origin_chunk_joined, split_joined};

mod snapshot;
mod table;
pub use crate::key::ObjectKey;
pub use crate::stamp::Stamp;
use snapshot::Snapshot;
use table::KeyTable;

/// Where one chunk's entry lives: a region of this shard and a block within it, plus the
/// CRC32C of the chunk's first data piece (the whole data for small chunks, which are then read
/// and verified without their header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub region: u32,
    pub block: u32,
    pub first_crc: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunks {
    One(Location),
    Many(Box<[Location]>),
}

impl Chunks {
    pub fn get(&self, index: usize) -> Location {
        match self {
            Chunks::One(location) => {
                assert_eq!(index, 0);
                *location
            }
            Chunks::Many(locations) => locations[index],
        }
    }

    pub fn set(&mut self, index: usize, location: Location) {
        match self {
            Chunks::One(existing) => {
                assert_eq!(index, 0);
                *existing = location;
            }
            Chunks::Many(locations) => locations[index] = location,
        }
    }

    pub fn as_slice(&self) -> &[Location] {
        match self {
            Chunks::One(location) => std::slice::from_ref(location),
            Chunks::Many(locations) => locations,
        }
    }

    pub fn from_vec(mut locations: Vec<Location>) -> Chunks {
        assert!(!locations.is_empty());
        if locations.len() == 1 {
            Chunks::One(locations.pop().expect("one location"))
        } else {
            Chunks::Many(locations.into_boxed_slice())
        }
    }
}

pub const RECORD_FLAG_DIRTY: u8 = 1;
pub const RECORD_FLAG_VISITED: u8 = 2;
/// The version's first chunk header holds attributes (see `Store::attributes`).
pub const RECORD_FLAG_ATTRIBUTES: u8 = 4;

/// The newest complete version of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRecord {
    pub seq: u64,
    pub bytes: u64,
    pub flags: u8,
    pub chunks: Chunks,
    /// When it was written, and its MD5 tag if the writer gave one.
    pub stamp: PackedStamp,
}

/// A `Stamp` as the index holds it: the time in milliseconds as 48 bits (S3 lists times to the
/// millisecond, and sync tools compare them with files' times), held in 4- and 2-byte halves so
/// that the record keeps 4-byte alignment and no padding beside the tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedStamp {
    modified_low: u32,
    modified_high: u16,
    md5: Option<crate::stamp::Md5Tag>,
}

impl From<Stamp> for PackedStamp {
    fn from(stamp: Stamp) -> PackedStamp {
        let ms = stamp.modified_ms.min((1 << 48) - 1);
        PackedStamp {
            modified_low: ms as u32,
            modified_high: (ms >> 32) as u16,
            md5: stamp.md5,
        }
    }
}

impl From<PackedStamp> for Stamp {
    fn from(packed: PackedStamp) -> Stamp {
        Stamp {
            modified_ms: u64::from(packed.modified_high) << 32 | u64::from(packed.modified_low),
            md5: packed.md5,
        }
    }
}

impl ObjectRecord {
    pub fn dirty(&self) -> bool {
        self.flags & RECORD_FLAG_DIRTY != 0
    }

    pub fn visited(&self) -> bool {
        self.flags & RECORD_FLAG_VISITED != 0
    }

    pub fn described(&self) -> bool {
        self.flags & RECORD_FLAG_ATTRIBUTES != 0
    }
}

/// What the engine says about an object without reading its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub bucket: String,
    pub key: String,
    pub bytes: u64,
    /// The version: the shard's sequence number of the put that wrote it.
    pub seq: u64,
    /// Not yet written back to the origin.
    pub dirty: bool,
    /// When the version was written and its MD5 tag (as far as they are known).
    pub stamp: Stamp,
}

impl ObjectMeta {
    pub(crate) fn of(key: &ObjectKey, record: &ObjectRecord) -> ObjectMeta {
        ObjectMeta::of_joined(key.as_bytes(), record)
    }

    /// From a joined key the index holds (validated when it was an `ObjectKey`).
    fn of_joined(joined: &[u8], record: &ObjectRecord) -> ObjectMeta {
        let (bucket, key) = split_joined(joined);
        ObjectMeta {
            bucket: std::str::from_utf8(bucket)
                .expect("validated UTF-8")
                .to_string(),
            key: std::str::from_utf8(key)
                .expect("validated UTF-8")
                .to_string(),
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
            stamp: record.stamp.into(),
        }
    }
}

/// An object's size and version, without its name (nothing allocated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredVersion {
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    pub stamp: Stamp,
}

/// A joined key as the index holds it: one allocation, shared by the hash map and the ordered
/// view (a reference count instead of a second copy of the bytes).
type SharedKey = Rc<[u8]>;

/// Two views of one shard's objects, kept in step by every method that changes them:
///
/// - a hash map from key to record, for point lookups: one or two cache lines, where an ordered
///   tree chased a pointer to a key for every comparison (measured: the tree's search was a
///   fifth of a shard's CPU time in 4 KiB random reads). The hasher is foldhash, seeded at
///   random per process (keys come from clients), at a fraction of SipHash's cost;
/// - an ordered set of the same keys, for `list`: a page costs a descent to its first key and a
///   step per key, not a walk of the shard. Engine-private chunk keys are left out of it (LIST
///   never shows them), so a page never has to skip them.
///
/// Both hold the same `Rc`, so a key's bytes are stored once. The chunk keys have an ordered set
/// of their own (they are few: one per chunk of a large object read through), so that a
/// checkpoint walks every key in order, a batch at a time (`snapshot.rs`).
#[derive(Default)]
pub struct Index {
    objects: KeyTable<ObjectRecord>,
    /// Every key of `objects` that a client can list (no chunk keys), in byte order.
    listed: BTreeSet<SharedKey>,
    /// Every chunk key of `objects`, in byte order: `objects.len() == listed.len() + chunks.len()`.
    chunks: BTreeSet<SharedKey>,
    bytes: u64,
    totals: Totals,
    /// The checkpoint being taken, if one is: the index as it was when it began.
    snapshot: Option<Snapshot>,
}

/// Sums over the indexed records, kept as they change: with the count, what a checkpoint of
/// them takes in bytes, known before it is encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Bytes of the joined keys (bucket, separator, key).
    pub key_bytes: u64,
    /// Records with an MD5 tag.
    pub md5_tags: u64,
    /// Chunk locations.
    pub locations: u64,
}

impl Totals {
    fn add(&mut self, key: &[u8], record: &ObjectRecord) {
        self.key_bytes += key.len() as u64;
        self.md5_tags += u64::from(record.stamp.md5.is_some());
        self.locations += record.chunks.as_slice().len() as u64;
    }

    fn remove(&mut self, key: &[u8], record: &ObjectRecord) {
        self.key_bytes -= key.len() as u64;
        self.md5_tags -= u64::from(record.stamp.md5.is_some());
        self.locations -= record.chunks.as_slice().len() as u64;
    }
}

impl Index {
    pub fn get(&self, key: &ObjectKey) -> Option<&ObjectRecord> {
        self.objects.get(key.as_bytes())
    }

    /// The record to change (its flags, a chunk's location); a checkpoint being taken keeps
    /// the record as it was. Not to change its key's size, tag or chunk count (`Totals`).
    pub fn get_mut(&mut self, key: &ObjectKey) -> Option<&mut ObjectRecord> {
        if self.objects.contains_key(key.as_bytes()) {
            self.preserve(key.as_bytes());
        }
        self.objects.get_mut(key.as_bytes())
    }

    /// Set or clear the version's visited bit (SIEVE's, which checkpoints do not keep), and
    /// return its record.
    pub fn set_visited(&mut self, key: &ObjectKey, visited: bool) -> Option<&ObjectRecord> {
        let record = self.objects.get_mut(key.as_bytes())?;
        if visited {
            record.flags |= RECORD_FLAG_VISITED;
        } else {
            record.flags &= !RECORD_FLAG_VISITED;
        }
        Some(record)
    }

    /// An index of `records`, whose keys are distinct (recovery's newest version of each): the
    /// ordered view is built from the sorted keys in one pass, not by an insert each, which
    /// took most of a restart's CPU time on a store of small objects.
    #[cfg(test)]
    pub(crate) fn built_from(records: Vec<(ObjectKey, ObjectRecord)>) -> Index {
        Index::built_from_shared(
            records
                .into_iter()
                .map(|(key, record)| (Rc::from(key.into_joined()), record))
                .collect(),
        )
    }

    /// `built_from` for keys already in the index's shared form (a checkpoint's, loaded
    /// without a copy); fastest when they come sorted.
    pub(crate) fn built_from_shared(records: Vec<(Rc<[u8]>, ObjectRecord)>) -> Index {
        let mut objects = KeyTable::with_capacity(records.len());
        let mut listed = Vec::with_capacity(records.len());
        let mut chunks = Vec::new();
        let (mut bytes, mut totals) = (0, Totals::default());
        for (shared, record) in records {
            bytes += record.bytes;
            totals.add(&shared, &record);
            if is_origin_chunk_joined(&shared) {
                chunks.push(shared.clone());
            } else {
                listed.push(shared.clone());
            }
            let replaced = objects.insert(shared, record);
            assert!(replaced.is_none(), "a key was given twice");
        }
        // Stable: a sorted run (a checkpoint's keys) and a few others merge in one pass.
        listed.sort();
        chunks.sort();
        let index = Index {
            objects,
            // From sorted keys, BTreeSet's collect builds the tree bottom up.
            listed: listed.into_iter().collect(),
            chunks: chunks.into_iter().collect(),
            bytes,
            totals,
            snapshot: None,
        };
        index.debug_assert_in_step();
        index
    }

    /// Install `record` unless a newer version is already indexed.
    pub fn install(&mut self, key: ObjectKey, record: ObjectRecord) -> bool {
        if self
            .objects
            .get(key.as_bytes())
            .is_some_and(|existing| existing.seq >= record.seq)
        {
            return false;
        }
        self.preserve(key.as_bytes());
        self.totals.add(key.as_bytes(), &record);
        if let Some(existing) = self.objects.get_mut(key.as_bytes()) {
            // A new version of a key already in both views: only the record changes.
            self.totals.remove(key.as_bytes(), existing);
            self.bytes = self.bytes - existing.bytes + record.bytes;
            *existing = record;
            return true;
        }
        let chunk = key.is_origin_chunk();
        let shared: SharedKey = Rc::from(key.into_joined());
        self.bytes += record.bytes;
        let added = if chunk {
            self.chunks.insert(shared.clone())
        } else {
            self.listed.insert(shared.clone())
        };
        assert!(added, "a key missing from the map was in an ordered view");
        let replaced = self.objects.insert(shared, record);
        assert!(replaced.is_none(), "the key was looked up as missing");
        self.debug_assert_in_step();
        true
    }

    /// Remove the object if its indexed version is older than `seq` (or exactly `seq` when
    /// `inclusive`).
    pub fn remove_older(
        &mut self,
        key: &ObjectKey,
        seq: u64,
        inclusive: bool,
    ) -> Option<ObjectRecord> {
        let existing = self.objects.get(key.as_bytes())?;
        if !(existing.seq < seq || (inclusive && existing.seq == seq)) {
            return None;
        }
        self.preserve(key.as_bytes());
        let removed = self.objects.remove(key.as_bytes())?;
        self.bytes -= removed.bytes;
        self.totals.remove(key.as_bytes(), &removed);
        let was_ordered = if key.is_origin_chunk() {
            self.chunks.remove(key.as_bytes())
        } else {
            self.listed.remove(key.as_bytes())
        };
        assert!(
            was_ordered,
            "a key in the map was missing from its ordered view"
        );
        self.debug_assert_in_step();
        Some(removed)
    }

    /// Cheap enough for every change in a debug build: the counts of both views agree. With
    /// the assertions on each insert and remove, that makes them hold the same keys.
    fn debug_assert_in_step(&self) {
        debug_assert_eq!(
            self.objects.len(),
            self.listed.len() + self.chunks.len(),
            "the hash map and the ordered views disagree"
        );
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Bytes of object data indexed.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Recovery's invariant, checked once the index is rebuilt: every location lies in a
    /// region recovery found holding this shard's entries, inside its blocks, and every
    /// version is older than the next sequence number to be given out. A walk of the index,
    /// once per start (a few milliseconds per million objects); a failure is a bug in
    /// recovery, so it stops the process rather than serve from a wrong index.
    pub fn assert_recovered(&self, used: &[bool], region_blocks: u32, next_seq: u64) {
        for (key, record) in self.objects.iter() {
            assert!(
                record.seq < next_seq,
                "recovered {key:?} at seq {} but the next seq is {next_seq}",
                record.seq
            );
            for location in record.chunks.as_slice() {
                assert!(
                    used.get(location.region as usize) == Some(&true)
                        && location.block > 0
                        && location.block < region_blocks,
                    "recovered {key:?} at {location:?}, outside the regions in use"
                );
            }
        }
    }

    /// Every (joined key, record), in no particular order.
    pub(crate) fn records(&self) -> impl Iterator<Item = (&[u8], &ObjectRecord)> {
        self.objects.iter().map(|(key, record)| (&key[..], record))
    }

    /// Every (joined key, record): the listed keys in byte order, then the chunk keys in byte
    /// order: the order of a checkpoint's records, so that loading it needs no sort.
    #[cfg(test)]
    pub(crate) fn records_in_order(&self) -> impl Iterator<Item = (&[u8], &ObjectRecord)> {
        self.listed
            .iter()
            .chain(&self.chunks)
            .map(|key| (&key[..], &self.objects[&key[..]]))
    }

    /// What `Totals` says of every record indexed.
    pub(crate) fn totals(&self) -> Totals {
        self.totals
    }

    /// (key, seq, bytes) of every dirty object: what recovery hands to write-back.
    pub fn dirty_objects(&self) -> Vec<(ObjectKey, u64, u64)> {
        self.objects
            .iter()
            .filter(|(_, record)| record.dirty())
            .map(|(key, record)| (ObjectKey::from_joined(key), record.seq, record.bytes))
            .collect()
    }

    /// (key, seq, dirty) of every object with a chunk in `region`. A full walk of the index:
    /// only for the rare reclaim of a region with damaged headers.
    pub fn in_region(&self, region: u32) -> Vec<(ObjectKey, u64, bool)> {
        self.objects
            .iter()
            .filter(|(_, record)| match &record.chunks {
                Chunks::One(location) => location.region == region,
                Chunks::Many(locations) => {
                    locations.iter().any(|location| location.region == region)
                }
            })
            .map(|(key, record)| (ObjectKey::from_joined(key), record.seq, record.dirty()))
            .collect()
    }

    /// Up to `limit` objects whose joined key starts with `prefix`, after `start_after`, in key
    /// order. A descent of the ordered view to the first key, then one step and one map lookup
    /// per key listed: O(log n + limit), whatever the shard holds. Chunk keys are not in the
    /// ordered view, so none is listed and none has to be skipped.
    pub fn list(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
    ) -> Vec<ObjectMeta> {
        let prefix = prefix.as_bytes();
        // Every key after a `start_after` below the prefix is at or after the prefix.
        let first = match start_after {
            Some(after) if after.as_bytes() >= prefix => Bound::Excluded(after.as_bytes()),
            _ => Bound::Included(prefix),
        };
        self.listed
            .range::<[u8], _>((first, Bound::Unbounded))
            .take_while(|key| key.starts_with(prefix))
            .take(limit)
            .map(|key| {
                debug_assert!(!split_joined(key).1.contains(&0), "a chunk key is listed");
                ObjectMeta::of_joined(key, &self.objects[&**key])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_pages_within_a_prefix_and_bucket() {
        let mut index = Index::default();
        let location = Location {
            region: 0,
            block: 1,
            first_crc: 0,
        };
        for (bucket, key) in [("a", "x/1"), ("a", "x/2"), ("a", "y/1"), ("ab", "x/3")] {
            let record = ObjectRecord {
                seq: 1,
                bytes: 3,
                flags: 0,
                chunks: Chunks::One(location),
                stamp: PackedStamp::default(),
            };
            index.install(ObjectKey::new(bucket, key).unwrap(), record);
        }
        let prefix = ObjectKey::prefix("a", "x/").unwrap();
        let first = index.list(&prefix, None, 1);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].key, "x/1");
        let after = ObjectKey::new("a", "x/1").unwrap();
        let rest = index.list(&prefix, Some(&after), 10);
        assert_eq!(
            rest.iter()
                .map(|meta| meta.key.as_str())
                .collect::<Vec<_>>(),
            ["x/2"]
        );
        let whole_bucket = index.list(&ObjectKey::prefix("a", "").unwrap(), None, 10);
        assert_eq!(whole_bucket.len(), 3, "bucket ab is not part of bucket a");
        assert_eq!(index.bytes(), 12);
    }

    fn record(seq: u64, bytes: u64) -> ObjectRecord {
        ObjectRecord {
            seq,
            bytes,
            flags: 0,
            chunks: Chunks::One(Location {
                region: 0,
                block: 1,
                first_crc: 0,
            }),
            stamp: PackedStamp::default(),
        }
    }

    fn listed_keys(index: &Index, bucket: &str, prefix: &str, after: Option<&str>) -> Vec<String> {
        let prefix = ObjectKey::prefix(bucket, prefix).unwrap();
        let after = after.map(|after| ObjectKey::new(bucket, after).unwrap());
        index
            .list(&prefix, after.as_ref(), usize::MAX)
            .into_iter()
            .map(|meta| {
                assert_eq!(meta.bucket, bucket);
                meta.key
            })
            .collect()
    }

    #[test]
    fn an_index_built_in_one_pass_is_the_one_built_by_installs() {
        // Keys out of order, across buckets, and chunk keys (never listed).
        let mut records = Vec::new();
        for index in (0..500u64).rev() {
            let bucket = if index % 3 == 0 { "b" } else { "a" };
            let key = ObjectKey::new(bucket, &format!("k/{:04}", (index * 7919) % 1000)).unwrap();
            let key = if index % 50 == 0 {
                key.origin_chunk(index, 1).unwrap()
            } else {
                key
            };
            records.push((key, record(index + 1, index)));
        }
        let mut installed = Index::default();
        for (key, record) in records.clone() {
            assert!(installed.install(key, record));
        }
        let built = Index::built_from(records.clone());
        assert_in_step(&built);
        assert_eq!(built.len(), installed.len());
        assert_eq!(built.bytes(), installed.bytes());
        assert_eq!(built.chunks, installed.chunks);
        assert_eq!(built.totals(), installed.totals());
        for (key, record) in &records {
            assert_eq!(built.get(key), Some(record));
        }
        for bucket in ["a", "b"] {
            let listed = listed_keys(&built, bucket, "", None);
            assert_eq!(listed, listed_keys(&installed, bucket, "", None));
            assert!(listed.windows(2).all(|pair| pair[0] < pair[1]), "in order");
        }
    }

    /// The views hold the same keys, sharing one allocation each, the listed view holds no
    /// chunk key, and the totals are those of the records.
    pub(super) fn assert_in_step(index: &Index) {
        let mut chunk_keys = 0;
        let mut totals = Totals::default();
        for (key, record) in index.objects.iter() {
            totals.add(key, record);
            if split_joined(key).1.contains(&0) {
                chunk_keys += 1;
                assert!(
                    !index.listed.contains(&**key),
                    "chunk key in the ordered view"
                );
                let chunk = index.chunks.get(&**key).expect("chunk key in its view");
                assert!(Rc::ptr_eq(chunk, key), "the views share the key's bytes");
            } else {
                let listed = index
                    .listed
                    .get(&**key)
                    .expect("listable key in the ordered view");
                assert!(Rc::ptr_eq(listed, key), "the views share the key's bytes");
            }
        }
        for key in &index.listed {
            assert!(
                index.objects.contains_key(key),
                "ordered view has a removed key"
            );
        }
        assert_eq!(index.chunks.len(), chunk_keys);
        assert_eq!(index.listed.len() + chunk_keys, index.objects.len());
        assert_eq!(index.totals, totals);
    }

    #[test]
    fn a_recovered_index_pointing_outside_the_regions_in_use_stops_the_process() {
        let mut index = Index::default();
        let location = |region| Location {
            region,
            block: 1,
            first_crc: 0,
        };
        let record = |seq, region| ObjectRecord {
            seq,
            bytes: 1,
            flags: 0,
            chunks: Chunks::One(location(region)),
            stamp: PackedStamp::default(),
        };
        index.install(ObjectKey::new("b", "k").unwrap(), record(3, 1));
        index.assert_recovered(&[false, true], 16, 4);
        for (used, next_seq) in [([true, false], 4), ([false, true], 3)] {
            let outcome = std::panic::catch_unwind(|| index.assert_recovered(&used, 16, next_seq));
            assert!(outcome.is_err(), "{used:?} {next_seq}");
        }
    }

    #[test]
    fn install_replace_and_remove_keep_both_views_in_step() {
        let mut index = Index::default();
        let key = ObjectKey::new("data", "x/1").unwrap();
        assert!(index.install(key.clone(), record(5, 10)));
        assert_in_step(&index);
        assert!(
            !index.install(key.clone(), record(4, 99)),
            "older version refused"
        );
        assert!(
            !index.install(key.clone(), record(5, 99)),
            "same version refused"
        );
        assert_eq!(index.get(&key).unwrap().bytes, 10);
        assert!(
            index.install(key.clone(), record(7, 30)),
            "newer version replaces"
        );
        assert_in_step(&index);
        assert_eq!(index.len(), 1);
        assert_eq!(index.bytes(), 30);
        assert_eq!(listed_keys(&index, "data", "", None), ["x/1"]);
        let page = index.list(&ObjectKey::prefix("data", "").unwrap(), None, 10);
        assert_eq!(
            (page[0].seq, page[0].bytes),
            (7, 30),
            "the listing shows the new record"
        );

        assert!(
            index.remove_older(&key, 7, false).is_none(),
            "not older than 7"
        );
        assert!(index.remove_older(&key, 6, true).is_none(), "newer than 6");
        assert_eq!(index.remove_older(&key, 7, true).unwrap().seq, 7);
        assert_in_step(&index);
        assert!(index.is_empty());
        assert_eq!(index.bytes(), 0);
        assert!(listed_keys(&index, "data", "", None).is_empty());
        assert!(
            index.remove_older(&key, 100, true).is_none(),
            "already gone"
        );

        // Installed again after its removal: back in both views.
        assert!(index.install(key.clone(), record(8, 1)));
        assert_in_step(&index);
        assert_eq!(listed_keys(&index, "data", "", None), ["x/1"]);
    }

    #[test]
    fn chunk_keys_are_indexed_but_never_listed() {
        let mut index = Index::default();
        let parent = ObjectKey::new("data", "big").unwrap();
        let chunks: Vec<ObjectKey> = (0..3)
            .map(|chunk| parent.origin_chunk(0xfeed, chunk).unwrap())
            .collect();
        for chunk in &chunks {
            assert!(chunk.is_origin_chunk());
            assert!(index.install(chunk.clone(), record(1, 4)));
        }
        assert_in_step(&index);
        assert_eq!(index.len(), 3);
        assert!(listed_keys(&index, "data", "", None).is_empty());
        assert!(listed_keys(&index, "data", "big", None).is_empty());
        assert!(
            index.get(&chunks[1]).is_some(),
            "chunks are found by lookup"
        );

        assert!(index.install(parent.clone(), record(2, 12)));
        assert!(index.install(ObjectKey::new("data", "big2").unwrap(), record(3, 1)));
        assert_eq!(listed_keys(&index, "data", "big", None), ["big", "big2"]);
        assert_eq!(listed_keys(&index, "data", "", Some("big")), ["big2"]);
        assert!(
            index.install(chunks[0].clone(), record(9, 4)),
            "a chunk's new version"
        );
        assert_in_step(&index);

        assert!(index.remove_older(&chunks[2], 1, true).is_some());
        assert_in_step(&index);
        assert_eq!(index.len(), 4);
        assert_eq!(listed_keys(&index, "data", "", None), ["big", "big2"]);
    }

    #[test]
    fn pages_chain_within_a_prefix_and_never_cross_into_a_longer_bucket() {
        let mut index = Index::default();
        let mut seq = 0;
        for (bucket, key) in [
            ("a", "x/1"),
            ("a", "x/2"),
            ("a", "x/3"),
            ("a", "x0"),
            ("a", "y/1"),
            ("ab", "a"),
            ("ab", "x/1"),
            ("ab", "x/4"),
            ("b", "x/1"),
        ] {
            seq += 1;
            index.install(ObjectKey::new(bucket, key).unwrap(), record(seq, 1));
        }
        assert_in_step(&index);
        // Page through bucket a two keys at a time, each page after the last one's final key.
        let mut pages = Vec::new();
        let mut after: Option<ObjectKey> = None;
        loop {
            let page = index.list(&ObjectKey::prefix("a", "").unwrap(), after.as_ref(), 2);
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 2);
            after = Some(ObjectKey::new("a", &page.last().unwrap().key).unwrap());
            pages.push(page.into_iter().map(|meta| meta.key).collect::<Vec<_>>());
        }
        assert_eq!(
            pages,
            [vec!["x/1", "x/2"], vec!["x/3", "x0"], vec!["y/1"]],
            "bucket ab is not part of bucket a"
        );
        assert_eq!(listed_keys(&index, "a", "x/", None), ["x/1", "x/2", "x/3"]);
        assert_eq!(listed_keys(&index, "a", "x/", Some("x/1")), ["x/2", "x/3"]);
        assert_eq!(
            listed_keys(&index, "a", "x/", Some("x/3")),
            Vec::<String>::new()
        );
        assert_eq!(
            listed_keys(&index, "a", "x/", Some("w")),
            ["x/1", "x/2", "x/3"]
        );
        assert_eq!(
            listed_keys(&index, "a", "x/", Some("x/9")),
            Vec::<String>::new()
        );
        assert_eq!(
            listed_keys(&index, "a", "x/", Some("z")),
            Vec::<String>::new()
        );
        assert_eq!(listed_keys(&index, "ab", "", None), ["a", "x/1", "x/4"]);
        assert_eq!(listed_keys(&index, "ab", "x", Some("a")), ["x/1", "x/4"]);
        assert_eq!(listed_keys(&index, "b", "", None), ["x/1"]);
        assert!(listed_keys(&index, "c", "", None).is_empty());
        assert_eq!(
            index
                .list(&ObjectKey::prefix("a", "").unwrap(), None, 0)
                .len(),
            0
        );
        assert_eq!(index.bytes(), 9);
    }

    /// Random installs and removes, client and chunk keys mixed, against a plain `BTreeMap`:
    /// after every change both views are in step, and every page of every prefix is the
    /// model's.
    #[test]
    fn listing_matches_a_model_through_random_changes() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let mut index = Index::default();
        let mut model: std::collections::BTreeMap<String, u64> = Default::default();
        let prefixes = ["", "k", "k1", "k1/", "k2/3", "z"];
        for step in 0..2000u64 {
            let name = format!("k{}/{}", random(3), random(40));
            let key = ObjectKey::new("data", &name).unwrap();
            let target = if random(4) == 0 {
                key.origin_chunk(random(2), random(3)).unwrap()
            } else {
                key.clone()
            };
            if random(3) == 0 {
                let removed = index.remove_older(&target, step + 1, false).is_some();
                if !target.is_origin_chunk() {
                    assert_eq!(removed, model.remove(&name).is_some());
                }
            } else {
                assert!(index.install(target.clone(), record(step + 1, 1)));
                if !target.is_origin_chunk() {
                    model.insert(name, step + 1);
                }
            }
            assert_in_step(&index);
            if step % 50 != 0 {
                continue;
            }
            for prefix in prefixes {
                let expected: Vec<(String, u64)> = model
                    .iter()
                    .filter(|(name, _)| name.starts_with(prefix))
                    .map(|(name, seq)| (name.clone(), *seq))
                    .collect();
                let mut listed = Vec::new();
                let mut after: Option<ObjectKey> = None;
                loop {
                    let page = index.list(
                        &ObjectKey::prefix("data", prefix).unwrap(),
                        after.as_ref(),
                        7,
                    );
                    let done = page.len() < 7;
                    after = page
                        .last()
                        .map(|meta| ObjectKey::new("data", &meta.key).unwrap());
                    listed.extend(page.into_iter().map(|meta| (meta.key, meta.seq)));
                    if done {
                        break;
                    }
                }
                assert_eq!(listed, expected, "prefix {prefix:?} at step {step}");
            }
        }
    }
}

#[cfg(test)]
mod size {
    use super::PackedStamp;
    use crate::stamp::{Md5Tag, Stamp};

    #[test]
    fn a_packed_stamp_keeps_milliseconds_and_the_tag() {
        let stamp = Stamp {
            modified_ms: 1_796_000_000_123,
            md5: Some(Md5Tag {
                digest: [7; 16],
                parts: 3,
            }),
        };
        assert_eq!(Stamp::from(PackedStamp::from(stamp)), stamp);
    }

    #[test]
    fn a_record_stays_within_its_budget() {
        // The index's cost per object (docs/architecture.md): each byte here is one per object.
        assert!(std::mem::size_of::<super::ObjectRecord>() <= 72);
    }
}
