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
use crate::origin::writeback::{Upload, WriteBack};
use crate::origin::{OriginVersion, Origins, Revalidate, Route, WriteMode};
use crate::rt::sync::WaitQueue;
use crate::store::{
    resolve_range, ByteRange, DirectGet, DirectRead, ObjectKey, ObjectMeta, ObjectRead, Store,
    StoredVersion,
};
use crate::tier::admission::{AdmissionStats, NvmeAdmission};
use crate::tier::dram::DramBytes;
use crate::tier::dram::{DramStats, DramTier, Lookup};
use crate::{Error, ErrorKind, Result};

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
        start: range.start,
        data: memory.narrowed(range.start as usize..range.end as usize),
        from_origin: false,
        copied_bytes: 0,
    }
}

/// Times a read starts over when the origin object changes under it.
const READ_ATTEMPTS_MAX: usize = 3;
/// Chunks read ahead of a sequential reader of a large origin object.
const READAHEAD_CHUNKS: u64 = 2;
/// The most bytes one read through from the origin returns (it is held in memory whole).
pub const ORIGIN_READ_BYTES_MAX: u64 = 1 << 30;

/// An answer to a get.
pub struct CacheRead {
    /// Size of the whole object.
    pub bytes: u64,
    /// The version on NVMe (0 for data straight from the origin).
    pub seq: u64,
    pub dirty: bool,
    /// Offset in the object of the first byte of `data`.
    pub start: u64,
    pub data: Vec<u8>,
    /// Whether the origin was asked for (part of) the data.
    pub from_origin: bool,
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
    /// Not read: the answer would hold this many bytes, more than the caller has room for.
    Sized(u64),
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
    /// Offset in the object of the first byte of `data`.
    pub start: u64,
    pub data: ReadData,
    pub from_origin: bool,
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
            start: read.start,
            copied_bytes: read.data.len() as u64,
            data: ReadData::Owned(read.data),
            from_origin: read.from_origin,
        }
    }

    pub fn into_cache_read(self) -> CacheRead {
        let (data, _) = self.data.into_vec();
        CacheRead {
            bytes: self.bytes,
            seq: self.seq,
            dirty: self.dirty,
            start: self.start,
            data,
            from_origin: self.from_origin,
        }
    }
}

/// A shard's origin side: the shared origins, what this shard knows of them, its write-back.
pub(crate) struct ShardOrigin {
    pub origins: Arc<Origins>,
    pub reads: Rc<Reads>,
    pub writes: WriteBack,
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
    origin: Option<ShardOrigin>,
    locks: Rc<KeyLocks>,
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
        let origin = origins.map(|origins| ShardOrigin {
            reads: Rc::new(Reads::new(origins.config().metadata_entries_max)),
            writes: WriteBack::default(),
            origins,
        });
        let cache = Rc::new(Cache {
            store,
            dram: DramTier::new(dram_bytes),
            admission: Rc::new(NvmeAdmission::new(admission_bytes_per_second)),
            origin,
            locks: Rc::default(),
        });
        if let Some(origin) = &cache.origin {
            let recovered = cache.store.dirty_objects();
            if !recovered.is_empty() {
                log::info!(
                    "shard {}: {} dirty objects found on the device are queued for upload",
                    cache.store.shard(),
                    recovered.len()
                );
            }
            for (key, seq, bytes) in recovered {
                origin.origins.add_recovered_dirty(bytes);
                origin.writes.enqueue(Upload {
                    key,
                    seq,
                    bytes,
                    attempts: 0,
                });
            }
            crate::rt::spawn(crate::origin::writeback::upload_loop(cache.clone()));
        }
        cache
    }

    pub fn store(&self) -> &Rc<Store> {
        &self.store
    }

    pub fn shard(&self) -> u32 {
        self.store.shard()
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

    pub(crate) fn origin(&self) -> Option<&ShardOrigin> {
        self.origin.as_ref()
    }

    /// The origin of `key`'s bucket, if it has one.
    fn route(&self, key: &ObjectKey) -> Result<Option<(&ShardOrigin, Arc<Route>)>> {
        let Some(origin) = &self.origin else {
            return Ok(None);
        };
        Ok(origin
            .origins
            .route(key.bucket())?
            .map(|route| (origin, route)))
    }

    fn chunk_bytes(&self) -> u64 {
        self.store.geometry().chunk_bytes as u64
    }

    // ----- reads -----

    /// The object (whole, or `range`), from NVMe or through it from the origin. `None` when
    /// neither has it.
    pub async fn get(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<CacheRead>> {
        Ok(self
            .get_parts(key, range)
            .await?
            .map(PartsRead::into_cache_read))
    }

    /// Like `get`, but the bytes are left where the read found them (the shard's pinned
    /// buffers, the DRAM tier's copy), so that a caller can copy them once, straight to where
    /// they go. `copied_bytes` says how many bytes the engine copied on the way.
    pub async fn get_parts(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<PartsRead>> {
        Ok(self
            .get_to(key, range, None, None)
            .await?
            .map(|got| match got {
                Got::Parts(read) => read,
                Got::Placed(_) | Got::Sized(_) => unreachable!("nothing placed, no bound"),
            }))
    }

    /// Like `get_parts`, but an answer of more than `bytes_max` bytes read through from the
    /// origin is not read: its size comes back instead, once the origin told it (objects on
    /// NVMe are read whatever their size: callers bound those by the size the index knows).
    /// A server reserves room for an answer before its bytes are held.
    pub async fn get_parts_within(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        bytes_max: u64,
    ) -> Result<Option<Within>> {
        Ok(self
            .get_to(key, range, None, Some(bytes_max))
            .await?
            .map(|got| match got {
                Got::Parts(read) => Within::Read(read),
                Got::Sized(bytes) => Within::Sized(bytes),
                Got::Placed(_) => unreachable!("nothing is placed without a target"),
            }))
    }

    /// Like `get`, into `target` (a same-host client's region): data on NVMe lands there by
    /// the device's DMA with no CPU copy when `Store::get_into` can do it (and is then not
    /// admitted to the DRAM tier: the region is the reader's copy); a DRAM hit, origin data
    /// and reads that are not suitable are copied in once. Nothing is written when the range
    /// does not fit (`Placed::written` is false).
    pub async fn get_into(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: &ExternalBuf,
    ) -> Result<Option<Placed>> {
        // A range known not to fit is refused before anything is read (when the stored copy is
        // the current version without asking the origin).
        let settled = |meta: &ObjectMeta| -> Result<bool> {
            Ok(meta.dirty
                || self
                    .route(key)?
                    .is_none_or(|(_, route)| route.revalidate == Revalidate::Immutable))
        };
        if let Some(meta) = self
            .store
            .head(key)
            .filter(|meta| settled(meta).unwrap_or(false))
        {
            let (start, end) = resolve_range(range, meta.bytes)?;
            if end - start > target.len() as u64 {
                return Ok(Some(Placed {
                    bytes: meta.bytes,
                    seq: meta.seq,
                    dirty: meta.dirty,
                    start,
                    len: end - start,
                    written: false,
                    from_origin: false,
                    copied_bytes: 0,
                }));
            }
        }
        let Some(got) = self.get_to(key, range, Some(target), None).await? else {
            return Ok(None);
        };
        Ok(Some(match got {
            Got::Placed(read) => Placed {
                bytes: read.bytes,
                seq: read.seq,
                dirty: read.dirty,
                start: read.start,
                len: read.len,
                written: true,
                from_origin: false,
                copied_bytes: 0,
            },
            Got::Sized(_) => unreachable!("no bound on a read into a target"),
            Got::Parts(read) => {
                let len = read.data.len();
                let written = len <= target.len();
                if written {
                    let mut offset = 0;
                    for part in read.data.parts() {
                        target.write_at(offset, part);
                        offset += part.len();
                    }
                }
                Placed {
                    bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    start: read.start,
                    len: len as u64,
                    written,
                    from_origin: read.from_origin,
                    copied_bytes: read.copied_bytes + if written { len as u64 } else { 0 },
                }
            }
        }))
    }

    async fn get_to(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: Option<&ExternalBuf>,
        bytes_max: Option<u64>,
    ) -> Result<Option<Got>> {
        let Some((origin, route)) = self.route(key)? else {
            return self.get_stored(key, range, target).await;
        };
        for _ in 0..READ_ATTEMPTS_MAX {
            if let Some(version) = self.store.version(key) {
                let current = current_without_asking(origin, &route, key, version.dirty)
                    || match self
                        .revalidate(origin, &route, key, version.seq, range)
                        .await?
                    {
                        Revalidated::Current => true,
                        Revalidated::Replaced(read) => {
                            return Ok(Some(Got::Parts(PartsRead::owned(read))))
                        }
                        Revalidated::Gone => return Ok(None),
                        Revalidated::ReadThrough => false,
                    };
                if current {
                    if let Some(read) = self.get_stored(key, range, target).await? {
                        return Ok(Some(read));
                    }
                    continue; // deleted or evicted meanwhile
                }
            }
            match self
                .read_through(origin, &route, key, range, bytes_max)
                .await?
            {
                Through::Read(read) => return Ok(Some(Got::Parts(PartsRead::owned(read)))),
                Through::Sized(bytes) => return Ok(Some(Got::Sized(bytes))),
                Through::NotFound => return Ok(None),
                Through::Changed => origin.reads.forget(key),
            }
        }
        Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!(
                "{}/{} kept changing at the origin while it was read",
                key.bucket(),
                key.key()
            ),
        ))
    }

    /// The object (whole, or `range`) from the DRAM tier, when it holds the version NVMe holds
    /// and that version is current without asking the origin; `None` otherwise (and for a range
    /// outside the object), with nothing counted (the object is marked visited on NVMe all the
    /// same, as the read that follows would): the caller then reads with `get_parts`.
    /// `reserve` is asked for room for the answer's payload bytes before anything is counted; a
    /// `None` from it declines too. Never waits, so a server can answer a hit where the request
    /// arrived.
    pub fn get_memory<R>(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        reserve: impl FnOnce(u64) -> Option<R>,
    ) -> Option<(PartsRead, R)> {
        let dram = self.dram.as_ref()?;
        // Marked visited now: a GET reads the object whichever path answers it.
        let version = self.store.version_touched(key)?;
        if let Some((origin, route)) = self.route(key).ok()? {
            if !current_without_asking(origin, &route, key, version.dirty) {
                return None;
            }
        }
        let (start, end) = resolve_range(range, version.bytes).ok()?;
        let reservation = reserve(end - start)?;
        let whole = whole(range, version.bytes);
        let (data, crc) = dram.hit_if_held(key, version.seq, version.bytes, whole)?;
        debug_assert_eq!(
            data.len() as u64,
            version.bytes,
            "the tier holds whole objects"
        );
        Some((from_memory(version, start..end, data, crc), reservation))
    }

    /// The answer to a read of `range` of `version` that the DRAM tier holds (`data`, whose
    /// CRC32C is `crc`).
    fn hit(
        &self,
        key: &ObjectKey,
        version: StoredVersion,
        range: Option<ByteRange>,
        data: DramBytes,
        crc: u32,
    ) -> Result<PartsRead> {
        self.store.touch(key);
        let (start, end) = resolve_range(range, data.len() as u64)?;
        Ok(from_memory(version, start..end, data, crc))
    }

    /// The object from the DRAM tier, or from NVMe (filling the DRAM tier as its policy asks;
    /// a read into a target is served by a DRAM hit but fills nothing).
    async fn get_stored(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: Option<&ExternalBuf>,
    ) -> Result<Option<Got>> {
        if let (Some(dram), Some(version)) = (&self.dram, self.store.version(key)) {
            let whole = target.is_none() && whole(range, version.bytes);
            match dram.lookup(key, version.seq, version.bytes, whole) {
                Lookup::Hit(data, crc) => {
                    return self
                        .hit(key, version, range, data, crc)
                        .map(|read| Some(Got::Parts(read)));
                }
                Lookup::Fill => {
                    let Some(read) = self.store.get(key, None).await? else {
                        return Ok(None);
                    };
                    // Two copies: gathering the parts, and the DRAM tier's own.
                    let data = read.to_vec();
                    dram.fill(key, read.seq, &data, read.crc());
                    let bytes = data.len() as u64;
                    let (start, end) = resolve_range(range, bytes)?;
                    return Ok(Some(Got::Parts(PartsRead {
                        bytes,
                        seq: read.seq,
                        dirty: read.dirty,
                        start,
                        data: ReadData::Owned(data).narrowed(start as usize..end as usize),
                        from_origin: false,
                        copied_bytes: 2 * bytes,
                    })));
                }
                Lookup::Pass => {}
            }
        }
        if let Some(target) = target {
            match self.store.get_into(key, range, target).await? {
                DirectGet::Placed(read) => return Ok(Some(Got::Placed(read))),
                DirectGet::Absent => return Ok(None),
                DirectGet::Unsuitable => {}
            }
        }
        Ok(self.store.get(key, range).await?.map(|read| {
            Got::Parts(PartsRead {
                bytes: read.bytes,
                seq: read.seq,
                dirty: read.dirty,
                start: read.start,
                from_origin: false,
                copied_bytes: 0,
                data: ReadData::Store(read),
            })
        }))
    }

    /// Check a clean whole-object copy (version `seq` on NVMe) whose TTL ran out. Up to a
    /// chunk: a conditional GET with the cached ETag (304 keeps the copy, 200 replaces it).
    /// Larger (written through this node): a HEAD compared with the ETag the upload got.
    async fn revalidate(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        seq: u64,
        range: Option<ByteRange>,
    ) -> Result<Revalidated> {
        let chunk_bytes = self.chunk_bytes();
        let seen = origin.reads.last_seen(key);
        let path = route.path(key.key())?;
        let origins = origin.origins.clone();
        // What the origin says is remembered only if no write or delete of the key began
        // meanwhile (it may predate one).
        let watch = origin.reads.watch(key);
        if self
            .store
            .head(key)
            .is_some_and(|meta| meta.bytes > chunk_bytes)
        {
            let found = origins
                .run(remote::head(origins.clone(), route.clone(), path))
                .await?;
            let same = match (&found, &seen) {
                (Some(found), Some(seen)) => found.etag.is_some() && *found == *seen,
                _ => false,
            };
            if same && watch.unchanged() {
                origin.reads.confirm(key);
                return Ok(Revalidated::Current);
            }
            self.drop_copy(key, seq).await?;
            return Ok(match found {
                Some(_) => Revalidated::ReadThrough,
                None => {
                    origin.reads.forget(key);
                    Revalidated::Gone
                }
            });
        }
        let condition = match seen.and_then(|seen| seen.etag) {
            Some(etag) => Condition::IfNoneMatch(etag),
            None => Condition::None,
        };
        let fetched = origins
            .run(remote::fetch(
                origins.clone(),
                route.clone(),
                path,
                None,
                chunk_bytes,
                condition,
            ))
            .await?;
        match fetched {
            Fetch::NotModified => {
                origin.reads.confirm(key);
                Ok(Revalidated::Current)
            }
            Fetch::NotFound => {
                origin.reads.forget(key);
                self.drop_copy(key, seq).await?;
                Ok(Revalidated::Gone)
            }
            Fetch::Changed => Ok(Revalidated::ReadThrough),
            Fetch::Data {
                version,
                start: _,
                data,
            } => {
                if version.bytes > chunk_bytes {
                    if watch.unchanged() {
                        origin.reads.remember(key, version);
                    }
                    self.drop_copy(key, seq).await?;
                    return Ok(Revalidated::ReadThrough);
                }
                let read = answer(&version, 0, &data, range)?;
                let _guard = self.locks.lock(key).await;
                if stored_seq(&self.store, key) == Some(seq) && watch.unchanged() {
                    origin.reads.remember(key, version);
                    self.store.put(key.clone(), &data, false).await?;
                }
                Ok(Revalidated::Replaced(read))
            }
        }
    }

    /// Delete the copy of `key` if it is still version `seq` (and clean): an origin read found
    /// it outdated, and no write has replaced it since.
    async fn drop_copy(&self, key: &ObjectKey, seq: u64) -> Result<()> {
        let _guard = self.locks.lock(key).await;
        let unchanged = self
            .store
            .head(key)
            .is_some_and(|meta| meta.seq == seq && !meta.dirty);
        if unchanged {
            self.store.delete(key.clone()).await?;
        }
        Ok(())
    }

    /// Read from the origin what NVMe does not hold, admitting it as it arrives.
    async fn read_through(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        range: Option<ByteRange>,
        bytes_max: Option<u64>,
    ) -> Result<Through> {
        let chunk_bytes = self.chunk_bytes();
        let mut discovered = None;
        let version = match origin.reads.fresh(key, route.revalidate) {
            Some(version) => version,
            None => {
                // The first read of an unknown object: its first chunk (the whole object when
                // small), which also tells its size and ETag.
                let fetched = self.fetch_chunk(origin, route, key, DISCOVER, None).await?;
                match &*fetched {
                    Fetch::Data { version, data, .. } => {
                        let (start, end) = resolve_range(range, version.bytes)?;
                        if bytes_max.is_some_and(|bytes_max| end - start > bytes_max) {
                            return Ok(Through::Sized(end - start));
                        }
                        if version.bytes <= chunk_bytes || data_covers(range, data.len() as u64) {
                            return Ok(Through::Read(answer(version, 0, data, range)?));
                        }
                        let version = version.clone();
                        discovered = Some(fetched);
                        version
                    }
                    Fetch::NotFound => return Ok(Through::NotFound),
                    Fetch::Changed | Fetch::NotModified => return Ok(Through::Changed),
                }
            }
        };
        let (start, end) = resolve_range(range, version.bytes)?;
        if bytes_max.is_some_and(|bytes_max| end - start > bytes_max) {
            return Ok(Through::Sized(end - start));
        }
        if end - start > ORIGIN_READ_BYTES_MAX {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "{} bytes of {}/{} asked for at once; read at most {ORIGIN_READ_BYTES_MAX} bytes per request (use ranges)",
                    end - start,
                    key.bucket(),
                    key.key()
                ),
            ));
        }
        if start == end {
            return Ok(Through::Read(CacheRead {
                bytes: version.bytes,
                seq: 0,
                dirty: false,
                start,
                data: Vec::new(),
                from_origin: false,
            }));
        }
        if version.bytes <= chunk_bytes {
            let fetched = self
                .fetch_chunk(origin, route, key, 0, Some(&version))
                .await?;
            return Ok(match &*fetched {
                Fetch::Data {
                    version: fetched_version,
                    data,
                    ..
                } if *fetched_version == version => {
                    Through::Read(answer(&version, 0, data, range)?)
                }
                Fetch::NotFound => Through::NotFound,
                _ => Through::Changed,
            });
        }
        let first = start / chunk_bytes;
        let last = (end - 1) / chunk_bytes;
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut from_origin = false;
        for chunk in first..=last {
            let chunk_start = chunk * chunk_bytes;
            let chunk_end = (chunk_start + chunk_bytes).min(version.bytes);
            let wanted = start.max(chunk_start)..end.min(chunk_end);
            let chunk_key = chunk_key(key, &version, chunk);
            let first_chunk = if chunk == 0 { discovered.take() } else { None };
            if let (Some(chunk_key), None) = (&chunk_key, &first_chunk) {
                let inner = ByteRange {
                    start: wanted.start - chunk_start,
                    end: Some(wanted.end - chunk_start),
                };
                if let Some(read) = self.store.get(chunk_key, Some(inner)).await? {
                    data.extend_from_slice(&read.to_vec());
                    continue;
                }
            }
            from_origin = true;
            let fetched = match first_chunk {
                Some(fetched) => fetched,
                None => {
                    self.fetch_chunk(origin, route, key, chunk, Some(&version))
                        .await?
                }
            };
            match &*fetched {
                Fetch::Data {
                    version: fetched_version,
                    start: fetched_start,
                    data: fetched_data,
                } if *fetched_version == version => {
                    let covered = *fetched_start <= wanted.start
                        && wanted.end <= fetched_start + fetched_data.len() as u64;
                    if !covered {
                        return Err(Error::new(
                            ErrorKind::OriginUnavailable,
                            format!(
                                "origin {} returned a short chunk {chunk} of {}/{}",
                                route.url,
                                key.bucket(),
                                key.key()
                            ),
                        ));
                    }
                    let offset = (wanted.start - fetched_start) as usize;
                    let length = (wanted.end - wanted.start) as usize;
                    data.extend_from_slice(&fetched_data[offset..offset + length]);
                }
                Fetch::NotFound => return Ok(Through::NotFound),
                // Another version than the one this read is pinned to: start over.
                _ => return Ok(Through::Changed),
            }
        }
        if origin.reads.note_sequential(key, first, last) {
            self.read_ahead(origin, route, key, &version, last);
        }
        Ok(Through::Read(CacheRead {
            bytes: version.bytes,
            seq: 0,
            dirty: false,
            start,
            data,
            from_origin,
        }))
    }

    /// Start fetching the chunks after `last` for a sequential reader, unless cached or in
    /// flight.
    fn read_ahead(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        version: &OriginVersion,
        last: u64,
    ) {
        let chunks = version.bytes.div_ceil(self.chunk_bytes());
        for chunk in last + 1..(last + 1 + READAHEAD_CHUNKS).min(chunks) {
            let Some(chunk_key) = chunk_key(key, version, chunk) else {
                return; // nowhere to keep it
            };
            if self.store.head(&chunk_key).is_some()
                || origin.reads.in_flight(&(key.clone(), chunk))
            {
                continue;
            }
            let fetch = self.start_fetch(origin, route, key, chunk, Some(version));
            crate::rt::spawn(async move {
                let _ = fetch.await;
            });
        }
    }

    async fn fetch_chunk(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> Result<Rc<Fetch>> {
        self.start_fetch(origin, route, key, chunk, version).await
    }

    /// The coalesced origin read of `chunk` of `key` (`DISCOVER`: its first chunk, version
    /// unknown), admitted to the store when it arrives.
    fn start_fetch(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> impl std::future::Future<Output = Result<Rc<Fetch>>> + 'static {
        let chunk_bytes = self.chunk_bytes();
        let origins = origin.origins.clone();
        let reads = origin.reads.clone();
        let store = self.store.clone();
        let locks = self.locks.clone();
        let admission = self.admission.clone();
        admission.record_miss(key, store.object_count());
        let path = route.path(key.key());
        let route = route.clone();
        let key = key.clone();
        let version = version.cloned();
        // What the key holds now, and whether it is written or deleted from now on: a flight's
        // data is admitted only if it still holds that and nothing changed it.
        let seen_seq = stored_seq(&store, &key);
        let watch = reads.watch(&key);
        async move {
            let path = path?;
            let (range, condition) = match &version {
                None => (None, Condition::None),
                Some(version) => {
                    let etag = version
                        .etag
                        .clone()
                        .map_or(Condition::None, Condition::IfMatch);
                    if version.bytes <= chunk_bytes {
                        (None, etag)
                    } else {
                        let start = chunk * chunk_bytes;
                        let end = (start + chunk_bytes).min(version.bytes);
                        (Some(start..end), etag)
                    }
                }
            };
            let fetch = move || {
                origins.run(remote::fetch(
                    origins.clone(),
                    route,
                    path,
                    range,
                    chunk_bytes,
                    condition,
                ))
            };
            let admitted_reads = reads.clone();
            let admitted_key = key.clone();
            let flight_watch = watch.clone();
            let admit = move |fetched: Rc<Fetch>| async move {
                let admitting = Admission {
                    store: &store,
                    reads: &admitted_reads,
                    locks: &locks,
                    admission: &admission,
                    key: &admitted_key,
                    seen_seq,
                    watch: &watch,
                    chunk_bytes,
                };
                admitting.admit(&fetched).await;
            };
            reads
                .coalesced((key, chunk), flight_watch, fetch, admit)
                .await
        }
    }

    /// The object's metadata: from NVMe, else from the origin (HEAD, remembered for the
    /// metadata TTL).
    pub async fn head(&self, key: &ObjectKey) -> Result<Option<ObjectMeta>> {
        if let Some(meta) = self.store.head(key) {
            return Ok(Some(meta));
        }
        let Some((origin, route)) = self.route(key)? else {
            return Ok(None);
        };
        let metadata_ttl = Revalidate::Ttl(origin.origins.config().metadata_ttl);
        let version = match origin.reads.fresh(key, metadata_ttl) {
            Some(version) => Some(version),
            None => {
                let path = route.path(key.key())?;
                let origins = origin.origins.clone();
                let watch = origin.reads.watch(key);
                let found = origins
                    .run(remote::head(origins.clone(), route.clone(), path))
                    .await?;
                // What a HEAD racing a write or delete saw may be older than it: not kept.
                match &found {
                    Some(version) if watch.unchanged() => {
                        origin.reads.remember(key, version.clone())
                    }
                    _ => origin.reads.forget(key),
                }
                found
            }
        };
        Ok(version.map(|version| ObjectMeta {
            bucket: key.bucket().to_string(),
            key: key.key().to_string(),
            bytes: version.bytes,
            seq: 0,
            dirty: false,
        }))
    }

    /// Read the whole object through into the cache a chunk at a time (memory bounded by a
    /// chunk); returns its size, or `None` when neither NVMe nor the origin has it.
    pub async fn warm(&self, key: &ObjectKey) -> Result<Option<u64>> {
        let Some(meta) = self.head(key).await? else {
            return Ok(None);
        };
        let chunk_bytes = self.chunk_bytes();
        let mut start = 0;
        loop {
            let range = ByteRange {
                start,
                end: Some(start + chunk_bytes),
            };
            if self.get(key, Some(range)).await?.is_none() {
                return Ok(None);
            }
            start += chunk_bytes;
            if start >= meta.bytes {
                return Ok(Some(meta.bytes));
            }
        }
    }

    // ----- writes -----

    /// Store `data` as `key` by the bucket's write mode: NVMe only (no origin), write-back
    /// (dirty, acknowledged once durable on NVMe), write-through (acknowledged once the origin
    /// has it), or refused (read-only).
    pub async fn put(&self, key: ObjectKey, data: Vec<u8>) -> Result<ObjectMeta> {
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.put(key, &data, false).await;
        };
        // From now until the answer, origin reads of the key are not admitted.
        let _change = origin.reads.change(&key);
        let path = route.path(key.key())?;
        if route.write == WriteMode::Back {
            origin.origins.check_failed_room()?;
            // Refused now, not after the acknowledgement, what the origin is known not to
            // be able to hold (a folder origin's file where a folder must go, say).
            if route.url.starts_with("file://") {
                let (checked, name) = (route.clone(), key.key().to_string());
                origin
                    .origins
                    .run(async move { remote::check_nameable(&checked, &name) })
                    .await?;
            }
        }
        match route.write {
            WriteMode::ReadOnly => Err(read_only(&key, &route)),
            WriteMode::Through => {
                let _guard = self.locks.lock(&key).await;
                let bytes = data.len() as u64;
                let data = Bytes::from(data);
                let origins = origin.origins.clone();
                let etag = if bytes > origins.config().multipart_threshold_bytes {
                    put_multipart_from_memory(&origins, &route, path, data.clone()).await?
                } else {
                    origins
                        .run(remote::put(
                            origins.clone(),
                            route.clone(),
                            path,
                            data.clone(),
                        ))
                        .await?
                };
                match self.store.put(key.clone(), &data, false).await {
                    Ok(meta) => {
                        origin.reads.remember(&key, OriginVersion { bytes, etag });
                        Ok(meta)
                    }
                    Err(error) => {
                        // The origin has the object: it is written. The old copy must not
                        // outlive it here.
                        log::warn!(
                            "{}/{} is at the origin but could not be cached: {error}",
                            key.bucket(),
                            key.key()
                        );
                        origin.reads.forget(&key);
                        self.store.delete(key.clone()).await?;
                        Ok(ObjectMeta {
                            bucket: key.bucket().to_string(),
                            key: key.key().to_string(),
                            bytes,
                            seq: 0,
                            dirty: false,
                        })
                    }
                }
            }
            WriteMode::Back => {
                let bytes = data.len() as u64;
                origin.origins.reserve_dirty(bytes).await?;
                let _guard = self.locks.lock(&key).await;
                match self.store.put(key.clone(), &data, true).await {
                    Ok(meta) => {
                        self.forget_refused(origin, &key);
                        origin.writes.enqueue(Upload {
                            key,
                            seq: meta.seq,
                            bytes,
                            attempts: 0,
                        });
                        Ok(meta)
                    }
                    Err(error) => {
                        origin.origins.release_dirty(bytes);
                        Err(error)
                    }
                }
            }
        }
    }

    /// Delete `key` here and at its origin; returns whether either had it.
    pub async fn delete(&self, key: ObjectKey) -> Result<bool> {
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.delete(key).await;
        };
        // From now until the answer, origin reads of the key are not admitted.
        let _change = origin.reads.change(&key);
        if route.write == WriteMode::ReadOnly {
            return Err(read_only(&key, &route));
        }
        let path = route.path(key.key())?;
        let at_origin = match self.head(&key).await? {
            Some(meta) => !meta.dirty || meta.seq == 0,
            None => false,
        };
        let _guard = self.locks.lock(&key).await;
        let stored = self.store.delete(key.clone()).await?;
        self.forget_refused(origin, &key);
        origin.reads.forget(&key);
        // An upload in flight would bring the object back at the origin after the delete.
        origin.writes.idle(&key).await;
        let origins = origin.origins.clone();
        origins
            .run(remote::delete(origins.clone(), route.clone(), path))
            .await?;
        Ok(stored || at_origin)
    }

    /// A refused version of `key` is superseded (a newer write or a delete): it stops counting.
    fn forget_refused(&self, origin: &ShardOrigin, key: &ObjectKey) {
        if let Some(failed) = origin.writes.clear_failed(key) {
            origin.origins.forget_failed(failed.bytes);
        }
    }

    /// Uploads the origin refused under `prefix` (every bucket when `None`): at most `limit`
    /// of them, and how many there are.
    pub fn refused_uploads(
        &self,
        prefix: Option<&ObjectKey>,
        limit: usize,
    ) -> (Vec<crate::origin::writeback::FailedUpload>, usize) {
        match (&self.origin, prefix) {
            (None, _) => (Vec::new(), 0),
            (Some(origin), Some(prefix)) => origin.writes.failed_under(prefix, limit),
            (Some(origin), None) => origin.writes.failed_all(limit),
        }
    }

    /// Queue the refused uploads under `prefix` (every bucket when `None`) once more; returns
    /// how many.
    pub fn retry_refused(&self, prefix: Option<&ObjectKey>) -> usize {
        self.origin.as_ref().map_or(0, |origin| {
            origin.writes.retry_failed(prefix, &origin.origins)
        })
    }

    /// Dirty keys under `prefix` not yet at the origin (what FLUSH waits for).
    pub fn pending_under(&self, prefix: &ObjectKey) -> usize {
        self.origin
            .as_ref()
            .map_or(0, |origin| origin.writes.pending_under(prefix))
    }

    /// Dirty keys not yet at the origin, all buckets.
    pub fn pending_count(&self) -> usize {
        self.origin
            .as_ref()
            .map_or(0, |origin| origin.writes.pending_count())
    }

    /// Dirty objects of this shard under `prefix`, for LIST's view of what is not at the
    /// origin yet.
    pub fn dirty_listing(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
    ) -> Vec<ObjectMeta> {
        let Some(origin) = &self.origin else {
            return Vec::new();
        };
        origin
            .writes
            .pending_keys(prefix, start_after, limit, |key| self.store.head(key))
    }
}

/// What checking a stale whole copy found.
enum Revalidated {
    Current,
    Replaced(CacheRead),
    Gone,
    /// The copy is gone or outdated: read through from the origin.
    ReadThrough,
}

enum Through {
    Read(CacheRead),
    /// Not read: more bytes than the caller has room for.
    Sized(u64),
    NotFound,
    /// The origin object changed during the read: start over.
    Changed,
}

fn read_only(key: &ObjectKey, route: &Route) -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "bucket {} is read-only (origin {})",
            key.bucket(),
            route.url
        ),
    )
}

/// The chunk key of a large origin object's chunk; `None` when the version has no ETag (two
/// versions of one size could not be told apart) or the key is too long for the suffix.
fn chunk_key(key: &ObjectKey, version: &OriginVersion, chunk: u64) -> Option<ObjectKey> {
    version.etag.as_ref()?;
    key.origin_chunk(version_tag(version), chunk)
}

/// Whether data read from the start of an object covers `range`.
fn data_covers(range: Option<ByteRange>, available: u64) -> bool {
    range.is_some_and(|range| range.end.is_some_and(|end| end <= available))
}

/// The part of `data` (the object's bytes from `data_start`) that `range` asks for; an error
/// when `data` does not hold all of it.
fn answer(
    version: &OriginVersion,
    data_start: u64,
    data: &[u8],
    range: Option<ByteRange>,
) -> Result<CacheRead> {
    let (start, end) = resolve_range(range, version.bytes)?;
    let data_end = data_start + data.len() as u64;
    if start < data_start || end > data_end {
        return Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!("the origin returned bytes {data_start}-{data_end}, not {start}-{end}"),
        ));
    }
    let slice = &data[(start - data_start) as usize..(end - data_start) as usize];
    Ok(CacheRead {
        bytes: version.bytes,
        seq: 0,
        dirty: false,
        start,
        data: slice.to_vec(),
        from_origin: true,
    })
}

/// Putting what an origin read returned into the store.
struct Admission<'a> {
    store: &'a Store,
    reads: &'a Reads,
    locks: &'a Rc<KeyLocks>,
    admission: &'a NvmeAdmission,
    key: &'a ObjectKey,
    /// The key's version on NVMe when the origin read started.
    seen_seq: Option<u64>,
    /// Whether the key was written or deleted since the origin read started.
    watch: &'a Watch,
    chunk_bytes: u64,
}

impl Admission<'_> {
    /// A small object whole under its key, a chunk of a large one under its chunk key; only if
    /// no write or delete of the key began since the read started (else the bytes may predate
    /// an acknowledged write, and neither they nor their version are kept). A failed admission
    /// is logged; the readers already have their data.
    async fn admit(&self, fetched: &Fetch) {
        if !self.watch.unchanged() {
            return;
        }
        let Fetch::Data {
            version,
            start,
            data,
        } = fetched
        else {
            if matches!(fetched, Fetch::NotFound | Fetch::Changed) {
                self.reads.forget(self.key);
            }
            return;
        };
        if !self.admission.admit(
            self.key,
            data.len() as u64,
            self.store.has_room(data.len() as u64),
        ) {
            self.reads.remember(self.key, version.clone());
            return;
        }
        let outcome = if version.bytes <= self.chunk_bytes {
            let _guard = self.locks.lock(self.key).await;
            if stored_seq(self.store, self.key) != self.seen_seq || !self.watch.unchanged() {
                return; // written, deleted or admitted since: this data is not the newest
            }
            self.reads.remember(self.key, version.clone());
            self.store
                .put(self.key.clone(), data, false)
                .await
                .map(|_| ())
        } else {
            self.reads.remember(self.key, version.clone());
            let chunk = start / self.chunk_bytes;
            match chunk_key(self.key, version, chunk) {
                Some(chunk_key) if start % self.chunk_bytes == 0 => {
                    self.store.put(chunk_key, data, false).await.map(|_| ())
                }
                _ => Ok(()),
            }
        };
        if let Err(error) = outcome {
            log::warn!(
                "could not cache {}/{} from the origin: {error}",
                self.key.bucket(),
                self.key.key()
            );
        }
    }
}

/// Upload `data` in parts (write-through of a large object).
async fn put_multipart_from_memory(
    origins: &Arc<Origins>,
    route: &Arc<Route>,
    path: object_store::path::Path,
    data: Bytes,
) -> Result<Option<String>> {
    let part_bytes = origins.config().part_bytes as usize;
    let mut upload = origins
        .run(remote::start_multipart(
            origins.clone(),
            route.clone(),
            path,
        ))
        .await?;
    for start in (0..data.len()).step_by(part_bytes) {
        let part = data.slice(start..(start + part_bytes).min(data.len()));
        upload = origins
            .run(remote::put_part(
                origins.clone(),
                route.clone(),
                upload,
                part,
            ))
            .await?;
    }
    origins
        .run(remote::finish_multipart(
            origins.clone(),
            route.clone(),
            upload,
        ))
        .await
}
