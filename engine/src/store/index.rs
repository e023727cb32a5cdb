//! The in-memory index of one shard: (bucket, key) → the newest version's chunk locations.

use std::collections::{BinaryHeap, HashMap};

use hydrant_proto::name;

use crate::format::{BUCKET_BYTES_MAX, KEY_BYTES_MAX};
use crate::{Error, ErrorKind, Result};

/// A bucket and key, stored as `bucket 0x00 key` so that byte order sorts by bucket, then key,
/// and a prefix of a key is a prefix of the stored bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(Box<[u8]>);

impl ObjectKey {
    /// Validate and join, by the one grammar of names (`hydrant_proto::name`: no dot or empty
    /// segments, no NUL, S3-like bucket names).
    pub fn new(bucket: &str, key: &str) -> Result<ObjectKey> {
        name::check_bucket(bucket).map_err(invalid_name)?;
        name::check_key(key).map_err(invalid_name)?;
        Ok(Self::join(bucket, key))
    }

    /// A bucket and a prefix of keys (possibly empty), for listing.
    pub fn prefix(bucket: &str, prefix: &str) -> Result<ObjectKey> {
        name::check_bucket(bucket).map_err(invalid_name)?;
        name::check_prefix(prefix).map_err(invalid_name)?;
        Ok(Self::join(bucket, prefix))
    }

    fn join(bucket: &str, key: &str) -> ObjectKey {
        let mut bytes = Vec::with_capacity(bucket.len() + 1 + key.len());
        bytes.extend_from_slice(bucket.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(key.as_bytes());
        ObjectKey(bytes.into_boxed_slice())
    }

    /// From the bytes of an entry header (already bounded by the format): a client's key, or
    /// one of the engine's own chunk keys (see `origin_chunk`).
    pub(crate) fn from_parts(bucket: &[u8], key: &[u8]) -> Option<ObjectKey> {
        let bucket = std::str::from_utf8(bucket).ok()?;
        let key = std::str::from_utf8(key).ok()?;
        let parent = key.split_once('\0').map_or(key, |(parent, _)| parent);
        acceptable_on_device(bucket, parent).then(|| Self::join(bucket, key))
    }

    /// The key under which chunk `chunk` of version `version_tag` of a large origin object is
    /// cached: `key NUL version NUL chunk`. Clients cannot name it (their keys have no NUL), and
    /// a new version at the origin gets new chunk keys, so stale chunks are never read. `None`
    /// when the key is too long to carry the suffix.
    pub fn origin_chunk(&self, version_tag: u64, chunk: u64) -> Option<ObjectKey> {
        let suffix = format!("\0{version_tag:016x}\0{chunk}");
        if self.key_bytes().len() + suffix.len() > KEY_BYTES_MAX {
            return None;
        }
        let mut bytes = Vec::with_capacity(self.0.len() + suffix.len());
        bytes.extend_from_slice(&self.0);
        bytes.extend_from_slice(suffix.as_bytes());
        Some(ObjectKey(bytes.into_boxed_slice()))
    }

    /// Whether this is one of the engine's chunk keys rather than a client's object.
    pub fn is_origin_chunk(&self) -> bool {
        self.key_bytes().contains(&0)
    }

    fn split(&self) -> (&[u8], &[u8]) {
        let zero = self
            .0
            .iter()
            .position(|&byte| byte == 0)
            .expect("joined key has a separator");
        (&self.0[..zero], &self.0[zero + 1..])
    }

    pub fn bucket(&self) -> &str {
        std::str::from_utf8(self.split().0).expect("validated UTF-8")
    }

    pub fn key(&self) -> &str {
        std::str::from_utf8(self.split().1).expect("validated UTF-8")
    }

    pub fn bucket_bytes(&self) -> &[u8] {
        self.split().0
    }

    pub fn key_bytes(&self) -> &[u8] {
        self.split().1
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn invalid_name(error: name::NameError) -> Error {
    Error::new(ErrorKind::InvalidKey, error.to_string())
}

/// Names as an older store may hold them (before the grammar of `hydrant_proto::name`): a
/// bucket of `a-z 0-9 . - _` and a key without NUL, each within the format's bounds. Recovery
/// keeps such objects (nothing written is dropped); clients cannot name them and origins
/// refuse to route them (see `Origins::route` and `Route::path`).
fn acceptable_on_device(bucket: &str, key: &str) -> bool {
    let bucket_ok = !bucket.is_empty()
        && bucket.len() <= BUCKET_BYTES_MAX
        && bucket.bytes().all(|byte| {
            byte.is_ascii_lowercase() || byte.is_ascii_digit() || b".-_".contains(&byte)
        });
    bucket_ok && !key.is_empty() && key.len() <= KEY_BYTES_MAX && !key.contains('\0')
}

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

/// The newest complete version of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRecord {
    pub seq: u64,
    pub bytes: u64,
    pub flags: u8,
    pub chunks: Chunks,
}

impl ObjectRecord {
    pub fn dirty(&self) -> bool {
        self.flags & RECORD_FLAG_DIRTY != 0
    }

    pub fn visited(&self) -> bool {
        self.flags & RECORD_FLAG_VISITED != 0
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
}

impl ObjectMeta {
    pub(crate) fn of(key: &ObjectKey, record: &ObjectRecord) -> ObjectMeta {
        ObjectMeta {
            bucket: key.bucket().to_string(),
            key: key.key().to_string(),
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
        }
    }
}

/// An object's size and version, without its name (nothing allocated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredVersion {
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
}

/// A hash map from key to record: a point lookup touches one or two cache lines, where an
/// ordered tree chased a pointer to a key for every comparison (measured: the tree's search was
/// a fifth of a shard's CPU time in 4 KiB random reads). Listing scans the shard's map instead;
/// it is bounded by the page size in memory, not in time (see `list`). The hasher is foldhash,
/// seeded at random per process (keys come from clients), at a fraction of SipHash's cost.
#[derive(Default)]
pub struct Index {
    objects: HashMap<ObjectKey, ObjectRecord, foldhash::fast::RandomState>,
    bytes: u64,
}

impl Index {
    pub fn get(&self, key: &ObjectKey) -> Option<&ObjectRecord> {
        self.objects.get(key)
    }

    pub fn get_mut(&mut self, key: &ObjectKey) -> Option<&mut ObjectRecord> {
        self.objects.get_mut(key)
    }

    /// Install `record` unless a newer version is already indexed.
    pub fn install(&mut self, key: ObjectKey, record: ObjectRecord) -> bool {
        if let Some(existing) = self.objects.get(&key) {
            if existing.seq >= record.seq {
                return false;
            }
        }
        self.bytes += record.bytes;
        if let Some(replaced) = self.objects.insert(key, record) {
            self.bytes -= replaced.bytes;
        }
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
        let existing = self.objects.get(key)?;
        if existing.seq < seq || (inclusive && existing.seq == seq) {
            let removed = self.objects.remove(key)?;
            self.bytes -= removed.bytes;
            return Some(removed);
        }
        None
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

    /// (key, seq, bytes) of every dirty object: what recovery hands to write-back.
    pub fn dirty_objects(&self) -> Vec<(ObjectKey, u64, u64)> {
        self.objects
            .iter()
            .filter(|(_, record)| record.dirty())
            .map(|(key, record)| (key.clone(), record.seq, record.bytes))
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
            .map(|(key, record)| (key.clone(), record.seq, record.dirty()))
            .collect()
    }

    /// Up to `limit` objects whose joined key starts with `prefix`, after `start_after`, in key
    /// order. One pass over the shard's index, keeping the `limit` smallest matches in a heap:
    /// memory is bounded by the page, time by the number of objects in the shard.
    pub fn list(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
    ) -> Vec<ObjectMeta> {
        if limit == 0 {
            return Vec::new();
        }
        let mut smallest: BinaryHeap<&ObjectKey> = BinaryHeap::with_capacity(limit + 1);
        for key in self.objects.keys() {
            let wanted = key.as_bytes().starts_with(prefix.as_bytes())
                && start_after.is_none_or(|after| key > after)
                && !key.is_origin_chunk();
            if !wanted {
                continue;
            }
            if smallest.len() < limit {
                smallest.push(key);
            } else if smallest.peek().is_some_and(|largest| key < *largest) {
                smallest.pop();
                smallest.push(key);
            }
        }
        smallest
            .into_sorted_vec()
            .into_iter()
            .map(|key| ObjectMeta::of(key, &self.objects[key]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert_eq!(
            ObjectKey::new("b", "").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("b", &"k".repeat(1025)).unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("Bad", "k").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("", "k").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        let key = ObjectKey::new("data-1", &"k".repeat(1024)).unwrap();
        assert_eq!(key.bucket(), "data-1");
        assert_eq!(key.key().len(), 1024);
    }

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
}
