//! One shard's store: its regions on every device, the log written into them, the index of what
//! they hold, and the read and write paths. Everything here runs on the shard's own thread.
//!
//! - `space`: which region is open for appends, which are sealed (oldest first) and free; opening
//!   regions and reclaiming the oldest one.
//! - `commit`: group commit (many writes, one fdatasync, then every acknowledgement).
//! - `scan` and `recovery`: reading regions back and rebuilding the index.
//! - `index`: (bucket, key) → newest complete version.

mod checkpoint;
mod commit;
pub mod index;
mod read;
mod recovery;
mod scan;
mod space;
mod stream;
mod write;

pub use checkpoint::{CheckpointPolicy, CHECKPOINT_EVERY_REGIONS_DEFAULT};
pub use read::AttributesWanted;
pub use stream::{PutStream, StreamedChunk};

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Range;

use crate::attributes::Attributes;
use crate::buf::{align_up, Arena, ArenaInfo, ExternalBuf, IoBuf};
use crate::format::{data_checksums, EntryHeader, EntryKind, BLOCK_BYTES, ENTRY_FLAG_DIRTY};
use crate::rt::op::{read_at, read_at_external, read_vectored_at, sync_data, write_at, FileRef};
use crate::rt::sync::{Section, WaitQueue};
use crate::stamp::{Md5Tag, Stamp};
use crate::{Error, ErrorKind, Result};

use commit::{Commit, CommitStep};
use index::{Chunks, Index, Location, ObjectRecord, RECORD_FLAG_ATTRIBUTES, RECORD_FLAG_DIRTY};
pub use index::{ObjectKey, ObjectMeta, StoredVersion};

/// The geometry every shard of a store shares (from the superblock).
#[derive(Clone, Debug)]
pub struct Geometry {
    pub region_bytes: u64,
    pub chunk_bytes: u32,
    pub crc_block_bytes: u32,
    pub set_uuid: [u8; 16],
}

/// Where one of this shard's regions lies.
#[derive(Clone, Copy, Debug)]
pub struct RegionPlace {
    pub file: FileRef,
    pub device: u32,
    /// The region's index on its device.
    pub region_index: u32,
    /// Byte offset of the region on its device.
    pub offset: u64,
}

#[derive(Clone, Debug, Default)]
struct RegionState {
    /// The sequence of the header it was last opened under; 0 while free.
    region_seq: u64,
    /// Reads in flight; a region is not reused until they finish.
    readers: u32,
    /// Offsets of writes placed in the region and not yet completed. An entry is acknowledged
    /// only once every write placed before it has completed, so that the log on the device has
    /// no hole before any acknowledged entry (recovery stops at the first hole).
    writes_in_flight: BTreeSet<u64>,
    /// Chunks of streamed puts in progress held here: reclaim leaves the region until they end
    /// (their bytes cannot be written again).
    pinned: u32,
}

/// Whether an operation makes a new version of its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Versioned {
    Yes,
    No,
}

/// A byte range of an object: `start` up to `end` (exclusive; `None` = to the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: Option<u64>,
}

/// Part of an object's data, in a shard's buffer.
pub struct ReadPart {
    buf: IoBuf,
    start: usize,
    len: usize,
    /// The CRC32C of exactly `bytes()`, when the checked pieces give it without reading the
    /// bytes again (the part is whole pieces, or the whole chunk).
    crc: Option<u32>,
}

impl ReadPart {
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[self.start..self.start + self.len]
    }

    /// The CRC32C of `bytes()`, if known without reading them.
    pub fn crc(&self) -> Option<u32> {
        self.crc
    }
}

/// The answer to a get: the object's size and version and the requested bytes, in parts.
pub struct ObjectRead {
    /// Size of the whole object.
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    pub stamp: Stamp,
    /// Offset in the object of the first byte returned.
    pub start: u64,
    pub parts: Vec<ReadPart>,
}

impl ObjectRead {
    pub fn meta(&self, key: &ObjectKey) -> ObjectMeta {
        ObjectMeta {
            bucket: key.bucket().to_string(),
            key: key.key().to_string(),
            bytes: self.bytes,
            seq: self.seq,
            dirty: self.dirty,
            stamp: self.stamp,
        }
    }

    pub fn len(&self) -> usize {
        self.parts.iter().map(|part| part.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut data = Vec::with_capacity(self.len());
        for part in &self.parts {
            data.extend_from_slice(part.bytes());
        }
        data
    }

    /// The CRC32C of the bytes returned, joined from the checked pieces' CRCs when every part
    /// knows its own (reads of whole pieces: whole objects, aligned ranges); else computed.
    pub fn crc(&self) -> u32 {
        let mut joined = hydrant_crc::combine::Joined::new();
        for part in &self.parts {
            let crc = part
                .crc()
                .unwrap_or_else(|| hydrant_crc::crc32c(part.bytes()));
            joined.push(crc, part.len as u64);
        }
        joined.crc()
    }
}

/// Counters of one shard since it was opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub puts: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub deletes: u64,
    pub bytes_written: u64,
    /// Bytes placed in the log for entries of every kind (chunks, markers, reclaim's copies),
    /// headers and padding included: what the device takes for what is stored.
    pub log_bytes: u64,
    pub bytes_read: u64,
    pub evictions: u64,
    pub relocations: u64,
    pub reclaims: u64,
    pub checksum_errors: u64,
    /// Header blocks read for a version's attributes (those not found in the shard's cache).
    pub attribute_reads: u64,
    /// Entries written again because reclaim took their region before their operation finished.
    pub rewrites: u64,
    /// Failed puts and deletes whose entries were voided (so that recovery ignores them).
    pub voided: u64,
    /// Found while recovering: entry headers that failed their checksum and were skipped.
    pub damaged_headers: u64,
    /// Found while recovering: the tail region ended in an entry that was not fully written.
    pub torn_tails: u64,
    /// Found while recovering: versions with an entry in the tail region whose data did not
    /// check out and sound entries after it, voided.
    pub damaged_voided: u64,
    /// Recovery loaded an index checkpoint (1) or scanned every region (0).
    pub recovered_from_checkpoint: u64,
    /// Log regions recovery scanned (all of them without a checkpoint).
    pub regions_scanned: u64,
    /// Found while recovering: a checkpoint whose parts were all present but did not check out.
    pub checkpoints_damaged: u64,
    /// Index checkpoints written since the store was opened.
    pub checkpoints: u64,
    /// Checkpoints not written for want of free regions.
    pub checkpoints_skipped: u64,
    /// Size of the newest checkpoint written.
    pub checkpoint_bytes: u64,
    /// How long the newest checkpoint held the shard's thread to begin (the instant it
    /// records; its encoding is done a piece at a time after).
    pub checkpoint_pause_us: u64,
    /// The most records changed during a checkpoint and saved for it as they were (see
    /// `Index::begin_snapshot`), since the shard opened.
    pub checkpoint_saved_max: u64,
    /// The longest step of the newest checkpoint's walk (encoding one piece), which readers of
    /// the shard may wait for.
    pub checkpoint_step_max_us: u64,
    /// Bytes of puts written from a same-host client's shared memory.
    pub shared_bytes_written: u64,
    /// Of those, bytes copied into the arena first (a chunk whose start is not aligned for
    /// direct I/O, and the last partial block of the others: see `PutStream::write_shared`).
    pub shared_bytes_copied: u64,
}

/// A shard's state, for stats.
#[derive(Clone, Debug, Default)]
pub struct ShardStats {
    pub shard: u32,
    pub objects: u64,
    pub object_bytes: u64,
    pub regions: u64,
    pub regions_free: u64,
    pub region_bytes: u64,
    pub flushes: u64,
    pub counters: Counters,
    pub arena: ArenaInfo,
    /// Whether the shard's ring runs with DEFER_TASKRUN (false: the plain-ring fallback).
    pub ring_defer_taskrun: bool,
    /// The shard's provided receive buffers and multishot receives.
    pub receive: crate::rt::ReceiveStats,
    /// Why the store stopped accepting writes, if it did.
    pub failure: Option<String>,
    /// The shard's DRAM tier in front of this store (filled in by the engine).
    pub dram: crate::tier::dram::DramStats,
    /// Admissions of origin data to this store (filled in by the engine).
    pub admission: crate::tier::admission::AdmissionStats,
    /// Loader-order plans this shard follows (filled in by the engine).
    pub plans: crate::cache::PlanStats,
    /// How long the oldest version waiting for the origin has waited, in milliseconds (0: none
    /// waits; filled in by the engine).
    pub dirty_oldest_ms: u64,
}

/// The operations in progress on one key. Versions are ordered by seq, but operations finish
/// in any order: a put must not be installed over a newer operation that already finished.
#[derive(Clone, Copy, Debug, Default)]
struct PendingKey {
    /// The newest seq started (reclaim does not move a clean version this will supersede).
    newest_started: u64,
    /// The newest seq that finished successfully.
    newest_finished: u64,
    running: u32,
}

/// An entry written for an operation in progress, and the region_seq of the region it went into
/// (which changes if the region is reclaimed before the operation is applied).
struct PlacedEntry {
    location: Location,
    region_seq: u64,
}

impl PlacedEntry {
    fn offset(&self) -> u64 {
        self.location.block as u64 * BLOCK_BYTES as u64
    }
}

/// How many times a get restarts because the version it was reading was replaced midway.
const GET_ATTEMPTS_MAX: usize = 3;

enum VersionRead {
    Read(ObjectRead),
    Absent,
    Replaced,
}

enum DirectVersion {
    Placed(DirectRead),
    Absent,
    Replaced,
    Unsuitable,
}

/// What `Store::get_into` did.
pub enum DirectGet {
    /// The bytes are in the target, checked.
    Placed(DirectRead),
    /// Not stored.
    Absent,
    /// Not readable straight into this target; read it through `get`.
    Unsuitable,
}

/// An object read straight into a caller's memory.
#[derive(Clone, Copy, Debug)]
pub struct DirectRead {
    /// Size of the whole object.
    pub bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    /// Offset in the object of the first byte placed.
    pub start: u64,
    /// Bytes of the range placed at the target's start.
    pub len: u64,
}

/// Chunks of puts one shard writes at once, streamed or same-host (4 of 4 MiB keep a device
/// busy: its bytes in flight are bounded at 16 MiB by default).
const STREAMED_WRITES_MAX: usize = 4;

/// How many times an operation rewrites entries that reclaim took from under it before it
/// gives up with a retriable NoSpace.
const REWRITE_ATTEMPTS_MAX: usize = 3;

/// Free regions kept in reserve: reclaim starts when fewer remain, so that relocating the
/// oldest region's live entries always has somewhere to go.
const FREE_REGIONS_RESERVE: usize = 2;

struct Log {
    open: Option<usize>,
    write_offset: u64,
    /// Regions full of entries, oldest (lowest region_seq) first: reclaim takes the front.
    sealed: VecDeque<usize>,
    free: VecDeque<usize>,
    /// The regions holding the newest complete index checkpoint, in part order.
    checkpoint: Vec<usize>,
    next_region_seq: u64,
}

/// Everything one shard owns on its devices.
pub struct Store {
    shard: u32,
    geometry: Geometry,
    places: Vec<RegionPlace>,
    /// One per device, for flushes.
    files: Vec<FileRef>,
    arena: Arena,
    regions: RefCell<Vec<RegionState>>,
    log: RefCell<Log>,
    index: RefCell<Index>,
    /// Attributes of versions read recently (see `AttributesCache`).
    attributes_cache: RefCell<crate::attributes::AttributesCache>,
    /// Keys whose attributes a read in progress wants (`want_attributes`), with how many.
    attributes_wanted: RefCell<HashMap<ObjectKey, usize>>,
    /// Keys with puts or deletes in progress.
    pending: RefCell<HashMap<ObjectKey, PendingKey>>,
    /// Operations in progress (seq → region_seq of the region holding their first entry):
    /// a checkpoint covers no region an unfinished operation wrote to.
    operations: RefCell<BTreeMap<u64, u64>>,
    checkpoints: checkpoint::Checkpoints,
    next_seq: Cell<u64>,
    commit: Commit,
    /// Orders allocation, region opening and reclaim.
    allocation: Section,
    reclaiming: Cell<bool>,
    /// Woken when a region's readers or writes drain.
    region_idle: WaitQueue,
    /// Chunks of puts being written at once (each is a chunk of memory, a streamed chunk's or
    /// an arena copy: the bound keeps them few however many puts arrive).
    streamed_writes: std::rc::Rc<crate::rt::sync::Semaphore>,
    failure: RefCell<Option<String>>,
    counters: RefCell<Counters>,
    /// Whether every device may be written from a same-host client's memory, which the client
    /// can change during the write (see `device::allows_unstable_writes`); where not, those
    /// bytes are copied first.
    writes_from_client_memory: bool,
}

/// What opening a shard's store needs.
pub struct StoreParts {
    pub shard: u32,
    pub geometry: Geometry,
    pub places: Vec<RegionPlace>,
    pub files: Vec<FileRef>,
    pub arena: Arena,
    pub checkpoints: CheckpointPolicy,
    /// See `Store::writes_from_client_memory`.
    pub writes_from_client_memory: bool,
}

impl Store {
    fn from_parts(parts: StoreParts) -> Store {
        let region_count = parts.places.len();
        assert!(region_count > FREE_REGIONS_RESERVE);
        assert!(parts
            .geometry
            .region_bytes
            .is_multiple_of(BLOCK_BYTES as u64));
        Store {
            shard: parts.shard,
            geometry: parts.geometry,
            places: parts.places,
            files: parts.files,
            arena: parts.arena,
            regions: RefCell::new(vec![RegionState::default(); region_count]),
            log: RefCell::new(Log {
                open: None,
                write_offset: 0,
                sealed: VecDeque::new(),
                free: (0..region_count).collect(),
                checkpoint: Vec::new(),
                next_region_seq: 1,
            }),
            index: RefCell::new(Index::default()),
            attributes_cache: RefCell::default(),
            attributes_wanted: RefCell::default(),
            pending: RefCell::new(HashMap::new()),
            operations: RefCell::new(BTreeMap::new()),
            checkpoints: checkpoint::Checkpoints::new(parts.checkpoints, region_count),
            next_seq: Cell::new(1),
            commit: Commit::new(),
            allocation: Section::default(),
            reclaiming: Cell::new(false),
            region_idle: WaitQueue::new(),
            streamed_writes: std::rc::Rc::new(crate::rt::sync::Semaphore::new(STREAMED_WRITES_MAX)),
            failure: RefCell::new(None),
            counters: RefCell::new(Counters::default()),
            writes_from_client_memory: parts.writes_from_client_memory,
        }
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    fn count(&self, update: impl FnOnce(&mut Counters)) {
        update(&mut self.counters.borrow_mut());
    }

    /// Refuse writes after an I/O error until the store is reopened.
    fn writable(&self) -> Result<()> {
        match &*self.failure.borrow() {
            None => Ok(()),
            Some(reason) => Err(Error::new(
                ErrorKind::StoreFailed,
                format!("shard {} stopped accepting writes after an I/O error ({reason}); reopen the store", self.shard),
            )),
        }
    }

    fn fail(&self, context: String, error: std::io::Error) -> Error {
        let error = Error::io(context, error);
        log::error!(
            "shard {}: {error}; refusing writes until reopened",
            self.shard
        );
        self.failure
            .borrow_mut()
            .get_or_insert_with(|| error.to_string());
        // Tasks waiting for a region to drain re-check `writable` and give up.
        self.region_idle.wake_all();
        error
    }

    fn take_seq(&self) -> u64 {
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        seq
    }

    fn file_of(&self, region: usize) -> FileRef {
        self.places[region].file
    }

    /// Byte offset on its device of block `block` of `region`.
    fn device_offset(&self, region: usize, block: u64) -> u64 {
        self.places[region].offset + block * BLOCK_BYTES as u64
    }

    // ----- reads -----

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Whether `bytes` more can be stored without displacing anything: the live data would
    /// stay under three quarters of the usable space (the rest is headers, padding, copies
    /// not yet reclaimed and room for reclaim to work in).
    pub fn has_room(&self, bytes: u64) -> bool {
        let usable_regions = self.places.len().saturating_sub(FREE_REGIONS_RESERVE) as u64;
        let usable = usable_regions * (self.geometry.region_bytes - BLOCK_BYTES as u64);
        (self.index.borrow().bytes() + bytes) * 4 <= usable * 3
    }

    /// Objects indexed.
    pub fn object_count(&self) -> u64 {
        self.index.borrow().len() as u64
    }

    /// Note a read of `key` served elsewhere (the DRAM tier): it sets the visited bit that
    /// reclaim's SIEVE decision reads, as a read of the store would.
    pub fn touch(&self, key: &ObjectKey) {
        self.index.borrow_mut().set_visited(key, true);
    }

    /// The object's size and version, without reading its data or copying its name.
    pub fn version(&self, key: &ObjectKey) -> Option<StoredVersion> {
        self.index.borrow().get(key).map(|record| StoredVersion {
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
            stamp: record.stamp.into(),
        })
    }

    /// `version`, and the object marked visited (`touch`), in one lookup.
    pub fn version_touched(&self, key: &ObjectKey) -> Option<StoredVersion> {
        self.index
            .borrow_mut()
            .set_visited(key, true)
            .map(|record| StoredVersion {
                bytes: record.bytes,
                seq: record.seq,
                dirty: record.dirty(),
                stamp: record.stamp.into(),
            })
    }

    /// The object's metadata, without reading its data.
    pub fn head(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        self.index
            .borrow()
            .get(key)
            .map(|record| ObjectMeta::of(key, record))
    }

    /// Mark version `seq` of `key` clean (written back to the origin), unpinning it, and make
    /// that durable with a clean marker, so that a restart does not upload it again. Returns
    /// whether that version is the indexed one (nothing is written otherwise).
    ///
    /// The flag is cleared in memory first: reclaim copies an entry with its version's current
    /// state, so no dirty copy is written after the marker and outlives it (markers die with
    /// their region, like tombstones, and every older copy is in an older region).
    pub async fn mark_clean(&self, key: &ObjectKey, seq: u64) -> Result<bool> {
        {
            let mut index = self.index.borrow_mut();
            match index.get_mut(key) {
                Some(record) if record.seq == seq && record.dirty() => {
                    record.flags &= !RECORD_FLAG_DIRTY;
                }
                _ => return Ok(false),
            }
        }
        self.writable()?;
        let header = EntryHeader::marker(
            EntryKind::Clean,
            key.bucket_bytes().to_vec(),
            key.key_bytes().to_vec(),
            seq,
        );
        self.write_operation(key, vec![(header, &[][..])], Versioned::No, |_, _| ())
            .await?;
        Ok(true)
    }

    /// (key, seq, bytes) of every dirty object, for write-back after an open.
    pub fn dirty_objects(&self) -> Vec<(ObjectKey, u64, u64)> {
        self.index.borrow().dirty_objects()
    }

    /// Up to `limit` objects of a bucket whose keys start with a prefix, in key order, after
    /// `start_after`.
    pub fn list(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
    ) -> Vec<ObjectMeta> {
        self.index.borrow().list(prefix, start_after, limit)
    }

    pub fn stats(&self) -> ShardStats {
        let index = self.index.borrow();
        let log = self.log.borrow();
        ShardStats {
            shard: self.shard,
            objects: index.len() as u64,
            object_bytes: index.bytes(),
            regions: self.places.len() as u64,
            regions_free: log.free.len() as u64,
            region_bytes: self.geometry.region_bytes,
            flushes: self.commit.flushes(),
            counters: *self.counters.borrow(),
            arena: self.arena.info(),
            ring_defer_taskrun: crate::rt::current_reactor().info().defer_taskrun,
            receive: crate::rt::current_reactor().receive_stats(),
            failure: self.failure.borrow().clone(),
            dram: Default::default(),
            admission: Default::default(),
            plans: Default::default(),
            dirty_oldest_ms: 0,
        }
    }

    /// Every indexed version, one sorted line each (key, seq, bytes, dirty and attributes
    /// flags, stamp, chunk locations): what tests compare between two recoveries of one store.
    #[doc(hidden)]
    pub fn index_image(&self) -> Vec<String> {
        let index = self.index.borrow();
        let mut lines: Vec<String> = index
            .records()
            .map(|(joined, record)| {
                let key = ObjectKey::from_joined(joined);
                format!(
                    "{}/{:?} seq {} bytes {} flags {} stamp {:?} at {:?}",
                    key.bucket(),
                    key.key_bytes(),
                    record.seq,
                    record.bytes,
                    record.flags & (RECORD_FLAG_DIRTY | RECORD_FLAG_ATTRIBUTES),
                    Stamp::from(record.stamp),
                    record.chunks.as_slice()
                )
            })
            .collect();
        lines.sort_unstable();
        lines
    }
}

/// Resolve a requested range against an object of `bytes`: the end is clamped to the object,
/// a start past the end is an error.
pub(crate) fn resolve_range(range: Option<ByteRange>, bytes: u64) -> Result<(u64, u64)> {
    let Some(range) = range else {
        return Ok((0, bytes));
    };
    let end = range.end.unwrap_or(bytes).min(bytes);
    if range.start > bytes || range.end.is_some_and(|end| end < range.start) {
        return Err(Error::new(
            ErrorKind::InvalidRange,
            format!(
                "range {}-{} is outside an object of {bytes} bytes",
                range.start,
                range.end.map(|end| end.to_string()).unwrap_or_default()
            ),
        ));
    }
    Ok((range.start, end))
}
