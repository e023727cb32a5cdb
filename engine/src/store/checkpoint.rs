//! Index checkpoints: the shard's index written to the device, so that recovery loads it and
//! scans only the log regions written after it instead of every region.
//!
//! A checkpoint is the index as it was at one instant. The instant is one synchronous step of
//! the shard, while the allocation section is held (no reclaim is half done): it notes what
//! follows, counts the checkpoint's bytes and takes its regions, and begins the index's
//! snapshot (`Index::begin_snapshot`: a record changed after the instant is saved as it was
//! until the walk has passed it). The records are then encoded and written a piece at a time
//! while the shard serves others. With the records, the checkpoint holds:
//! - `covered_below`: the region_seq below which every log region is covered: the open
//!   region's, or that of the region holding the first entry of the oldest operation still in
//!   progress, whichever is lower. Every entry in a covered region belongs to an operation that
//!   had been applied to the index (or had failed) at that instant, and every later write goes
//!   to a region at or above it: recovery scans those exactly as a full scan would.
//! - the covered log regions and their region_seq. A region reclaimed after the checkpoint has
//!   another region_seq (or none) when recovery reads it: the checkpoint's locations in it are
//!   dropped, and what reclaim kept of it was rewritten into a region that recovery scans.
//! - the next operation seq, so that no seq named by a marker in a covered region is reused,
//!   and the seqs of the operations still in progress. A version the scan after the checkpoint
//!   finds with an older seq that is neither the one the checkpoint holds for its key nor one
//!   of those in progress belongs to an operation whose outcome the checkpoint already shows (a
//!   put that a newer delete overtook and that wrote an entry again after reclaim took its
//!   region, say): it is ignored, as the full scan ignores it thanks to the delete's tombstone
//!   in a covered region.
//!
//! The checkpoint's bytes are cut into parts, one per free region taken for it, each under a
//! `CheckpointHeader` with the part's CRC32C; the parts are made durable before the previous
//! checkpoint's regions are given back, so a crash at any instant leaves a complete checkpoint
//! or the previous one, and recovery uses one only when all its parts check out (else it scans
//! everything, as without checkpoints). Checkpoint regions are neither in the log nor free:
//! reclaim never takes them, and the log keeps room for the next checkpoint beside the current.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::format::{CheckpointHeader, BLOCK_BYTES};
use crate::rt::op::read_at;
use crate::rt::sync::{Section, WaitQueue};
use crate::stamp::{Md5Tag, Stamp, MD5_TAG_BYTES};
use crate::Result;

use super::index::{
    Chunks, Location, ObjectKey, ObjectRecord, RECORD_FLAG_ATTRIBUTES, RECORD_FLAG_DIRTY,
};
use super::{Store, FREE_REGIONS_RESERVE};
use crate::key::split_joined;

/// Checkpoint parts are read this many bytes at a time.
const CHECKPOINT_IO_BYTES: usize = 1024 * 1024;
/// A checkpoint is encoded and written this many bytes at a time: one step of the shard encodes
/// a piece (about 700 records of 4 KiB objects with 39-byte keys: about 1 ms, measured), then
/// the shard serves others while it is written. At 256 KiB, readers waited 2–2.5 ms (median)
/// during a checkpoint against 0.7 ms at this size, for a checkpoint 10–20% sooner.
const CHECKPOINT_WRITE_BYTES: usize = 64 * 1024;
/// A checkpoint's writes are made durable each time this many more bytes were written, so that
/// no one flush has much to push: where the device's cache flush holds reads queued behind it
/// (this machine's virtual disk), one flush after 88 MiB held a GET for about 100 ms, and
/// flushes every 4 MiB no more than the disk's ordinary outliers (measured).
const CHECKPOINT_FLUSH_BYTES: u64 = 4 * 1024 * 1024;
/// A record's bytes in a checkpoint besides its joined key (one byte less: the separator is a
/// length), MD5 tag and chunk locations: see `encode_record`.
const RECORD_FIXED_BYTES: u64 = 1 + 2 + 8 + 8 + 1 + 8 + 1 + 4 - 1;
/// A chunk location's bytes in a checkpoint.
const LOCATION_BYTES: u64 = 12;

/// Where a checkpoint's parts go, and what each part's header says of the whole.
struct PartsTaken<'a> {
    taken: &'a [usize],
    checkpoint_seq: u64,
    covered_below: u64,
    next_seq: u64,
}

/// Ends the index's snapshot when a checkpoint ends, written or not.
struct EndSnapshot<'a>(&'a Store);

impl Drop for EndSnapshot<'_> {
    fn drop(&mut self) {
        self.0.index.borrow_mut().end_snapshot();
    }
}

/// One record of a checkpoint (little-endian):
///
/// ```text
/// u8 bucket length, bucket, u16 key length, key,
/// u64 seq, u64 bytes, u8 flags (1 dirty, 4 attributes), u64 modified_ms,
/// u8 has MD5 tag, [18-byte MD5 tag],
/// u32 chunks, then for each: u32 region, u32 block, u32 CRC32C of its first piece
/// ```
fn encode_record(out: &mut Vec<u8>, joined: &[u8], record: &ObjectRecord) {
    let (bucket, key) = split_joined(joined);
    out.push(bucket.len() as u8);
    out.extend_from_slice(bucket);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&record.seq.to_le_bytes());
    out.extend_from_slice(&record.bytes.to_le_bytes());
    out.push(record.flags & (RECORD_FLAG_DIRTY | RECORD_FLAG_ATTRIBUTES));
    let stamp = Stamp::from(record.stamp);
    out.extend_from_slice(&stamp.modified_ms.to_le_bytes());
    match stamp.md5 {
        Some(tag) => {
            out.push(1);
            out.extend_from_slice(&tag.encode());
        }
        None => out.push(0),
    }
    let locations = record.chunks.as_slice();
    out.extend_from_slice(&(locations.len() as u32).to_le_bytes());
    for location in locations {
        out.extend_from_slice(&location.region.to_le_bytes());
        out.extend_from_slice(&location.block.to_le_bytes());
        out.extend_from_slice(&location.first_crc.to_le_bytes());
    }
}

/// When a shard writes index checkpoints and whether it loads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Write one once this many log regions were filled since the last; 0: only on close.
    pub every_regions: u32,
    /// Write one when the store is closed, so that a clean restart scans no log region.
    pub on_close: bool,
    /// Load the newest complete checkpoint when opening (false: scan every region).
    pub load: bool,
}

impl Default for CheckpointPolicy {
    fn default() -> CheckpointPolicy {
        CheckpointPolicy {
            every_regions: CHECKPOINT_EVERY_REGIONS_DEFAULT,
            on_close: true,
            load: true,
        }
    }
}

/// Log regions filled between two checkpoints by default: at 64 MiB regions, a restart after a
/// crash scans at most about 1 GiB of log beside the checkpoint.
pub const CHECKPOINT_EVERY_REGIONS_DEFAULT: u32 = 16;

/// A shard needs this many regions to keep checkpoints: with fewer, the room they take would
/// leave the log too little, and the shard scans its few regions on every open instead.
pub const CHECKPOINT_REGIONS_MIN: usize = 8;

/// A shard's checkpointing state.
pub(super) struct Checkpoints {
    pub policy: CheckpointPolicy,
    /// Regions the next checkpoint is expected to take (the last one's count, at least 1):
    /// the log keeps them free beside its own reserve. 0 when the shard keeps no checkpoints.
    pub parts_expected: std::cell::Cell<usize>,
    /// Log regions filled since the last checkpoint was taken.
    pub filled_since: std::cell::Cell<u32>,
    /// Woken when a checkpoint is due (or the store closes).
    pub due: WaitQueue,
    /// One checkpoint at a time.
    pub running: Section,
    pub closed: std::cell::Cell<bool>,
}

impl Checkpoints {
    pub fn new(policy: CheckpointPolicy, regions: usize) -> Checkpoints {
        let policy = if regions < CHECKPOINT_REGIONS_MIN {
            CheckpointPolicy {
                every_regions: 0,
                on_close: false,
                ..policy
            }
        } else {
            policy
        };
        let writes = policy.every_regions > 0 || policy.on_close;
        Checkpoints {
            policy,
            parts_expected: std::cell::Cell::new(usize::from(writes)),
            filled_since: std::cell::Cell::new(0),
            due: WaitQueue::new(),
            running: Section::default(),
            closed: std::cell::Cell::new(false),
        }
    }

    fn is_due(&self) -> bool {
        self.policy.every_regions > 0 && self.filled_since.get() >= self.policy.every_regions
    }
}

/// A checkpoint read back from the device.
pub(super) struct LoadedCheckpoint {
    pub checkpoint_seq: u64,
    /// The regions holding its parts, in part order.
    pub regions: Vec<usize>,
    pub covered_below: u64,
    pub next_seq: u64,
    /// (region, region_seq) of every log region it covers.
    pub covered: Vec<(u32, u64)>,
    /// Seqs of the operations in progress when it was taken.
    pub in_progress: HashSet<u64>,
    /// Joined keys (as the index shares them) and records, listed keys in order.
    pub records: Vec<(Rc<[u8]>, ObjectRecord)>,
}

/// What a checkpoint's bytes hold besides the header's fields.
struct CheckpointBody {
    covered: Vec<(u32, u64)>,
    in_progress: HashSet<u64>,
    records: Vec<(Rc<[u8]>, ObjectRecord)>,
}

/// What a checkpoint's parts say of themselves, gathered from the region headers.
pub(super) type CheckpointParts = HashMap<u64, Vec<(usize, CheckpointHeader)>>;

impl Store {
    /// Wait for checkpoints to fall due and write them, until the store closes. Runs as a task
    /// of its own on the shard.
    pub async fn run_checkpoints(&self) {
        loop {
            while !self.checkpoints.is_due() && !self.checkpoints.closed.get() {
                self.checkpoints.due.wait().await;
            }
            if self.checkpoints.closed.get() {
                return;
            }
            if let Err(error) = self.checkpoint().await {
                log::warn!("shard {}: checkpoint failed: {error}", self.shard);
                if self.writable().is_err() {
                    return;
                }
            }
        }
    }

    /// Free regions the log keeps: its reserve for reclaim and, when the shard keeps
    /// checkpoints, room for the next one (and one more, since opening a region takes one).
    pub(super) fn free_regions_wanted(&self) -> usize {
        match self.checkpoints.parts_expected.get() {
            0 => FREE_REGIONS_RESERVE,
            parts => FREE_REGIONS_RESERVE + parts + 1,
        }
    }

    /// Regions the log cannot fill: the free ones it keeps and the checkpoint's.
    pub(super) fn regions_kept(&self) -> usize {
        self.free_regions_wanted() + self.checkpoints.parts_expected.get()
    }

    /// Called when the log fills a region.
    pub(super) fn region_filled(&self) {
        let checkpoints = &self.checkpoints;
        checkpoints
            .filled_since
            .set(checkpoints.filled_since.get() + 1);
        if checkpoints.is_due() {
            checkpoints.due.wake_all();
        }
    }

    /// Stop the checkpoint task (after the one in progress, if any).
    pub(super) fn stop_checkpoints(&self) {
        self.checkpoints.closed.set(true);
        self.checkpoints.due.wake_all();
    }

    /// Take a checkpoint of the index and write it; returns false when there was no room for
    /// it (the log then keeps more regions free for the next one). It takes free regions only:
    /// it never evicts anything itself.
    ///
    /// The shard pauses only to note the instant: the regions covered, the operations in
    /// progress, the checkpoint's size (from the index's totals) and the regions it takes. The
    /// records are then encoded and written a piece at a time from the index's snapshot
    /// (`Index::begin_snapshot`), while the shard goes on serving and changing the index.
    pub async fn checkpoint(&self) -> Result<bool> {
        let _running = self.checkpoints.running.enter().await;
        self.writable()?;
        let (head, body_bytes, covered_below, next_seq, taken, checkpoint_seq) = {
            let _section = self.allocation.enter().await;
            self.writable()?;
            let pausing = std::time::Instant::now();
            let covered_below = self.covered_below();
            let next_seq = self.next_seq.get();
            let head = self.encode_checkpoint_head(covered_below);
            let body_bytes = {
                let index = self.index.borrow();
                let totals = index.totals();
                head.len() as u64
                    + RECORD_FIXED_BYTES * index.len() as u64
                    + totals.key_bytes
                    + MD5_TAG_BYTES as u64 * totals.md5_tags
                    + LOCATION_BYTES * totals.locations
            };
            self.checkpoints.filled_since.set(0);
            let parts = (body_bytes.div_ceil(self.part_bytes_max() as u64) as usize).max(1);
            self.checkpoints.parts_expected.set(parts);
            let mut log = self.log.borrow_mut();
            // The parts, and the log's own reserve left beside them.
            if log.free.len() < FREE_REGIONS_RESERVE + parts {
                drop(log);
                self.count(|counters| counters.checkpoints_skipped += 1);
                return Ok(false);
            }
            let taken: Vec<usize> = (0..parts)
                .map(|_| log.free.pop_back().expect("counted"))
                .collect();
            let checkpoint_seq = log.next_region_seq;
            log.next_region_seq += 1;
            drop(log);
            self.index.borrow_mut().begin_snapshot();
            let pause_us = pausing.elapsed().as_micros() as u64;
            self.count(|counters| counters.checkpoint_pause_us = pause_us);
            (
                head,
                body_bytes,
                covered_below,
                next_seq,
                taken,
                checkpoint_seq,
            )
        };
        // The snapshot ends with this call, however it ends.
        let _snapshot = EndSnapshot(self);
        // Reads of what reclaim just moved out of these regions may still be in flight.
        for &region in &taken {
            while self.regions.borrow()[region].readers > 0 {
                self.region_idle.wait().await;
            }
        }
        // A region reclaim freed has its header erased without a flush: make that durable
        // before the region holds anything else, or a power cut could bring the old header
        // back over the checkpoint's bytes.
        self.make_durable().await?;
        // A failed write stops the store; the regions taken stay out of use until it reopens.
        let parts = PartsTaken {
            taken: &taken,
            checkpoint_seq,
            covered_below,
            next_seq,
        };
        self.write_checkpoint(head, body_bytes, &parts).await?;
        let old = std::mem::replace(&mut self.log.borrow_mut().checkpoint, taken);
        for region in old {
            self.erase_header(region).await?;
            self.log.borrow_mut().free.push_back(region);
        }
        self.count(|counters| {
            counters.checkpoints += 1;
            counters.checkpoint_bytes = body_bytes;
        });
        log::debug!(
            "shard {}: checkpoint {checkpoint_seq} of {} bytes covers regions below {covered_below}",
            self.shard,
            body_bytes
        );
        Ok(true)
    }

    /// See the module's documentation.
    fn covered_below(&self) -> u64 {
        let log = self.log.borrow();
        let open = log.open.map_or(log.next_region_seq, |open| {
            self.regions.borrow()[open].region_seq
        });
        let oldest_operation = self
            .operations
            .borrow()
            .values()
            .copied()
            .min()
            .unwrap_or(u64::MAX);
        open.min(oldest_operation)
    }

    /// The checkpoint's bytes (little-endian) up to its records:
    ///
    /// ```text
    /// u32 covered regions, then for each: u32 region, u64 region_seq
    /// u32 operations in progress, then for each: u64 seq
    /// u64 records (listed keys in byte order, then chunk keys in byte order), then for each
    ///   what `encode_record` writes
    /// ```
    fn encode_checkpoint_head(&self, covered_below: u64) -> Vec<u8> {
        let regions = self.regions.borrow();
        let log = self.log.borrow();
        let covered: Vec<(u32, u64)> = log
            .sealed
            .iter()
            .map(|&region| (region as u32, regions[region].region_seq))
            .filter(|&(_, region_seq)| region_seq != 0 && region_seq < covered_below)
            .collect();
        let operations = self.operations.borrow();
        let mut out = Vec::with_capacity(CHECKPOINT_WRITE_BYTES + 16 * 1024);
        out.extend_from_slice(&(covered.len() as u32).to_le_bytes());
        for (region, region_seq) in &covered {
            out.extend_from_slice(&region.to_le_bytes());
            out.extend_from_slice(&region_seq.to_le_bytes());
        }
        out.extend_from_slice(&(operations.len() as u32).to_le_bytes());
        for seq in operations.keys() {
            out.extend_from_slice(&seq.to_le_bytes());
        }
        out.extend_from_slice(&(self.index.borrow().len() as u64).to_le_bytes());
        out
    }

    /// Encode the snapshot's records after `head` and write them into the regions taken, a
    /// piece at a time: each piece is encoded in one step of the shard, then written while the
    /// shard serves others. Each part's header follows its data; all are made durable at the
    /// end. `body_bytes` is what the whole comes to, as counted when the snapshot began.
    async fn write_checkpoint(
        &self,
        head: Vec<u8>,
        body_bytes: u64,
        parts: &PartsTaken<'_>,
    ) -> Result<()> {
        let part_bytes_max = self.part_bytes_max();
        let mut pending = head;
        let mut finished = false;
        // The part being written, its bytes written so far and their CRC32C.
        let (mut part, mut in_part, mut crc) = (0, 0, 0);
        let mut written = 0u64;
        let mut step_max_us = 0;
        loop {
            if !finished {
                let stepping = std::time::Instant::now();
                let mut index = self.index.borrow_mut();
                finished = index.snapshot_step(|joined, record| {
                    encode_record(&mut pending, joined, record);
                    pending.len() < CHECKPOINT_WRITE_BYTES
                });
                let saved = index.snapshot_saved() as u64;
                self.count(|counters| {
                    counters.checkpoint_saved_max = counters.checkpoint_saved_max.max(saved);
                });
                step_max_us = step_max_us.max(stepping.elapsed().as_micros() as u64);
            }
            loop {
                let piece = CHECKPOINT_WRITE_BYTES.min(part_bytes_max - in_part);
                // A whole piece is ready, or the rest once the walk has finished.
                let ready = pending.len() >= piece || (finished && !pending.is_empty());
                if !ready {
                    break;
                }
                let piece = piece.min(pending.len());
                assert!(part < parts.taken.len(), "the checkpoint outgrew its count");
                let len = piece.next_multiple_of(BLOCK_BYTES);
                let mut buf = self.arena.allocate(len);
                buf.set_len(len);
                buf.as_mut_slice()[..piece].copy_from_slice(&pending[..piece]);
                buf.as_mut_slice()[piece..].fill(0);
                crc = hydrant_crc::crc32c_append(crc, &pending[..piece]);
                pending.drain(..piece);
                let offset = (BLOCK_BYTES + in_part) as u64;
                self.write_block(parts.taken[part], offset, buf).await?;
                in_part += piece;
                written += piece as u64;
                if written % CHECKPOINT_FLUSH_BYTES < piece as u64 {
                    self.make_durable().await?;
                }
                if in_part == part_bytes_max {
                    self.write_part_header(parts, part, in_part, crc).await?;
                    (part, in_part, crc) = (part + 1, 0, 0);
                }
            }
            if finished {
                break;
            }
        }
        if in_part > 0 || part == 0 {
            self.write_part_header(parts, part, in_part, crc).await?;
            part += 1;
        }
        self.count(|counters| counters.checkpoint_step_max_us = step_max_us);
        assert_eq!(written, body_bytes, "the checkpoint's size as counted");
        assert_eq!(part, parts.taken.len());
        self.make_durable().await
    }

    async fn write_part_header(
        &self,
        parts: &PartsTaken<'_>,
        part: usize,
        data_bytes: usize,
        data_crc: u32,
    ) -> Result<()> {
        let region = parts.taken[part];
        let header = CheckpointHeader {
            checkpoint_seq: parts.checkpoint_seq,
            shard: self.shard,
            region_index: self.places[region].region_index,
            set_uuid: self.geometry.set_uuid,
            part: part as u32,
            parts: parts.taken.len() as u32,
            data_bytes: data_bytes as u64,
            data_crc,
            covered_below: parts.covered_below,
            next_seq: parts.next_seq,
        };
        let mut buf = self.arena.allocate(BLOCK_BYTES);
        buf.set_len(BLOCK_BYTES);
        header.encode_into(buf.as_mut_slice());
        self.write_block(region, 0, buf).await
    }

    /// The newest checkpoint among `found` whose parts are all present, read and decoded.
    /// Incomplete ones (a crash while one was written) are passed over; if the newest complete
    /// one is damaged it is counted and `None` returned: the full scan is the one fallback.
    /// `None` too when there is none.
    pub(super) async fn load_checkpoint(
        &self,
        found: &CheckpointParts,
    ) -> Result<Option<LoadedCheckpoint>> {
        let mut seqs: Vec<u64> = found.keys().copied().collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        for checkpoint_seq in seqs {
            let mut parts = found[&checkpoint_seq].clone();
            parts.sort_by_key(|(_, header)| header.part);
            let first = &parts[0].1;
            let complete = parts.len() == first.parts as usize
                && parts.iter().enumerate().all(|(position, (_, header))| {
                    header.part as usize == position
                        && header.parts == first.parts
                        && header.covered_below == first.covered_below
                        && header.next_seq == first.next_seq
                });
            if !complete {
                continue;
            }
            let mut body = Vec::new();
            let mut intact = true;
            for (region, header) in &parts {
                let start = body.len();
                if !self
                    .read_checkpoint_part(*region, header, &mut body)
                    .await?
                {
                    intact = false;
                    break;
                }
                if hydrant_crc::crc32c(&body[start..]) != header.data_crc {
                    intact = false;
                    break;
                }
            }
            let decoded = if intact {
                self.decode_checkpoint(&body)
            } else {
                None
            };
            match decoded {
                Some(body) => {
                    self.checkpoints.parts_expected.set(parts.len());
                    return Ok(Some(LoadedCheckpoint {
                        checkpoint_seq,
                        regions: parts.iter().map(|(region, _)| *region).collect(),
                        covered_below: first.covered_below,
                        next_seq: first.next_seq,
                        covered: body.covered,
                        in_progress: body.in_progress,
                        records: body.records,
                    }));
                }
                None => {
                    log::warn!(
                        "shard {}: checkpoint {checkpoint_seq} is damaged; recovering without it",
                        self.shard
                    );
                    self.count(|counters| counters.checkpoints_damaged += 1);
                    // An older checkpoint is not tried: the full scan is the one fallback.
                    return Ok(None);
                }
            }
        }
        Ok(None)
    }

    /// The most bytes one part holds: a region less its header block.
    fn part_bytes_max(&self) -> usize {
        (self.geometry.region_bytes - BLOCK_BYTES as u64) as usize
    }

    /// Append a part's bytes to `body`; false when its length cannot be right.
    async fn read_checkpoint_part(
        &self,
        region: usize,
        header: &CheckpointHeader,
        body: &mut Vec<u8>,
    ) -> Result<bool> {
        if header.data_bytes > self.part_bytes_max() as u64 {
            return Ok(false);
        }
        let mut done = 0u64;
        while done < header.data_bytes {
            let want = (header.data_bytes - done).min(CHECKPOINT_IO_BYTES as u64) as usize;
            let len = want.next_multiple_of(BLOCK_BYTES);
            let offset = self.places[region].offset + BLOCK_BYTES as u64 + done;
            let (result, buf) =
                read_at(self.file_of(region), self.arena.allocate(len), offset, len).await;
            self.check_read(result, len, region)?;
            body.extend_from_slice(&buf.as_slice()[..want]);
            done += want as u64;
        }
        Ok(true)
    }

    /// What a checkpoint's bytes hold; `None` if they do not parse or name something this
    /// shard cannot hold.
    fn decode_checkpoint(&self, body: &[u8]) -> Option<CheckpointBody> {
        let mut reader = Reader { bytes: body };
        let region_count = self.places.len() as u32;
        let region_blocks = (self.geometry.region_bytes / BLOCK_BYTES as u64) as u32;
        let covered_count = reader.u32()?;
        if covered_count > region_count {
            return None;
        }
        let mut covered = Vec::with_capacity(covered_count as usize);
        for _ in 0..covered_count {
            let region = reader.u32()?;
            let region_seq = reader.u64()?;
            if region >= region_count {
                return None;
            }
            covered.push((region, region_seq));
        }
        let in_progress_count = reader.u32()?;
        if in_progress_count as usize > body.len() / 8 {
            return None;
        }
        let mut in_progress = HashSet::with_capacity(in_progress_count as usize);
        for _ in 0..in_progress_count {
            in_progress.insert(reader.u64()?);
        }
        let record_count = reader.u64()?;
        // Each record takes at least 45 bytes: a count beyond that is damage, not memory to take.
        if record_count > body.len() as u64 / 45 {
            return None;
        }
        let mut records = Vec::with_capacity(record_count as usize);
        let mut joined = Vec::with_capacity(crate::format::BUCKET_BYTES_MAX + 1 + 1024);
        for _ in 0..record_count {
            let bucket_len = reader.u8()? as usize;
            let bucket = reader.take(bucket_len)?;
            let key_len = reader.u16()? as usize;
            let key = reader.take(key_len)?;
            if !ObjectKey::parts_acceptable(bucket, key) {
                return None;
            }
            joined.clear();
            joined.extend_from_slice(bucket);
            joined.push(0);
            joined.extend_from_slice(key);
            let key: Rc<[u8]> = Rc::from(&joined[..]);
            let seq = reader.u64()?;
            let bytes = reader.u64()?;
            let flags = reader.u8()?;
            if flags & !(RECORD_FLAG_DIRTY | RECORD_FLAG_ATTRIBUTES) != 0 {
                return None;
            }
            let modified_ms = reader.u64()?;
            let md5 = match reader.u8()? {
                0 => None,
                1 => Some(Md5Tag::decode(reader.take(MD5_TAG_BYTES)?)?),
                _ => return None,
            };
            let chunk_count = reader.u32()? as u64;
            if chunk_count != bytes.div_ceil(self.geometry.chunk_bytes as u64).max(1)
                || chunk_count > reader.bytes.len() as u64 / 12
            {
                return None;
            }
            let mut locations = Vec::with_capacity(chunk_count as usize);
            for _ in 0..chunk_count {
                let location = Location {
                    region: reader.u32()?,
                    block: reader.u32()?,
                    first_crc: reader.u32()?,
                };
                if location.region >= region_count
                    || location.block == 0
                    || location.block >= region_blocks
                {
                    return None;
                }
                locations.push(location);
            }
            records.push((
                key,
                ObjectRecord {
                    seq,
                    bytes,
                    flags,
                    chunks: Chunks::from_vec(locations),
                    stamp: Stamp { modified_ms, md5 }.into(),
                },
            ));
        }
        reader.bytes.is_empty().then_some(CheckpointBody {
            covered,
            in_progress,
            records,
        })
    }
}

/// Reads little-endian fields off the front of a byte string; `None` past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < len {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}
