//! One shard's store: its regions on every device, the log written into them, the index of what
//! they hold, and the read and write paths. Everything here runs on the shard's own thread.
//!
//! - `space`: which region is open for appends, which are sealed (oldest first) and free; opening
//!   regions and reclaiming the oldest one.
//! - `commit`: group commit (many writes, one fdatasync, then every acknowledgement).
//! - `scan` and `recovery`: reading regions back and rebuilding the index.
//! - `index`: (bucket, key) → newest complete version.

mod commit;
pub mod index;
mod recovery;
mod scan;
mod space;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Range;

use crate::buf::{align_up, Arena, ArenaInfo, ExternalBuf, IoBuf};
use crate::format::{data_checksums, EntryHeader, EntryKind, BLOCK_BYTES, ENTRY_FLAG_DIRTY};
use crate::rt::op::{read_at, read_at_external, read_vectored_at, sync_data, write_at, FileRef};
use crate::rt::sync::{Section, WaitQueue};
use crate::{Error, ErrorKind, Result};

use commit::{Commit, CommitStep};
use index::{Chunks, Index, Location, ObjectRecord, RECORD_FLAG_DIRTY, RECORD_FLAG_VISITED};
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
    pub bytes_read: u64,
    pub evictions: u64,
    pub relocations: u64,
    pub reclaims: u64,
    pub checksum_errors: u64,
    /// Entries written again because reclaim took their region before their operation finished.
    pub rewrites: u64,
    /// Failed puts and deletes whose entries were voided (so that recovery ignores them).
    pub voided: u64,
    /// Found while recovering: entry headers that failed their checksum and were skipped.
    pub damaged_headers: u64,
    /// Found while recovering: the tail region ended in an entry that was not fully written.
    pub torn_tails: u64,
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
    /// Keys with puts or deletes in progress.
    pending: RefCell<HashMap<ObjectKey, PendingKey>>,
    next_seq: Cell<u64>,
    commit: Commit,
    /// Orders allocation, region opening and reclaim.
    allocation: Section,
    reclaiming: Cell<bool>,
    /// Woken when a region's readers or writes drain.
    region_idle: WaitQueue,
    failure: RefCell<Option<String>>,
    counters: RefCell<Counters>,
}

/// What opening a shard's store needs.
pub struct StoreParts {
    pub shard: u32,
    pub geometry: Geometry,
    pub places: Vec<RegionPlace>,
    pub files: Vec<FileRef>,
    pub arena: Arena,
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
                next_region_seq: 1,
            }),
            index: RefCell::new(Index::default()),
            pending: RefCell::new(HashMap::new()),
            next_seq: Cell::new(1),
            commit: Commit::new(),
            allocation: Section::default(),
            reclaiming: Cell::new(false),
            region_idle: WaitQueue::new(),
            failure: RefCell::new(None),
            counters: RefCell::new(Counters::default()),
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
        if let Some(record) = self.index.borrow_mut().get_mut(key) {
            record.flags |= RECORD_FLAG_VISITED;
        }
    }

    /// The object's size and version, without reading its data or copying its name.
    pub fn version(&self, key: &ObjectKey) -> Option<StoredVersion> {
        self.index.borrow().get(key).map(|record| StoredVersion {
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
        })
    }

    /// `version`, and the object marked visited (`touch`), in one lookup.
    pub fn version_touched(&self, key: &ObjectKey) -> Option<StoredVersion> {
        self.index.borrow_mut().get_mut(key).map(|record| {
            record.flags |= RECORD_FLAG_VISITED;
            StoredVersion {
                bytes: record.bytes,
                seq: record.seq,
                dirty: record.dirty(),
            }
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
        let header = EntryHeader {
            kind: EntryKind::Clean,
            flags: 0,
            chunk_index: 0,
            chunk_count: 0,
            data_bytes: 0,
            seq: 0,
            region_seq: 0,
            object_bytes: seq,
            etag: Vec::new(),
            bucket: key.bucket_bytes().to_vec(),
            key: key.key_bytes().to_vec(),
            data_crcs: Vec::new(),
        };
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

    /// Read an object, whole or a byte range. `None` when it is not stored.
    pub async fn get(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<ObjectRead>> {
        self.count(|counters| counters.gets += 1);
        // A multi-chunk read restarts when the version it was reading is replaced midway.
        for _ in 0..GET_ATTEMPTS_MAX {
            match self.read_version(key, range).await? {
                VersionRead::Read(read) => {
                    self.count(|counters| {
                        counters.hits += 1;
                        counters.bytes_read += read.len() as u64;
                    });
                    return Ok(Some(read));
                }
                VersionRead::Absent => break,
                VersionRead::Replaced => continue,
            }
        }
        self.count(|counters| counters.misses += 1);
        Ok(None)
    }

    /// Read an object (whole, or `range`) from the device straight into `target`, with no CPU
    /// copy: the device's DMA lands in the caller's memory and the checksums are computed
    /// there. `Unsuitable` when it cannot be done that way (the caller reads through `get`):
    /// the target is not 4 KiB-aligned, the range does not start at a multiple of the checksum
    /// piece, the target has no room for the read rounded up to whole checksummed pieces and
    /// 4 KiB, or the bytes did not match their checksum where they landed (the buffered read
    /// checks again, and only it drops a damaged copy: the target's owner can write there).
    /// Bytes of `target` past the range, up to that rounded end, may be overwritten with the
    /// object's following bytes or the format's zero padding.
    pub async fn get_into(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: &ExternalBuf,
    ) -> Result<DirectGet> {
        for _ in 0..GET_ATTEMPTS_MAX {
            match self.read_version_into(key, range, target).await? {
                DirectVersion::Placed(placed) => {
                    self.count(|counters| {
                        counters.gets += 1;
                        counters.hits += 1;
                        counters.bytes_read += placed.len;
                    });
                    return Ok(DirectGet::Placed(placed));
                }
                DirectVersion::Absent => break,
                DirectVersion::Replaced => continue,
                DirectVersion::Unsuitable => return Ok(DirectGet::Unsuitable),
            }
        }
        self.count(|counters| {
            counters.gets += 1;
            counters.misses += 1;
        });
        Ok(DirectGet::Absent)
    }

    async fn read_version_into(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: &ExternalBuf,
    ) -> Result<DirectVersion> {
        let Some(record) = self.index.borrow().get(key).cloned() else {
            return Ok(DirectVersion::Absent);
        };
        let (start, end) = resolve_range(range, record.bytes)?;
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        let piece_bytes = self.geometry.crc_block_bytes as u64;
        // Pieces are counted from each chunk's start: the read must start at one in its chunk.
        if !target.is_aligned() || !(start % chunk_bytes).is_multiple_of(piece_bytes) {
            return Ok(DirectVersion::Unsuitable);
        }
        let placed = DirectRead {
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
            start,
            len: end - start,
        };
        if start == end {
            return Ok(DirectVersion::Placed(placed));
        }
        // Where the last chunk's read ends, in the target: whole pieces, whole blocks.
        let last = (end - 1) / chunk_bytes;
        let last_start = last * chunk_bytes;
        let last_data = chunk_bytes.min(record.bytes - last_start);
        let last_want = (start.max(last_start) - last_start) as u32..(end - last_start) as u32;
        let last_span = checked_span(last_data as u32, piece_bytes as u32, &last_want);
        let footprint = last_start + align_up(last_span.end as usize) as u64 - start;
        if footprint > target.len() as u64 {
            return Ok(DirectVersion::Unsuitable);
        }
        self.touch(key);
        for chunk in start / chunk_bytes..=last {
            let chunk_start = chunk * chunk_bytes;
            let data_bytes = chunk_bytes.min(record.bytes - chunk_start);
            let want = (start.max(chunk_start) - chunk_start) as u32
                ..(end.min(chunk_start + data_bytes) - chunk_start) as u32;
            let location = self
                .index
                .borrow()
                .get(key)
                .filter(|current| current.seq == record.seq)
                .map(|current| current.chunks.get(chunk as usize));
            let Some(location) = location else {
                return Ok(DirectVersion::Replaced);
            };
            let offset = (chunk_start + want.start as u64 - start) as usize;
            let landed = self
                .read_chunk_into(
                    key,
                    &record,
                    location,
                    chunk as usize,
                    data_bytes as u32,
                    want,
                    target,
                    offset,
                )
                .await?;
            if !landed {
                return Ok(DirectVersion::Unsuitable);
            }
        }
        Ok(DirectVersion::Placed(placed))
    }

    /// Read the checksummed pieces of one chunk that `want` touches into `target` at `offset`
    /// and check them there; `false` when the data does not match (see `get_into`).
    #[allow(clippy::too_many_arguments)]
    async fn read_chunk_into(
        &self,
        key: &ObjectKey,
        record: &ObjectRecord,
        location: Location,
        chunk: usize,
        data_bytes: u32,
        want: Range<u32>,
        target: &ExternalBuf,
        offset: usize,
    ) -> Result<bool> {
        let region = location.region as usize;
        let entry_offset = self.device_offset(region, location.block as u64);
        let file = self.file_of(region);
        let _reader = RegionReader::new(self, region);
        let piece_bytes = self.geometry.crc_block_bytes;
        let Range {
            start: span_start,
            end: span_end,
        } = checked_span(data_bytes, piece_bytes, &want);
        let span_len = align_up((span_end - span_start) as usize);
        // The range starts at a piece (checked by the caller) and the footprint fits; should
        // either not hold, the buffered read serves it.
        let Some(destination) = target
            .slice(offset, span_len)
            .filter(|_| span_start == want.start)
        else {
            return Ok(false);
        };
        let data_offset = entry_offset + (BLOCK_BYTES + span_start as usize) as u64;
        if data_bytes <= piece_bytes {
            let result = read_at_external(file, destination, data_offset).await;
            self.check_read(result, span_len, region)?;
            return Ok(target.crc32c(offset, data_bytes as usize) == location.first_crc);
        }
        let header_buf = if span_start == 0 && target.fixed_slot().is_none() {
            // Header and data are contiguous: one read, the header into the arena. (A
            // registered target is read with READ_FIXED instead, beside the header's read.)
            let (result, header_buf) = read_vectored_at(
                file,
                self.arena.allocate(BLOCK_BYTES),
                destination,
                entry_offset,
            )
            .await;
            self.check_read(result, BLOCK_BYTES + span_len, region)?;
            header_buf
        } else {
            let header_read = crate::rt::spawn(read_at(
                file,
                self.arena.allocate(BLOCK_BYTES),
                entry_offset,
                BLOCK_BYTES,
            ));
            let result = read_at_external(file, destination, data_offset).await;
            let (header_result, header_buf) = header_read.await;
            self.check_read(header_result, BLOCK_BYTES, region)?;
            self.check_read(result, span_len, region)?;
            header_buf
        };
        let header = self.chunk_header(header_buf.as_slice(), key, record, chunk, data_bytes)?;
        let first_piece = (span_start / piece_bytes) as usize;
        let mut piece_offset = 0usize;
        let mut index = first_piece;
        while piece_offset < (span_end - span_start) as usize {
            let len = (piece_bytes as usize).min((span_end - span_start) as usize - piece_offset);
            if target.crc32c(offset + piece_offset, len) != header.data_crcs[index] {
                return Ok(false);
            }
            piece_offset += len;
            index += 1;
        }
        Ok(true)
    }

    /// Read the indexed version of `key`, as long as it stays indexed.
    async fn read_version(&self, key: &ObjectKey, range: Option<ByteRange>) -> Result<VersionRead> {
        let record = {
            let mut index = self.index.borrow_mut();
            match index.get_mut(key) {
                Some(record) => {
                    record.flags |= RECORD_FLAG_VISITED;
                    record.clone()
                }
                None => return Ok(VersionRead::Absent),
            }
        };
        let (start, end) = resolve_range(range, record.bytes)?;
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        let mut parts = Vec::new();
        if start < end {
            for chunk in start / chunk_bytes..=(end - 1) / chunk_bytes {
                let chunk_start = chunk * chunk_bytes;
                let data_bytes = chunk_bytes.min(record.bytes - chunk_start);
                let want = (start.max(chunk_start) - chunk_start) as u32
                    ..(end.min(chunk_start + data_bytes) - chunk_start) as u32;
                // Look later chunks up again: reclaim may have moved them while earlier chunks
                // were read.
                let location = if chunk == start / chunk_bytes {
                    Some(record.chunks.get(chunk as usize))
                } else {
                    self.index
                        .borrow()
                        .get(key)
                        .filter(|current| current.seq == record.seq)
                        .map(|current| current.chunks.get(chunk as usize))
                };
                let Some(location) = location else {
                    return Ok(VersionRead::Replaced);
                };
                let read = self.read_chunk(
                    key,
                    &record,
                    location,
                    chunk as usize,
                    data_bytes as u32,
                    want,
                );
                parts.push(read.await?);
            }
        }
        Ok(VersionRead::Read(ObjectRead {
            bytes: record.bytes,
            seq: record.seq,
            dirty: record.dirty(),
            start,
            parts,
        }))
    }

    /// Read bytes `want` of one chunk and verify them. Small chunks are read without their
    /// header (the index holds their checksum); larger ones with it, and only the checksummed
    /// pieces that `want` touches.
    async fn read_chunk(
        &self,
        key: &ObjectKey,
        record: &ObjectRecord,
        location: Location,
        chunk: usize,
        data_bytes: u32,
        want: Range<u32>,
    ) -> Result<ReadPart> {
        let region = location.region as usize;
        let entry_offset = self.device_offset(region, location.block as u64);
        let file = self.file_of(region);
        let _reader = RegionReader::new(self, region);
        let piece_bytes = self.geometry.crc_block_bytes;
        if data_bytes <= piece_bytes {
            let len = align_up(data_bytes as usize);
            let (result, buf) = read_at(
                file,
                self.arena.allocate(len),
                entry_offset + BLOCK_BYTES as u64,
                len,
            )
            .await;
            self.check_read(result, len, region)?;
            if hydrant_crc::crc32c(&buf.as_slice()[..data_bytes as usize]) != location.first_crc {
                return Err(self.checksum_failed(key, record, chunk, "data"));
            }
            return Ok(ReadPart {
                buf,
                start: want.start as usize,
                len: want.len(),
                crc: (want == (0..data_bytes)).then_some(location.first_crc),
            });
        }
        let Range {
            start: span_start,
            end: span_end,
        } = checked_span(data_bytes, piece_bytes, &want);
        let first_piece = span_start / piece_bytes;
        let span_len = align_up((span_end - span_start) as usize);
        let (header_block, data, data_start) = if first_piece == 0 {
            // Header and data are contiguous: one read.
            let len = BLOCK_BYTES + span_len;
            let (result, buf) = read_at(file, self.arena.allocate(len), entry_offset, len).await;
            self.check_read(result, len, region)?;
            (None, buf, BLOCK_BYTES)
        } else {
            let header_read = crate::rt::spawn(read_at(
                file,
                self.arena.allocate(BLOCK_BYTES),
                entry_offset,
                BLOCK_BYTES,
            ));
            let data_offset = entry_offset + (BLOCK_BYTES + span_start as usize) as u64;
            let (result, buf) =
                read_at(file, self.arena.allocate(span_len), data_offset, span_len).await;
            let (header_result, header_buf) = header_read.await;
            self.check_read(header_result, BLOCK_BYTES, region)?;
            self.check_read(result, span_len, region)?;
            (Some(header_buf), buf, 0)
        };
        let header_bytes = match &header_block {
            Some(block) => block.as_slice(),
            None => &data.as_slice()[..BLOCK_BYTES],
        };
        let header = self.chunk_header(header_bytes, key, record, chunk, data_bytes)?;
        let span = &data.as_slice()[data_start..data_start + (span_end - span_start) as usize];
        let mut joined = hydrant_crc::combine::Joined::new();
        for (offset, piece) in span.chunks(piece_bytes as usize).enumerate() {
            let index = first_piece as usize + offset;
            let crc = header.data_crcs[index];
            if hydrant_crc::crc32c(piece) != crc {
                return Err(self.checksum_failed(key, record, chunk, "data"));
            }
            joined.push(crc, piece.len() as u64);
        }
        Ok(ReadPart {
            buf: data,
            start: data_start + (want.start - span_start) as usize,
            len: want.len(),
            crc: (want == (span_start..span_end)).then_some(joined.crc()),
        })
    }

    /// The entry header of chunk `chunk` of `record`'s version, decoded from `bytes` and checked
    /// against what the index says is there; a mismatch is a checksum failure.
    fn chunk_header(
        &self,
        bytes: &[u8],
        key: &ObjectKey,
        record: &ObjectRecord,
        chunk: usize,
        data_bytes: u32,
    ) -> Result<EntryHeader> {
        EntryHeader::decode(bytes, self.geometry.crc_block_bytes)
            .filter(|header| {
                header.kind == EntryKind::Chunk
                    && header.seq == record.seq
                    && header.chunk_index as usize == chunk
                    && header.data_bytes == data_bytes
                    && header.bucket == key.bucket_bytes()
                    && header.key == key.key_bytes()
            })
            .ok_or_else(|| self.checksum_failed(key, record, chunk, "entry header"))
    }

    fn check_read(&self, result: std::io::Result<usize>, len: usize, region: usize) -> Result<()> {
        match result {
            Ok(read) if read >= len => Ok(()),
            Ok(read) => Err(Error::new(
                ErrorKind::Io,
                format!("short read of region {region}: {read} of {len} bytes"),
            )),
            Err(error) => Err(Error::io(format!("read of region {region} failed"), error)),
        }
    }

    /// A stored chunk does not match its checksum. A clean object is dropped from the index (the
    /// next read is a miss, to be refilled from the origin); a dirty one is kept for inspection.
    fn checksum_failed(
        &self,
        key: &ObjectKey,
        record: &ObjectRecord,
        chunk: usize,
        what: &str,
    ) -> Error {
        self.count(|counters| counters.checksum_errors += 1);
        let fate = if record.dirty() {
            "kept for inspection"
        } else {
            self.index.borrow_mut().remove_older(key, record.seq, true);
            "dropped from the cache"
        };
        let message = format!(
            "{}/{} (version {}, chunk {chunk}): stored {what} does not match its checksum; {fate}",
            key.bucket(),
            key.key(),
            record.seq
        );
        log::error!("shard {}: {message}", self.shard);
        Error::new(ErrorKind::ChecksumMismatch, message)
    }

    // ----- writes -----

    /// Store `data` as the new version of `key`; returns once it is durable on the device.
    /// `dirty` pins it until it is written back to the origin.
    pub async fn put(&self, key: ObjectKey, data: &[u8], dirty: bool) -> Result<ObjectMeta> {
        self.writable()?;
        let limit = self.object_bytes_limit();
        if data.len() as u64 > limit {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "an object of {} bytes does not fit beside the rest of shard {}: its limit is {limit} bytes",
                    data.len(),
                    self.shard
                ),
            ));
        }
        let chunk_bytes = self.geometry.chunk_bytes as usize;
        let chunk_count = data.len().div_ceil(chunk_bytes).max(1);
        let flags = if dirty { ENTRY_FLAG_DIRTY } else { 0 };
        let entries = (0..chunk_count)
            .map(|chunk| {
                let piece = &data[(chunk * chunk_bytes).min(data.len())
                    ..((chunk + 1) * chunk_bytes).min(data.len())];
                let header = EntryHeader {
                    kind: EntryKind::Chunk,
                    flags,
                    chunk_index: chunk as u32,
                    chunk_count: chunk_count as u32,
                    data_bytes: piece.len() as u32,
                    seq: 0, // taken when the first chunk is placed
                    region_seq: 0,
                    object_bytes: data.len() as u64,
                    etag: Vec::new(),
                    bucket: key.bucket_bytes().to_vec(),
                    key: key.key_bytes().to_vec(),
                    data_crcs: data_checksums(piece, self.geometry.crc_block_bytes as usize),
                };
                (header, piece)
            })
            .collect();
        let meta = self
            .write_operation(&key, entries, Versioned::Yes, |seq, locations| {
                let record = ObjectRecord {
                    seq,
                    bytes: data.len() as u64,
                    flags: if dirty { RECORD_FLAG_DIRTY } else { 0 },
                    chunks: Chunks::from_vec(locations),
                };
                let meta = ObjectMeta::of(&key, &record);
                if seq > self.pending.borrow()[&key].newest_finished {
                    self.index.borrow_mut().install(key.clone(), record);
                }
                meta
            })
            .await?;
        self.count(|counters| {
            counters.puts += 1;
            counters.bytes_written += data.len() as u64;
        });
        Ok(meta)
    }

    /// The largest object a put accepts on this shard: half of what its regions can hold beside
    /// the reserve that reclaim needs, so that writing it never has to reclaim its own chunks.
    fn object_bytes_limit(&self) -> u64 {
        let usable_regions = self.places.len().saturating_sub(FREE_REGIONS_RESERVE) as u64;
        usable_regions * (self.geometry.region_bytes - BLOCK_BYTES as u64) / 2
    }

    /// Delete `key`; returns whether it was stored. A tombstone is written (and made durable)
    /// either way, so that no older copy on the device can come back after a restart.
    pub async fn delete(&self, key: ObjectKey) -> Result<bool> {
        self.writable()?;
        let header = EntryHeader {
            kind: EntryKind::Tombstone,
            flags: 0,
            chunk_index: 0,
            chunk_count: 0,
            data_bytes: 0,
            seq: 0,
            region_seq: 0,
            object_bytes: 0,
            etag: Vec::new(),
            bucket: key.bucket_bytes().to_vec(),
            key: key.key_bytes().to_vec(),
            data_crcs: Vec::new(),
        };
        let existed = self
            .write_operation(&key, vec![(header, &[][..])], Versioned::Yes, |seq, _| {
                self.index
                    .borrow_mut()
                    .remove_older(&key, seq, false)
                    .is_some()
            })
            .await?;
        self.count(|counters| counters.deletes += 1);
        Ok(existed)
    }

    /// Write one operation's entries (a put's chunks, a tombstone or a clean marker), make them
    /// durable, and then `apply` it to the index. A put or delete is a new version of the key
    /// (`Versioned::Yes`): versions that finish after it and started before it are not
    /// installed. A clean marker is not: a put in flight must still install after it.
    ///
    /// - The operation's seq is taken when its first entry is placed, so a key's operations sit
    ///   in the log in seq order.
    /// - It is acknowledged only once every write placed before its entries has completed (no
    ///   hole before it for recovery to stop at) and a flush that started after that is done.
    /// - Reclaim does not know an operation until it is applied. If it reclaimed a region holding
    ///   one of the entries meanwhile, those entries are written again.
    /// - `apply` runs right after the last check, with no await in between, so the index never
    ///   points into a region that was reclaimed under the operation.
    async fn write_operation<T>(
        &self,
        key: &ObjectKey,
        mut entries: Vec<(EntryHeader, &[u8])>,
        versioned: Versioned,
        apply: impl FnOnce(u64, Vec<Location>) -> T,
    ) -> Result<T> {
        let first = self.entry_buffer(&entries[0].0, entries[0].1);
        let (place, seq) = self.allocate_operation(first.len() as u64, key).await?;
        // Until every entry was placed once, the version cannot be complete on the device.
        let all_placed = std::cell::Cell::new(false);
        let result = async {
            for (header, _) in entries.iter_mut() {
                header.seq = seq;
            }
            let mut placed = Vec::with_capacity(entries.len());
            placed.push(
                self.write_placed_entry(entries[0].0.clone(), first, place)
                    .await?,
            );
            for (header, data) in &entries[1..] {
                placed.push(self.write_entry(header.clone(), data).await?);
            }
            all_placed.set(true);
            let mut apply = Some(apply);
            for _ in 0..REWRITE_ATTEMPTS_MAX {
                for entry in &placed {
                    self.wait_earlier_writes(entry.location.region as usize, entry.offset())
                        .await;
                }
                self.make_durable().await?;
                let stale: Vec<usize> = {
                    let regions = self.regions.borrow();
                    (0..placed.len())
                        .filter(|&index| {
                            let entry = &placed[index];
                            regions[entry.location.region as usize].region_seq != entry.region_seq
                        })
                        .collect()
                };
                if stale.is_empty() {
                    let locations = placed.iter().map(|entry| entry.location).collect();
                    let apply = apply.take().expect("applied once");
                    return Ok(apply(seq, locations));
                }
                self.count(|counters| counters.rewrites += stale.len() as u64);
                for index in stale {
                    let (header, data) = &entries[index];
                    placed[index] = self.write_entry(header.clone(), data).await?;
                }
            }
            Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "shard {} is too full of pinned (dirty) data to keep {}/{} while it reclaims space; retry later",
                    self.shard,
                    key.bucket(),
                    key.key()
                ),
            ))
        }
        .await;
        let result = match result {
            Err(error) if versioned == Versioned::Yes && all_placed.get() => {
                Err(self.void(key, seq, error).await)
            }
            other => other,
        };
        self.finish_operation(key, seq, result.is_ok() && versioned == Versioned::Yes);
        result
    }

    /// A put or delete that failed after placing all its entries (`NoSpace` after its rewrite
    /// rounds, say; one that failed before placing them all can never be complete) may still
    /// have every entry on the device, and its seq is newer than
    /// versions acknowledged before or after it: a void marker (made durable before the error
    /// is answered) keeps recovery from bringing it back. After an I/O error nothing more can
    /// be written and the outcome is unknown (`StoreFailed`, until the store is reopened); a
    /// marker that cannot be written stops the store the same way, rather than answer an error
    /// for a write that may come back.
    async fn void(&self, key: &ObjectKey, seq: u64, error: Error) -> Error {
        if self.failure.borrow().is_some() {
            return error;
        }
        let header = EntryHeader {
            kind: EntryKind::Void,
            flags: 0,
            chunk_index: 0,
            chunk_count: 0,
            data_bytes: 0,
            seq: 0,
            region_seq: 0,
            object_bytes: seq,
            etag: Vec::new(),
            bucket: key.bucket_bytes().to_vec(),
            key: key.key_bytes().to_vec(),
            data_crcs: Vec::new(),
        };
        // The marker comes after every entry of the version in the log, so it is reclaimed
        // only once they are gone (reclaim takes the oldest region first and never moves
        // entries the index does not hold).
        let written = async {
            // The one write that may take the region kept for reclaim: without the marker
            // the store would have to stop.
            let buf = self.entry_buffer(&header, &[]);
            let place = self.allocate_taking_reserve(buf.len() as u64).await?;
            let placed = self.write_placed_entry(header, buf, place).await?;
            self.wait_earlier_writes(placed.location.region as usize, placed.offset())
                .await;
            self.make_durable().await
        }
        .await;
        self.count(|counters| counters.voided += 1);
        match written {
            Ok(()) => error,
            Err(_) if self.failure.borrow().is_some() => self.writable().unwrap_err(),
            Err(void_error) => {
                let reason = format!(
                    "{}/{} version {seq} failed ({error}) and could not be voided ({void_error})",
                    key.bucket(),
                    key.key()
                );
                log::error!(
                    "shard {}: {reason}; refusing writes until reopened",
                    self.shard
                );
                self.failure.borrow_mut().get_or_insert(reason);
                self.region_idle.wake_all();
                self.writable().unwrap_err()
            }
        }
    }

    fn begin_operation(&self, key: &ObjectKey) -> u64 {
        let seq = self.take_seq();
        let mut pending = self.pending.borrow_mut();
        let entry = pending.entry(key.clone()).or_default();
        entry.newest_started = seq;
        entry.running += 1;
        seq
    }

    fn finish_operation(&self, key: &ObjectKey, seq: u64, succeeded: bool) {
        let mut pending = self.pending.borrow_mut();
        let entry = pending.get_mut(key).expect("an operation in progress");
        if succeeded {
            entry.newest_finished = entry.newest_finished.max(seq);
        }
        entry.running -= 1;
        if entry.running == 0 {
            pending.remove(key);
        }
    }

    /// Wait until every write placed in `region` before `offset` has completed.
    async fn wait_earlier_writes(&self, region: usize, offset: u64) {
        while self.regions.borrow()[region]
            .writes_in_flight
            .range(..offset)
            .next()
            .is_some()
        {
            self.region_idle.wait().await;
        }
    }

    /// A pinned buffer holding an entry's data after room for its header, padded with zeros.
    fn entry_buffer(&self, header: &EntryHeader, data: &[u8]) -> IoBuf {
        let entry_bytes = header.entry_bytes() as usize;
        let mut buf = self.arena.allocate(entry_bytes);
        buf.set_len(entry_bytes);
        let bytes = buf.as_mut_slice();
        bytes[BLOCK_BYTES..BLOCK_BYTES + data.len()].copy_from_slice(data);
        bytes[BLOCK_BYTES + data.len()..].fill(0);
        buf
    }

    /// Write one entry (header and data) into the log; returns where it went. Not yet durable.
    async fn write_entry(&self, header: EntryHeader, data: &[u8]) -> Result<PlacedEntry> {
        let buf = self.entry_buffer(&header, data);
        let place = self.allocate(buf.len() as u64).await?;
        self.write_placed_entry(header, buf, place).await
    }

    /// Seal `header` (with its place's region_seq) into `buf` and write it where it was placed.
    async fn write_placed_entry(
        &self,
        mut header: EntryHeader,
        mut buf: IoBuf,
        place: space::Place,
    ) -> Result<PlacedEntry> {
        header.region_seq = place.region_seq;
        header.encode_into(&mut buf.as_mut_slice()[..BLOCK_BYTES]);
        self.write_placed(&place, buf).await?;
        Ok(PlacedEntry {
            location: Location {
                region: place.region as u32,
                block: (place.offset / BLOCK_BYTES as u64) as u32,
                first_crc: header.data_crcs.first().copied().unwrap_or(0),
            },
            region_seq: place.region_seq,
        })
    }

    /// Write `buf` where `allocate` placed it, then release the region's in-flight count.
    async fn write_placed(&self, place: &space::Place, buf: IoBuf) -> Result<()> {
        let file = self.file_of(place.region);
        let offset = self.places[place.region].offset + place.offset;
        let (result, _buf) = write_at(file, buf, offset).await;
        {
            let removed = self.regions.borrow_mut()[place.region]
                .writes_in_flight
                .remove(&place.offset);
            assert!(removed, "a write completed that was never placed");
            self.region_idle.wake_all();
        }
        result.map_err(|error| {
            self.fail(
                format!("write to region {} at {}", place.region, place.offset),
                error,
            )
        })
    }

    /// Wait until every write completed so far is durable (group commit).
    async fn make_durable(&self) -> Result<()> {
        let ticket = self.commit.ticket();
        loop {
            self.writable()?;
            match self.commit.step(ticket) {
                CommitStep::Durable => return Ok(()),
                CommitStep::Wait => self.commit.wait().await,
                CommitStep::Flush(turn) => {
                    let mut result = Ok(());
                    for file in &self.files {
                        result = sync_data(*file).await;
                        if result.is_err() {
                            break;
                        }
                    }
                    self.commit.finish(turn, result.is_ok());
                    if let Err(error) = result {
                        return Err(self.fail("flush".to_string(), error));
                    }
                }
            }
        }
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
        }
    }
}

/// Counts a read in flight on a region for as long as it lives.
struct RegionReader<'a> {
    store: &'a Store,
    region: usize,
}

impl<'a> RegionReader<'a> {
    fn new(store: &'a Store, region: usize) -> RegionReader<'a> {
        store.regions.borrow_mut()[region].readers += 1;
        RegionReader { store, region }
    }
}

impl Drop for RegionReader<'_> {
    fn drop(&mut self) {
        let mut regions = self.store.regions.borrow_mut();
        regions[self.region].readers -= 1;
        if regions[self.region].readers == 0 {
            self.store.region_idle.wake_all();
        }
    }
}

/// The bytes of a chunk of `data_bytes` that a verified read of `want` covers: the whole chunk
/// when it is one checksummed piece or less (its checksum covers it all), else the pieces
/// `want` touches.
fn checked_span(data_bytes: u32, piece_bytes: u32, want: &Range<u32>) -> Range<u32> {
    if data_bytes <= piece_bytes {
        return 0..data_bytes;
    }
    let first_piece = want.start / piece_bytes;
    let last_piece = (want.end - 1) / piece_bytes;
    first_piece * piece_bytes..data_bytes.min((last_piece + 1) * piece_bytes)
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
