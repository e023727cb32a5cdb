//! Space in the log: appends go to the open region; when it is full the next free region is opened, and
//! when free regions run short the oldest sealed region is reclaimed.
//!
//! Two rules keep recovery simple and safe:
//! - Before a new region is opened, every write to the previous one has completed and been
//!   flushed. So only the newest region can hold a torn entry, and recovery verifies data only
//!   there.
//! - Regions are reclaimed strictly oldest first. Entries visited since they were written (and
//!   every dirty entry) are rewritten into the open region; the rest are evicted. A tombstone can
//!   be dropped when its region is reclaimed: any older version of its key was written before it
//!   and so sits in this region or an older one, which are gone (versions superseded by a
//!   pending write are never moved forward, see `pending`).

use crate::buf::IoBuf;
use crate::format::{EntryHeader, EntryKind, RegionHeader, BLOCK_BYTES};
use crate::rt::op::{read_at, write_at};
use crate::{Error, ErrorKind, Result};

use super::index::ObjectKey;
use super::scan::{ScanMode, ScannedEntry};
use super::Store;

const RECLAIM_PASSES_MAX: u32 = 2;

/// Free regions that only reclaim may open: its relocations need somewhere to go. Appends that
/// took the last one (when reclaim was deferred) left a store that could never reclaim again,
/// before or after a reopen, whatever share of it was live.
const FREE_REGIONS_FOR_RECLAIM: usize = 1;

/// A live entry of a region being reclaimed.
struct LiveEntry {
    key: ObjectKey,
    /// Visited or dirty: moved rather than evicted.
    keep: bool,
    /// An operation in progress replaces its version.
    superseded: bool,
    dirty: bool,
}

enum Reclaimed {
    Freed,
    Deferred,
}

/// Where `allocate` put an entry. The region counts it as a write in flight until
/// `Store::write_placed` completes.
pub(crate) struct Place {
    pub region: usize,
    /// Byte offset within the region.
    pub offset: u64,
    pub region_seq: u64,
}

impl Store {
    /// Reserve `bytes` at the end of the log.
    pub(super) async fn allocate(&self, bytes: u64) -> Result<Place> {
        let _section = self.allocation.enter().await;
        self.allocate_in_section(bytes).await
    }

    /// `allocate` for the first entry of an operation: the operation's seq is taken (and the
    /// key marked pending) in the same step as the place, so that seqs follow log order.
    pub(super) async fn allocate_operation(
        &self,
        bytes: u64,
        key: &ObjectKey,
    ) -> Result<(Place, u64)> {
        let _section = self.allocation.enter().await;
        let place = self.allocate_in_section(bytes).await?;
        let seq = self.begin_operation(key, place.region_seq);
        Ok((place, seq))
    }

    /// `allocate`, allowed to open the region kept for reclaim (a void marker: one block that
    /// must be written, or the store stops).
    pub(super) async fn allocate_taking_reserve(&self, bytes: u64) -> Result<Place> {
        let _section = self.allocation.enter().await;
        let reclaiming = self.reclaiming.replace(true);
        let place = Box::pin(self.allocate_in_section(bytes)).await;
        self.reclaiming.set(reclaiming);
        place
    }

    /// `allocate`, for callers already inside the allocation section (reclaim).
    async fn allocate_in_section(&self, bytes: u64) -> Result<Place> {
        assert!(bytes <= self.geometry.region_bytes - BLOCK_BYTES as u64);
        // At most two reclaim passes per allocation: the first may only clear visited bits (it
        // relocates what was visited), the second evicts. When everything left is pinned, more
        // passes would only rewrite the same entries again.
        let mut passes = 0;
        loop {
            self.writable()?;
            if let Some(place) = self.try_place(bytes) {
                return Ok(place);
            }
            let wanted = self.free_regions_wanted();
            let short = self.log.borrow().free.len() < wanted;
            if short && passes < RECLAIM_PASSES_MAX && !self.reclaiming.get() {
                passes += 1;
                self.reclaiming.set(true);
                let result = self.reclaim_until(wanted).await;
                self.reclaiming.set(false);
                result?;
                continue; // reclaim may have opened a region with room
            }
            let free = self.log.borrow().free.len();
            if !self.reclaiming.get() && free <= FREE_REGIONS_FOR_RECLAIM {
                return Err(self.kept_for_reclaim());
            }
            self.open_next_region().await?;
        }
    }

    fn kept_for_reclaim(&self) -> Error {
        Error::new(
            ErrorKind::NoSpace,
            format!(
                "shard {} keeps its last free region for reclaim, which could not make room now (what is left is pinned, or an operation in progress replaces a dirty version in the oldest region); retry later",
                self.shard
            ),
        )
    }

    fn try_place(&self, bytes: u64) -> Option<Place> {
        let mut log = self.log.borrow_mut();
        let open = log.open?;
        if log.write_offset + bytes > self.geometry.region_bytes {
            return None;
        }
        let place = Place {
            region: open,
            offset: log.write_offset,
            region_seq: self.regions.borrow()[open].region_seq,
        };
        log.write_offset += bytes;
        self.regions.borrow_mut()[open]
            .writes_in_flight
            .insert(place.offset);
        self.count(|counters| counters.log_bytes += bytes);
        Some(place)
    }

    /// Seal the open region (once its writes are complete and flushed) and open the next free
    /// one under a new region header.
    async fn open_next_region(&self) -> Result<()> {
        let previous = self.log.borrow_mut().open.take();
        if let Some(previous) = previous {
            self.log.borrow_mut().sealed.push_back(previous);
            self.region_filled();
            while !self.regions.borrow()[previous].writes_in_flight.is_empty() {
                self.region_idle.wait().await;
            }
            self.make_durable().await?;
        }
        let next = self.log.borrow_mut().free.pop_front().ok_or_else(|| {
            Error::new(
                ErrorKind::NoSpace,
                format!(
                    "shard {} has no region left to write into: every stored entry is pinned (dirty)",
                    self.shard
                ),
            )
        })?;
        while self.regions.borrow()[next].readers > 0 {
            self.region_idle.wait().await;
        }
        let region_seq = {
            let mut log = self.log.borrow_mut();
            let region_seq = log.next_region_seq;
            log.next_region_seq += 1;
            region_seq
        };
        let buf = self.region_header_block(next, region_seq);
        if let Err(error) = self.write_block(next, 0, buf).await {
            self.log.borrow_mut().free.push_front(next);
            return Err(error);
        }
        // The header is durable before any entry behind it: a region_seq is never reused, even
        // after a power loss.
        self.make_durable().await?;
        self.regions.borrow_mut()[next].region_seq = region_seq;
        let mut log = self.log.borrow_mut();
        log.open = Some(next);
        log.write_offset = BLOCK_BYTES as u64;
        Ok(())
    }

    /// The header block of `region` opened as `region_seq`.
    pub(super) fn region_header_block(&self, region: usize, region_seq: u64) -> IoBuf {
        let header = RegionHeader {
            region_seq,
            shard: self.shard,
            region_index: self.places[region].region_index,
            set_uuid: self.geometry.set_uuid,
        };
        let mut buf = self.arena.allocate(BLOCK_BYTES);
        buf.set_len(BLOCK_BYTES);
        header.encode_into(buf.as_mut_slice());
        buf
    }

    /// Write `buf` (whole blocks) at `offset` of `region`, outside the allocation of entries.
    pub(super) async fn write_block(&self, region: usize, offset: u64, buf: IoBuf) -> Result<()> {
        let (result, _buf) = write_at(
            self.file_of(region),
            buf,
            self.places[region].offset + offset,
        )
        .await;
        result.map_err(|error| self.fail(format!("write to region {region} at {offset}"), error))
    }

    /// Zero a region's first block, so that no later open takes it for a log region or a
    /// checkpoint part. Not made durable here.
    pub(super) async fn erase_header(&self, region: usize) -> Result<()> {
        let mut buf = self.arena.allocate(BLOCK_BYTES);
        buf.set_len(BLOCK_BYTES);
        buf.as_mut_slice().fill(0);
        self.write_block(region, 0, buf).await
    }

    /// Reclaim the oldest sealed regions until `free` regions are free, or until every sealed
    /// region has been tried once.
    pub(super) async fn reclaim_until(&self, free: usize) -> Result<()> {
        let mut attempts = self.log.borrow().sealed.len();
        while attempts > 0 && self.log.borrow().free.len() < free {
            attempts -= 1;
            let Some(victim) = self.log.borrow_mut().sealed.pop_front() else {
                break;
            };
            let region_seq = self.regions.borrow()[victim].region_seq;
            // Retire the region while it is reclaimed: an operation in progress with an entry
            // in it sees the region_seq change and writes that entry again.
            self.regions.borrow_mut()[victim].region_seq = 0;
            match self.reclaim_region(victim, region_seq).await {
                Ok(Reclaimed::Freed) => self.log.borrow_mut().free.push_back(victim),
                Ok(Reclaimed::Deferred) => {
                    self.regions.borrow_mut()[victim].region_seq = region_seq;
                    self.log.borrow_mut().sealed.push_front(victim);
                    break;
                }
                Err(error) => {
                    self.regions.borrow_mut()[victim].region_seq = region_seq;
                    self.log.borrow_mut().sealed.push_front(victim);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Move what must stay out of `victim` (written under `region_seq`) and free it; or leave it
    /// for later when a dirty version in it is being superseded right now.
    async fn reclaim_region(&self, victim: usize, region_seq: u64) -> Result<Reclaimed> {
        if self.regions.borrow()[victim].pinned > 0 {
            return Ok(Reclaimed::Deferred);
        }
        let scan = self
            .scan_region(victim, region_seq, ScanMode::Sealed)
            .await?;
        // A version that an operation in progress supersedes: a clean one is not worth moving.
        // A dirty one may not be dropped (the operation may still fail) nor moved (its copy
        // would land after the newer entry in the log, and outlive it once that entry's region
        // is reclaimed): leave this region until the operation is done. Decided before anything
        // is moved, so that a deferred reclaim has not used up free space for nothing. No
        // operation begins meanwhile (reclaim holds the allocation section), so no entry
        // becomes superseded while the others are moved.
        let deferred = scan.entries.iter().any(|entry| {
            self.live_entry(victim, entry)
                .is_some_and(|live| live.superseded && live.dirty)
        });
        if deferred {
            return Ok(Reclaimed::Deferred);
        }
        let mut relocated: Vec<ObjectKey> = Vec::new();
        for entry in scan.entries {
            let Some(live) = self.live_entry(victim, &entry) else {
                continue;
            };
            let LiveEntry {
                key,
                keep,
                superseded,
                dirty,
            } = live;
            assert!(!(superseded && dirty), "checked before the first move");
            let moved = if keep && !superseded {
                self.relocate(victim, entry.offset, entry.header.clone(), &key)
                    .await?
            } else {
                false
            };
            if moved {
                relocated.push(key);
            } else {
                self.index
                    .borrow_mut()
                    .remove_older(&key, entry.header.seq, true);
                self.count(|counters| counters.evictions += 1);
            }
        }
        self.clear_visited(relocated);
        if scan.damaged_headers > 0 {
            self.drop_unreachable(victim)?;
        }
        // Relocated copies must be durable before the victim's header is erased, and so must
        // every write placed before them (no new write is placed while reclaim holds the
        // allocation section).
        let open = self.log.borrow().open;
        if let Some(open) = open {
            while !self.regions.borrow()[open].writes_in_flight.is_empty() {
                self.region_idle.wait().await;
            }
        }
        self.make_durable().await?;
        self.erase_header(victim).await?;
        self.count(|counters| counters.reclaims += 1);
        Ok(Reclaimed::Freed)
    }

    /// What reclaim must know of `entry` of `victim`, if the index still points at it (tombstones,
    /// seals and clean markers are never live: they die with their region).
    fn live_entry(&self, victim: usize, entry: &ScannedEntry) -> Option<LiveEntry> {
        if entry.header.kind != EntryKind::Chunk {
            return None;
        }
        let key = ObjectKey::from_parts(&entry.header.bucket, &entry.header.key)?;
        let block = (entry.offset / BLOCK_BYTES as u64) as u32;
        let keep = {
            let index = self.index.borrow();
            let record = index
                .get(&key)
                .filter(|record| record.seq == entry.header.seq)?;
            let location = record.chunks.get(entry.header.chunk_index as usize);
            if location.region as usize != victim || location.block != block {
                return None;
            }
            record.dirty() || record.visited()
        };
        let superseded = self
            .pending
            .borrow()
            .get(&key)
            .is_some_and(|pending| pending.newest_started > entry.header.seq);
        Some(LiveEntry {
            key,
            keep,
            superseded,
            dirty: entry.header.flags & crate::format::ENTRY_FLAG_DIRTY != 0,
        })
    }

    /// Moved objects start a new round: their visited bits are cleared (SIEVE).
    fn clear_visited(&self, relocated: Vec<ObjectKey>) {
        let mut index = self.index.borrow_mut();
        for key in relocated {
            index.set_visited(&key, false);
        }
    }

    /// A damaged header hid some entries of `victim` from the scan: evict the clean objects that
    /// still point into it, and refuse to reuse it while a dirty one does.
    fn drop_unreachable(&self, victim: usize) -> Result<()> {
        let stranded = self.index.borrow().in_region(victim as u32);
        for (key, seq, dirty) in stranded {
            if dirty {
                return Err(Error::new(
                    ErrorKind::ChecksumMismatch,
                    format!(
                        "region {victim} of shard {} has a damaged entry header and holds dirty {}/{}; it is kept for inspection",
                        self.shard,
                        key.bucket(),
                        key.key()
                    ),
                ));
            }
            self.index.borrow_mut().remove_older(&key, seq, true);
            self.count(|counters| counters.evictions += 1);
        }
        Ok(())
    }

    /// Rewrite one live entry into the open region. Returns false when there is no room and the
    /// entry is clean (the caller evicts it instead).
    async fn relocate(
        &self,
        victim: usize,
        offset: u64,
        mut header: EntryHeader,
        key: &ObjectKey,
    ) -> Result<bool> {
        let entry_bytes = header.entry_bytes() as usize;
        let buf = self.arena.allocate(entry_bytes);
        let (result, mut buf) = {
            let _reader = super::read::RegionReader::new(self, victim);
            read_at(
                self.file_of(victim),
                buf,
                self.places[victim].offset + offset,
                entry_bytes,
            )
            .await
        };
        self.check_read(result, entry_bytes, victim)?;
        // A copy is written from the server's memory: it never fails its checksums but for a
        // torn write, which recovery takes for the log's end. So a damaged entry (one its
        // client changed as it was written, or bit rot) is dropped rather than moved, as a read
        // that finds it would.
        let data = &buf.as_slice()[BLOCK_BYTES..BLOCK_BYTES + header.data_bytes as usize];
        if !super::scan::data_intact(data, &header, self.geometry.crc_block_bytes) {
            log::error!(
                "shard {}: {}/{} (version {}, chunk {}): stored data does not match its \
                 checksum; dropped rather than moved by reclaim",
                self.shard,
                String::from_utf8_lossy(&header.bucket),
                String::from_utf8_lossy(&header.key),
                header.seq,
                header.chunk_index
            );
            self.count(|counters| counters.checksum_errors += 1);
            return Ok(false);
        }
        header.flags &= !crate::format::ENTRY_FLAG_FROM_CLIENT;
        // Boxed: allocation may reclaim, and reclaim relocates (at most one level deep, since
        // `reclaiming` stops a nested reclaim).
        let place = match Box::pin(self.allocate_in_section(entry_bytes as u64)).await {
            Ok(place) => place,
            Err(error)
                if error.kind() == ErrorKind::NoSpace
                    && header.flags & crate::format::ENTRY_FLAG_DIRTY == 0 =>
            {
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        header.region_seq = place.region_seq;
        // The copy carries the version's state now: one marked clean since it was written must
        // not be dirty again after its clean marker's region is reclaimed.
        let dirty_now = self
            .index
            .borrow()
            .get(key)
            .is_some_and(|record| record.seq == header.seq && record.dirty());
        if !dirty_now {
            header.flags &= !crate::format::ENTRY_FLAG_DIRTY;
        }
        header.encode_into(&mut buf.as_mut_slice()[..BLOCK_BYTES]);
        self.write_placed(&place, buf, None).await?;
        let mut index = self.index.borrow_mut();
        if let Some(record) = index.get_mut(key) {
            if record.seq == header.seq {
                let chunk = header.chunk_index as usize;
                let mut location = record.chunks.get(chunk);
                location.region = place.region as u32;
                location.block = (place.offset / BLOCK_BYTES as u64) as u32;
                record.chunks.set(chunk, location);
            }
        }
        self.count(|counters| counters.relocations += 1);
        Ok(true)
    }
}
