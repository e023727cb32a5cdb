//! What one shard serves: its NVMe store in front of the origin of each bucket.
//!
//! A read is answered from the store when it holds a current copy; otherwise from the origin
//! (one request per chunk however many readers wait, see `origin::read`), and what came back is
//! admitted to the store. Objects up to the chunk size are cached whole under their own key;
//! larger ones chunk by chunk under chunk keys tied to the origin version, so a range read
//! caches only the chunks it touched. Writes follow the bucket's write mode.
//!
//! Writes of a key by clients, and admissions of origin data under that key, take the key's
//! lock in turn; an admission writes only if the key's stored version is still the one it saw
//! when its origin read started, so origin data never replaces a newer write or resurrects a
//! deleted object.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::buf::ExternalBuf;
use crate::origin::read::{version_tag, Reads, Watch, DISCOVER};
use crate::origin::remote::{self, Condition, Fetch};
use crate::origin::writeback::{Upload, Uploader, WriteBack};
use crate::origin::{OriginVersion, Origins, Revalidate, Route, ShardOrigin, WriteMode};
use crate::rt::sync::WaitQueue;
use crate::stamp::{Md5Tag, Stamp};
use crate::store::{
    resolve_range, ByteRange, DirectGet, DirectRead, ObjectKey, ObjectMeta, ObjectRead, Store,
    StoredVersion,
};
use crate::tier::admission::{AdmissionStats, NvmeAdmission};
use crate::tier::dram::DramBytes;
use crate::tier::dram::{DramStats, DramTier, Lookup};
use crate::{Error, ErrorKind, Result};

mod plan;
mod read;
mod through;
mod write;

pub use plan::{PlanStats, PLANS_PER_SHARD_MAX, PLAN_READS_IN_FLIGHT};
pub use write::{Precondition, PutSource};

use through::*;

/// Whether the stored copy of `key` (`dirty` or not) is the current version without asking the
/// origin: a dirty copy is the newest, an immutable bucket's copies never change, and otherwise
/// the origin's metadata must be fresh by the bucket's TTL.
fn current_without_asking(
    origin: &ShardOrigin,
    route: &Route,
    key: &ObjectKey,
    dirty: bool,
) -> bool {
    dirty
        || route.revalidate == Revalidate::Immutable
        || origin.reads.fresh(key, route.revalidate).is_some()
}

/// Whether a read of `range` wants the whole of an object of `bytes` (only those fill the DRAM
/// tier).
fn whole(range: Option<ByteRange>, bytes: u64) -> bool {
    range.is_none_or(|range| range.start == 0 && range.end.is_none_or(|end| end >= bytes))
}

/// The answer for `range` of `version`, which the DRAM tier holds whole (`data`, whose CRC32C is
/// `crc`).
fn from_memory(
    version: StoredVersion,
    range: std::ops::Range<u64>,
    data: DramBytes,
    crc: u32,
) -> PartsRead {
    let memory = ReadData::Memory {
        range: 0..data.len(),
        data,
        crc: Some(crc),
    };
    PartsRead {
        bytes: version.bytes,
        seq: version.seq,
        dirty: version.dirty,
        stamp: version.stamp,
        start: range.start,
        data: memory.narrowed(range.start as usize..range.end as usize),
        from_origin: false,
        origin_version: 0,
        origin_attributes: None,
        copied_bytes: 0,
    }
}

/// Times a read starts over when the origin object changes under it.
const READ_ATTEMPTS_MAX: usize = 3;
/// Chunks read ahead of a sequential reader of a large origin object (a stream of 4 MiB
/// chunks at 100 ms per origin request goes at 40 MB/s without; eight keep 320 MB/s).
const READAHEAD_CHUNKS: u64 = 8;
/// Origin reads in flight on a shard beyond which no more are read ahead: each holds a chunk
/// until it is admitted, and often a copy of it in an answer, so read-ahead holds at most about
/// 50 MiB of a shard's memory (measured: a 20 GiB read-through with 64 grew the server by
/// 700 MiB, with 16 by 256, with 8 by 130-260). Four keep 160 MB/s per shard from an origin at
/// 100 ms per request.
const READAHEAD_FLIGHTS_MAX: usize = 4;
/// The most bytes one read through from the origin returns (it is held in memory whole).
pub const ORIGIN_READ_BYTES_MAX: u64 = 1 << 30;

/// An answer to a get.
pub struct CacheRead {
    /// Size of the whole object.
    pub bytes: u64,
    /// The version on NVMe (0 for data straight from the origin).
    pub seq: u64,
    pub dirty: bool,
    /// When the version was written and its MD5 tag, as far as they are known.
    pub stamp: Stamp,
    /// Offset in the object of the first byte of `data`.
    pub start: u64,
    pub data: Vec<u8>,
    /// Whether the origin was asked for (part of) the data.
    pub from_origin: bool,
    /// For data read through from the origin, a tag of the origin version it belongs to (0
    /// otherwise): reads of one object in parts compare it, so as never to join two versions.
    pub origin_version: u64,
    /// For data read through from the origin, what the origin said of the object beside its
    /// bytes (`None` for data here: see `Cache::attributes`).
    pub origin_attributes: Option<std::sync::Arc<crate::attributes::Attributes>>,
}

/// Where a read's bytes are.
pub enum ReadData {
    /// A range of the DRAM tier's copy of the object, with the CRC32C of that range when it
    /// is known without reading it (the whole object: the tier keeps its CRC).
    Memory {
        data: DramBytes,
        range: std::ops::Range<usize>,
        crc: Option<u32>,
    },
    /// In the shard's pinned buffers, as read from NVMe and checked.
    Store(ObjectRead),
    /// Gathered into memory of its own (origin reads, DRAM fills).
    Owned(Vec<u8>),
}

impl ReadData {
    pub fn len(&self) -> usize {
        match self {
            ReadData::Memory { range, .. } => range.len(),
            ReadData::Store(read) => read.len(),
            ReadData::Owned(data) => data.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, in order, as one or more slices.
    pub fn parts(&self) -> Vec<&[u8]> {
        match self {
            ReadData::Memory { data, range, .. } => vec![&data[range.clone()]],
            ReadData::Store(read) => read.parts.iter().map(|part| part.bytes()).collect(),
            ReadData::Owned(data) => vec![data.as_slice()],
        }
    }

    /// Each of `parts`, in order, without gathering them into a vector.
    pub fn for_each_part(&self, mut visit: impl FnMut(&[u8])) {
        match self {
            ReadData::Memory { data, range, .. } => visit(&data[range.clone()]),
            ReadData::Store(read) => read.parts.iter().for_each(|part| visit(part.bytes())),
            ReadData::Owned(data) => visit(data),
        }
    }

    /// The bytes in a vector of their own, and how many bytes that copied.
    pub fn into_vec(self) -> (Vec<u8>, u64) {
        match self {
            ReadData::Owned(data) => (data, 0),
            ReadData::Memory { data, range, .. } => {
                let copied = range.len() as u64;
                (data[range].to_vec(), copied)
            }
            ReadData::Store(read) => (read.to_vec(), read.len() as u64),
        }
    }

    /// The bytes as a buffer another thread may hold for as long as it needs, and how many
    /// bytes that copied: none for a DRAM hit (the tier's copy is shared, not copied) or for
    /// bytes already in memory of their own; an NVMe read's are copied out of the shard's
    /// pinned buffers, which go back to the shard at once.
    pub fn into_shared(self) -> (bytes::Bytes, u64) {
        match self {
            ReadData::Memory { data, range, .. } => {
                let whole = range == (0..data.len());
                let shared = bytes::Bytes::from_owner(SharedDram(data));
                (if whole { shared } else { shared.slice(range) }, 0)
            }
            ReadData::Owned(data) => (bytes::Bytes::from(data), 0),
            ReadData::Store(read) => {
                let mut shared = crate::buf::SharedBuf::with_capacity(read.len());
                for part in &read.parts {
                    shared.extend_from_slice(part.bytes());
                }
                (shared.into_bytes(), read.len() as u64)
            }
        }
    }

    /// The CRC32C of the bytes: known for the DRAM tier's whole objects and for NVMe reads of
    /// whole checksummed pieces without reading them again, else computed.
    pub fn crc(&self) -> u32 {
        match self {
            ReadData::Memory { crc: Some(crc), .. } => *crc,
            ReadData::Memory { data, range, .. } => hydrant_crc::crc32c(&data[range.clone()]),
            ReadData::Store(read) => read.crc(),
            ReadData::Owned(data) => hydrant_crc::crc32c(data),
        }
    }

    /// Only `range` of what this holds (used for whole-object data: the range of the object).
    fn narrowed(self, range: std::ops::Range<usize>) -> ReadData {
        match self {
            ReadData::Memory { data, crc, .. } => {
                let crc = crc.filter(|_| range == (0..data.len()));
                ReadData::Memory { data, range, crc }
            }
            ReadData::Owned(mut data) => {
                data.truncate(range.end);
                data.drain(..range.start);
                ReadData::Owned(data)
            }
            ReadData::Store(read) => ReadData::Store(read),
        }
    }
}

/// The DRAM tier's copy of an object as the owner of a `bytes::Bytes`.
struct SharedDram(DramBytes);

impl AsRef<[u8]> for SharedDram {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// What `Cache::get_into` put in its target.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// Size of the whole object.
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    /// Offset in the object of the first byte placed.
    pub start: u64,
    /// Bytes of the range (placed at the target's start when `written`).
    pub len: u64,
    /// False when the range did not fit in the target; nothing was written then.
    pub written: bool,
    pub from_origin: bool,
    /// Bytes the CPU copied to place them: 0 when the device's DMA put them there.
    pub copied_bytes: u64,
}

/// A read's bytes: where a read left them, or already placed in a target.
enum Got {
    Parts(PartsRead),
    Placed(DirectRead),
    /// Not read: the answer would hold more bytes than the caller has room for.
    Sized(Oversized),
}

/// A range not read because it holds more bytes than the caller has room for.
#[derive(Clone, Copy, Debug)]
struct Oversized {
    /// Size of the whole object.
    bytes: u64,
    start: u64,
    len: u64,
}

/// An answer to `get_parts_within`: the bytes, or how many there would be when that is more
/// than the caller has room for (nothing was read beyond what told the size).
pub enum Within {
    Read(PartsRead),
    Sized(u64),
}

/// An answer to `get_parts`: like `CacheRead`, with the bytes where the read left them.
pub struct PartsRead {
    /// Size of the whole object.
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    /// See `CacheRead::stamp`.
    pub stamp: Stamp,
    /// Offset in the object of the first byte of `data`.
    pub start: u64,
    pub data: ReadData,
    pub from_origin: bool,
    /// See `CacheRead::origin_version`.
    pub origin_version: u64,
    /// See `CacheRead::origin_attributes`.
    pub origin_attributes: Option<std::sync::Arc<crate::attributes::Attributes>>,
    /// Bytes the engine copied with the CPU to produce `data` (0 for NVMe reads, which land in
    /// the pinned buffers by DMA, and for DRAM hits). Origin reads count one copy, a lower bound.
    pub copied_bytes: u64,
}

impl PartsRead {
    fn owned(read: CacheRead) -> PartsRead {
        PartsRead {
            bytes: read.bytes,
            seq: read.seq,
            dirty: read.dirty,
            stamp: read.stamp,
            start: read.start,
            copied_bytes: read.data.len() as u64,
            data: ReadData::Owned(read.data),
            from_origin: read.from_origin,
            origin_version: read.origin_version,
            origin_attributes: read.origin_attributes,
        }
    }

    pub fn into_cache_read(self) -> CacheRead {
        let (data, _) = self.data.into_vec();
        CacheRead {
            bytes: self.bytes,
            seq: self.seq,
            dirty: self.dirty,
            stamp: self.stamp,
            start: self.start,
            data,
            from_origin: self.from_origin,
            origin_version: self.origin_version,
            origin_attributes: self.origin_attributes,
        }
    }
}

/// Per-key mutual exclusion among a shard's tasks (no data inside).
#[derive(Default)]
pub(crate) struct KeyLocks {
    held: RefCell<HashSet<ObjectKey>>,
    released: WaitQueue,
}

pub(crate) struct KeyGuard {
    locks: Rc<KeyLocks>,
    key: ObjectKey,
}

impl KeyLocks {
    pub async fn lock(self: &Rc<Self>, key: &ObjectKey) -> KeyGuard {
        while self.held.borrow().contains(key) {
            self.released.wait().await;
        }
        self.held.borrow_mut().insert(key.clone());
        KeyGuard {
            locks: self.clone(),
            key: key.clone(),
        }
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        self.locks.held.borrow_mut().remove(&self.key);
        self.locks.released.wake_all();
    }
}

/// The version of a key on NVMe (its seq), or `None`: what an admission checks is unchanged.
fn stored_seq(store: &Store, key: &ObjectKey) -> Option<u64> {
    store.head(key).map(|meta| meta.seq)
}

pub struct Cache {
    store: Rc<Store>,
    dram: Option<DramTier>,
    admission: Rc<NvmeAdmission>,
    origin: Option<Rc<ShardOrigin>>,
    locks: Rc<KeyLocks>,
    /// Orders readers announced (see `plan`).
    plans: plan::Plans,
}

impl Cache {
    /// A shard's cache over its opened store. Dirty objects found on the device are queued
    /// for upload again.
    pub(crate) fn new(
        store: Rc<Store>,
        dram_bytes: u64,
        admission_bytes_per_second: Option<u64>,
        origins: Option<Arc<Origins>>,
    ) -> Rc<Cache> {
        let origin = origins.map(|origins| {
            Rc::new(ShardOrigin {
                reads: Rc::new(Reads::new(origins.config().metadata_entries_max)),
                writes: WriteBack::default(),
                origins,
            })
        });
        let cache = Rc::new(Cache {
            store,
            dram: DramTier::new(dram_bytes),
            admission: Rc::new(NvmeAdmission::new(admission_bytes_per_second)),
            origin,
            locks: Rc::default(),
            plans: plan::Plans::default(),
        });
        if let Some(origin) = &cache.origin {
            // Staged objects are dirty only to be pinned: they have no origin to go to.
            let mut recovered = cache.store.dirty_objects();
            recovered.retain(|(key, _, _)| !key.is_staged());
            if !recovered.is_empty() {
                log::info!(
                    "shard {}: {} dirty objects found on the device are queued for upload",
                    cache.store.shard(),
                    recovered.len()
                );
            }
            for (key, seq, bytes) in recovered {
                origin.origins.add_recovered_dirty(bytes);
                origin.writes.enqueue(Upload::new(key, seq, bytes));
            }
            let uploader = Uploader {
                store: cache.store.clone(),
                origin: origin.clone(),
                records: Default::default(),
            };
            crate::rt::spawn(crate::origin::writeback::upload_loop(Rc::new(uploader)));
        }
        cache
    }

    pub fn store(&self) -> &Rc<Store> {
        &self.store
    }

    pub fn shard(&self) -> u32 {
        self.store.shard()
    }

    /// The size of the version of `key` stored on this shard's NVMe, if one is.
    pub fn stored_bytes(&self, key: &ObjectKey) -> Option<u64> {
        self.store.version(key).map(|version| version.bytes)
    }

    /// The shard's state and counters: its store's, with its DRAM tier's and admission's.
    pub fn stats(&self) -> crate::store::ShardStats {
        let mut stats = self.store.stats();
        stats.dram = self.dram_stats();
        stats.admission = self.admission_stats();
        stats.plans = self.plans.stats();
        stats.dirty_oldest_ms = self
            .origin
            .as_ref()
            .and_then(|origin| origin.writes.oldest_age())
            .map_or(0, |age| age.as_millis() as u64);
        stats
    }

    /// How origin data was admitted to NVMe.
    pub fn admission_stats(&self) -> AdmissionStats {
        self.admission.stats()
    }

    /// The DRAM tier's counters (all zero without one).
    pub fn dram_stats(&self) -> DramStats {
        self.dram.as_ref().map(DramTier::stats).unwrap_or_default()
    }

    /// A write or delete of `key` leaves any DRAM copy stale: give its memory back.
    fn invalidate(&self, key: &ObjectKey) {
        if let Some(dram) = &self.dram {
            dram.invalidate(key);
        }
    }

    /// The origin of `key`'s bucket, if it has one (staged keys never do).
    fn route(&self, key: &ObjectKey) -> Result<Option<(&ShardOrigin, Arc<Route>)>> {
        let Some(origin) = self.origin.as_deref() else {
            return Ok(None);
        };
        if key.is_staged() {
            return Ok(None);
        }
        Ok(origin
            .origins
            .route(key.bucket())?
            .map(|route| (origin, route)))
    }

    fn chunk_bytes(&self) -> u64 {
        self.store.geometry().chunk_bytes as u64
    }
}
