//! Recovery: rebuild a shard's index and log from its regions.
//!
//! Region headers say which regions hold this shard's log and in what order (region_seq).
//! Sealed regions are scanned trusting entry headers (their writes were all flushed before a
//! newer region was opened); the newest region is scanned verifying every entry's data, and
//! ends at the first entry that does not check out, but for entries written from a client's
//! memory, which are passed over and their versions voided (see `ScanMode::Tail`). A seal is
//! then written at that end so that a later recovery never reads past it. For every key the newest version whose chunks are all
//! present, that no newer tombstone deletes and that no void marker names is indexed; it is
//! dirty unless a clean marker names it.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::format::{
    CheckpointHeader, EntryHeader, EntryKind, RegionHeader, BLOCK_BYTES, ENTRY_FLAG_DIRTY,
};
use crate::rt::op::read_at;
use crate::stamp::Stamp;
use crate::Result;

use super::checkpoint::CheckpointParts;
use super::index::{
    Chunks, Index, Location, ObjectKey, ObjectRecord, RECORD_FLAG_ATTRIBUTES, RECORD_FLAG_DIRTY,
};
use super::scan::ScanMode;
use super::{Store, StoreParts};

struct Candidate {
    seq: u64,
    bytes: u64,
    dirty: bool,
    /// Its first chunk's header holds attributes.
    described: bool,
    /// From the last chunk's header (a streamed put's MD5 tag is known only there).
    stamp: Stamp,
    chunks: Vec<Option<Location>>,
}

#[derive(Default)]
struct KeyHistory {
    versions: Vec<Candidate>,
    /// Seqs of the key's tombstones (a voided one deletes nothing).
    tombstones: Vec<u64>,
    /// Versions marked clean (written back to the origin) after they were written dirty.
    cleaned: Vec<u64>,
    /// Versions whose operation failed after writing them (void markers).
    voided: Vec<u64>,
    /// The version a checkpoint holds for the key.
    seeded: Option<u64>,
}

/// Which versions the scan after a checkpoint may add (see `store/checkpoint.rs`): those the
/// checkpoint holds, those of operations in progress when it was taken, and newer ones.
struct AfterCheckpoint {
    next_seq: u64,
    in_progress: HashSet<u64>,
}

#[derive(Default)]
struct IndexBuilder {
    /// foldhash, as the index (SipHash took 3.5% of the samples of a restart bench).
    keys: HashMap<ObjectKey, KeyHistory, foldhash::fast::RandomState>,
    seq_max: u64,
    inconsistent: u64,
    after: Option<AfterCheckpoint>,
}

impl IndexBuilder {
    fn add(&mut self, region: usize, offset: u64, header: &EntryHeader, chunk_bytes: u32) {
        let Some(key) = ObjectKey::from_parts(&header.bucket, &header.key) else {
            self.inconsistent += 1;
            return;
        };
        self.seq_max = self.seq_max.max(header.seq);
        if matches!(header.kind, EntryKind::Clean | EntryKind::Void) {
            // A marker names a seq: one that must never be given out again, even when every
            // entry of that version is gone (else a marker would apply to a new version).
            self.seq_max = self.seq_max.max(header.object_bytes);
        }
        let history = self.keys.entry(key).or_default();
        if let (EntryKind::Chunk, Some(after)) = (header.kind, &self.after) {
            if header.seq < after.next_seq
                && history.seeded != Some(header.seq)
                && !after.in_progress.contains(&header.seq)
            {
                return;
            }
        }
        match header.kind {
            EntryKind::Tombstone => history.tombstones.push(header.seq),
            EntryKind::Seal => {}
            EntryKind::Clean => history.cleaned.push(header.object_bytes),
            EntryKind::Void => history.voided.push(header.object_bytes),
            EntryKind::Chunk => {
                let chunk_count = header.object_bytes.div_ceil(chunk_bytes as u64).max(1);
                let chunk_start = header.chunk_index as u64 * chunk_bytes as u64;
                let expected_bytes =
                    (chunk_bytes as u64).min(header.object_bytes.saturating_sub(chunk_start));
                if header.chunk_count as u64 != chunk_count
                    || header.data_bytes as u64 != expected_bytes
                {
                    self.inconsistent += 1;
                    return;
                }
                let position = history
                    .versions
                    .iter()
                    .position(|version| version.seq == header.seq);
                let version = match position {
                    Some(position) => &mut history.versions[position],
                    None => {
                        history.versions.push(Candidate {
                            seq: header.seq,
                            bytes: header.object_bytes,
                            dirty: header.flags & ENTRY_FLAG_DIRTY != 0,
                            described: false,
                            stamp: Stamp::default(),
                            chunks: vec![None; chunk_count as usize],
                        });
                        history.versions.last_mut().expect("just pushed")
                    }
                };
                if version.bytes != header.object_bytes {
                    self.inconsistent += 1;
                    return;
                }
                if header.chunk_index as u64 + 1 == chunk_count {
                    version.stamp = Stamp {
                        modified_ms: header.modified_ms,
                        md5: header.md5,
                    };
                }
                if header.chunk_index == 0 {
                    version.described = !header.attributes.is_empty();
                }
                // Regions are scanned oldest first, so a relocated copy replaces the original.
                version.chunks[header.chunk_index as usize] = Some(Location {
                    region: region as u32,
                    block: (offset / BLOCK_BYTES as u64) as u32,
                    first_crc: header.data_crcs.first().copied().unwrap_or(0),
                });
            }
        }
    }

    /// A checkpoint's record as a candidate whose chunks are known where they lie in a region
    /// the checkpoint still covers (`valid`); the scan of the regions after it fills in the
    /// others it moved, or leaves the version incomplete.
    fn seed(&mut self, key: ObjectKey, record: &ObjectRecord, valid: &HashSet<u32>) {
        let chunks = record
            .chunks
            .as_slice()
            .iter()
            .map(|location| valid.contains(&location.region).then_some(*location))
            .collect();
        let history = self.keys.entry(key).or_default();
        history.seeded = Some(record.seq);
        history.versions.push(Candidate {
            seq: record.seq,
            bytes: record.bytes,
            dirty: record.dirty(),
            described: record.described(),
            stamp: record.stamp.into(),
            chunks,
        });
    }

    #[cfg(test)]
    fn finish(self) -> Index {
        Index::built_from(self.finish_records())
    }

    /// The newest complete version of each key.
    fn finish_records(self) -> Vec<(ObjectKey, ObjectRecord)> {
        let mut records = Vec::with_capacity(self.keys.len());
        for (key, history) in self.keys {
            let tombstone = history
                .tombstones
                .iter()
                .copied()
                .filter(|seq| !history.voided.contains(seq))
                .max()
                .unwrap_or(0);
            let newest = history
                .versions
                .into_iter()
                .filter(|version| {
                    version.seq > tombstone
                        && version.chunks.iter().all(Option::is_some)
                        && !history.voided.contains(&version.seq)
                })
                .max_by_key(|version| version.seq);
            if let Some(version) = newest {
                let locations = version
                    .chunks
                    .into_iter()
                    .map(|chunk| chunk.expect("complete"))
                    .collect();
                records.push((
                    key,
                    ObjectRecord {
                        seq: version.seq,
                        bytes: version.bytes,
                        flags: if version.dirty && !history.cleaned.contains(&version.seq) {
                            RECORD_FLAG_DIRTY
                        } else {
                            0
                        } | if version.described {
                            RECORD_FLAG_ATTRIBUTES
                        } else {
                            0
                        },
                        chunks: Chunks::from_vec(locations),
                        stamp: version.stamp.into(),
                    },
                ));
            }
        }
        records
    }
}

impl Store {
    /// Write a seal at `end` of `region` (if there is room) and make it durable: a later scan
    /// stops there and trusts what came before.
    async fn write_seal(&self, region: usize, region_seq: u64, end: u64) -> Result<()> {
        if end + BLOCK_BYTES as u64 > self.geometry.region_bytes {
            return Ok(()); // the region is full: its end is its end
        }
        let buf = self.entry_blocks(&[EntryHeader::seal(region_seq)], region_seq);
        self.write_block(region, end, buf).await?;
        self.make_durable().await
    }

    /// A block for each of `headers` (entries without data), under `region_seq`.
    fn entry_blocks(&self, headers: &[EntryHeader], region_seq: u64) -> crate::buf::IoBuf {
        let mut buf = self.arena.allocate(headers.len() * BLOCK_BYTES);
        buf.set_len(headers.len() * BLOCK_BYTES);
        for (header, block) in headers
            .iter()
            .zip(buf.as_mut_slice().chunks_mut(BLOCK_BYTES))
        {
            let mut header = header.clone();
            header.region_seq = region_seq;
            header.encode_into(block);
        }
        buf
    }

    /// Write `markers` (void markers of versions with entries in the tail region `region`
    /// that did not check out, see `RegionScan::damaged`) and make them durable, before the
    /// seal that makes a later scan trust the damaged entries' headers; returns where that
    /// seal goes. They go at the tail's `end` where it has room for them and the seal: a crash
    /// before the seal leaves a region scanned as a tail again (a torn marker is its torn end).
    /// Else into a free region of their own, written before its header, so that the region
    /// (newer than the tail, which is then scanned trusting its headers) exists only once
    /// they are durable, with a zero block durable at the tail's end before it. Called once
    /// the log's state is rebuilt, with a free region to spare where the tail has no room (see
    /// `marker_room`).
    async fn write_void_markers(
        &self,
        region: usize,
        region_seq: u64,
        end: u64,
        markers: &[EntryHeader],
    ) -> Result<u64> {
        if markers.is_empty() {
            return Ok(end);
        }
        log::warn!(
            "shard {}: voided {} versions with entries in region {region} that did not check out \
             and sound entries after them (written from a client's memory that it changed \
             meanwhile, or torn by a crash)",
            self.shard,
            markers.len()
        );
        self.count(|counters| counters.damaged_voided += markers.len() as u64);
        if self.marker_room(end, markers.len()) {
            self.write_block(region, end, self.entry_blocks(markers, region_seq))
                .await?;
            self.make_durable().await?;
            return Ok(end + (markers.len() * BLOCK_BYTES) as u64);
        }
        let (own, own_seq) = {
            let mut log = self.log.borrow_mut();
            let own = log
                .free
                .pop_front()
                .expect("a free region kept for the markers");
            let own_seq = log.next_region_seq;
            log.next_region_seq += 1;
            (own, own_seq)
        };
        // Once the region below is durable, the tail is no longer the newest and is scanned
        // trusting headers up to a seal or a zero block: a zero block at its end stands for
        // its seal until that is written (a trusted header after the end could be a torn
        // write's or a damaged client entry's).
        if end + BLOCK_BYTES as u64 <= self.geometry.region_bytes {
            let mut zeros = self.arena.allocate(BLOCK_BYTES);
            zeros.set_len(BLOCK_BYTES);
            zeros.as_mut_slice().fill(0);
            self.write_block(region, end, zeros).await?;
        }
        let mut own_entries = markers.to_vec();
        own_entries.push(EntryHeader::seal(own_seq));
        self.write_block(
            own,
            BLOCK_BYTES as u64,
            self.entry_blocks(&own_entries, own_seq),
        )
        .await?;
        self.make_durable().await?;
        self.write_block(own, 0, self.region_header_block(own, own_seq))
            .await?;
        self.make_durable().await?;
        self.regions.borrow_mut()[own].region_seq = own_seq;
        self.log.borrow_mut().sealed.push_back(own);
        Ok(end)
    }

    /// Whether `count` void markers and a seal fit at `end` of a region.
    fn marker_room(&self, end: u64, count: usize) -> bool {
        end + ((count + 1) * BLOCK_BYTES) as u64 <= self.geometry.region_bytes
    }

    /// Seal the open region after the last write, so that the next open trusts it without
    /// reading its data back, and (by policy) write a checkpoint of the index, so that it
    /// scans no region at all. Called once no request is in flight.
    pub async fn close(&self) -> Result<()> {
        self.stop_checkpoints();
        self.seal_open_region().await?;
        if self.checkpoints.policy.on_close {
            if let Err(error) = self.checkpoint().await {
                // Without it the next open scans the log: only a store that failed is an error.
                self.writable()?;
                log::warn!(
                    "shard {}: no checkpoint on close ({error}); the next open scans the log",
                    self.shard
                );
            }
        }
        Ok(())
    }

    async fn seal_open_region(&self) -> Result<()> {
        let _section = self.allocation.enter().await;
        self.writable()?;
        let (open, end) = {
            let log = self.log.borrow();
            match log.open {
                Some(open) => (open, log.write_offset),
                None => return Ok(()),
            }
        };
        while !self.regions.borrow()[open].writes_in_flight.is_empty() {
            self.region_idle.wait().await;
        }
        self.make_durable().await?;
        let region_seq = self.regions.borrow()[open].region_seq;
        self.write_seal(open, region_seq, end).await?;
        let mut log = self.log.borrow_mut();
        log.open = None;
        log.sealed.push_back(open);
        Ok(())
    }

    /// Open a shard's store: recover its index and log from the device.
    pub async fn open(parts: StoreParts) -> Result<Store> {
        let store = Store::from_parts(parts);
        store.recover().await?;
        Ok(store)
    }

    async fn recover(&self) -> Result<()> {
        let mut used: Vec<(u64, usize)> = Vec::new();
        let mut checkpoint_parts = CheckpointParts::new();
        let mut seq_seen = 0u64;
        let mut buf = self.arena.allocate(BLOCK_BYTES);
        for region in 0..self.places.len() {
            let (result, read_buf) = read_at(
                self.file_of(region),
                buf,
                self.places[region].offset,
                BLOCK_BYTES,
            )
            .await;
            buf = read_buf;
            self.check_read(result, BLOCK_BYTES, region)?;
            let region_index = self.places[region].region_index;
            if let Some(header) = RegionHeader::decode(buf.as_slice()) {
                let ours = header.shard == self.shard
                    && header.set_uuid == self.geometry.set_uuid
                    && header.region_index == region_index
                    && header.region_seq > 0;
                if ours {
                    seq_seen = seq_seen.max(header.region_seq);
                    used.push((header.region_seq, region));
                }
            } else if let Some(header) = CheckpointHeader::decode(buf.as_slice()) {
                let ours = header.shard == self.shard
                    && header.set_uuid == self.geometry.set_uuid
                    && header.region_index == region_index;
                if ours {
                    seq_seen = seq_seen.max(header.checkpoint_seq);
                    checkpoint_parts
                        .entry(header.checkpoint_seq)
                        .or_default()
                        .push((region, header));
                }
            }
        }
        used.sort_unstable();

        let mut checkpoint = if self.checkpoints.policy.load {
            self.load_checkpoint(&checkpoint_parts).await?
        } else {
            None
        };
        // Log regions left from before the checkpoint that it does not cover: their header
        // survived a reclaim whose erasure was not yet durable. Nothing in them is current.
        let mut stale = Vec::new();
        let mut valid: HashSet<u32> = HashSet::new();
        let covered_below = match &checkpoint {
            Some(checkpoint) => {
                let on_device: HashMap<usize, u64> =
                    used.iter().map(|&(seq, region)| (region, seq)).collect();
                valid = checkpoint
                    .covered
                    .iter()
                    .filter(|&&(region, seq)| on_device.get(&(region as usize)) == Some(&seq))
                    .map(|&(region, _)| region)
                    .collect();
                used.retain(|&(seq, region)| {
                    let keep = seq >= checkpoint.covered_below || valid.contains(&(region as u32));
                    if !keep {
                        stale.push(region);
                    }
                    keep
                });
                checkpoint.covered_below
            }
            None => 0,
        };

        let mut tail_end = None;
        let mut tail_damaged = Vec::new();
        let mut scans = Vec::new();
        for (position, &(region_seq, region)) in used.iter().enumerate() {
            self.regions.borrow_mut()[region].region_seq = region_seq;
            if region_seq < covered_below {
                continue;
            }
            let newest = position + 1 == used.len();
            // The newest region needs its data verified unless it was sealed: by a clean close
            // or by an earlier recovery, both of which flushed everything before the seal.
            let mut scan = self
                .scan_region(region, region_seq, ScanMode::Sealed)
                .await?;
            // A seal is trusted even when the scan skipped damaged headers to reach it: those
            // are bit rot in a region whose writes all completed before the seal was written (a
            // torn tail has no seal after it; a seal-shaped block inside data would need this
            // region's region_seq and a valid checksum).
            let trusted_seal = scan.ends_in_seal;
            if newest && !trusted_seal {
                scan = self.scan_region(region, region_seq, ScanMode::Tail).await?;
            }
            self.count(|counters| {
                counters.damaged_headers += scan.damaged_headers;
                counters.torn_tails += u64::from(scan.torn);
            });
            if newest && !trusted_seal {
                tail_end = Some((region, region_seq, scan.end));
                tail_damaged = std::mem::take(&mut scan.damaged);
            }
            scans.push((region, scan.entries));
        }
        let scanned = scans.len() as u64;

        // One void marker per version with damaged entries in the tail, applied to this index
        // as the markers will be to later ones (and raising the seqs seen, so that the voided
        // one is never given out again). They need room at the tail's end or a free region to
        // spare (one stays for reclaim); without either (a full tail region on a full store),
        // the tail's log ends at its first damaged entry instead, as it did before such entries
        // could be passed over.
        let mut markers: Vec<EntryHeader> = Vec::new();
        for entry in &tail_damaged {
            let header = &entry.header;
            if !markers.iter().any(|marker| {
                marker.object_bytes == header.seq
                    && marker.bucket == header.bucket
                    && marker.key == header.key
            }) {
                markers.push(EntryHeader::void_marker(
                    header.bucket.clone(),
                    header.key.clone(),
                    header.seq,
                ));
            }
        }
        if let (Some((region, region_seq, end)), Some(first)) = (tail_end, tail_damaged.first()) {
            let spare_regions = self
                .places
                .len()
                .saturating_sub(used.len() + checkpoint.as_ref().map_or(0, |c| c.regions.len()));
            if !self.marker_room(end, markers.len()) && spare_regions < 2 {
                log::error!(
                    "shard {}: no room for void markers: the log of region {region} ends at its \
                     first damaged entry, and what followed it is dropped",
                    self.shard
                );
                let (_, entries) = scans.last_mut().expect("the tail was scanned");
                entries.retain(|entry| entry.offset < first.offset);
                tail_end = Some((region, region_seq, first.offset));
                markers.clear();
            }
        }

        // A checkpoint's records go straight into the index, but for the keys the scan found
        // entries of and those with a chunk in a region reclaimed since: those become
        // candidates beside what the scan found, as a full scan would have gathered them.
        let mut builder = IndexBuilder::default();
        let mut direct: Vec<(Rc<[u8]>, ObjectRecord)> = Vec::new();
        if let Some(checkpoint) = &mut checkpoint {
            builder.seq_max = checkpoint.next_seq.saturating_sub(1);
            builder.after = Some(AfterCheckpoint {
                next_seq: checkpoint.next_seq,
                in_progress: std::mem::take(&mut checkpoint.in_progress),
            });
            let mut scanned_keys: HashSet<Vec<u8>> = HashSet::new();
            let scanned_headers = scans
                .iter()
                .flat_map(|(_, entries)| entries.iter().map(|entry| &entry.header))
                .chain(&markers);
            for header in scanned_headers {
                let mut joined = header.bucket.clone();
                joined.push(0);
                joined.extend_from_slice(&header.key);
                scanned_keys.insert(joined);
            }
            let records = std::mem::take(&mut checkpoint.records);
            direct.reserve(records.len());
            for (key, record) in records {
                let moved = record
                    .chunks
                    .as_slice()
                    .iter()
                    .any(|location| !valid.contains(&location.region));
                if moved || scanned_keys.contains(&key[..]) {
                    builder.seed(ObjectKey::from_joined(&key), &record, &valid);
                } else {
                    direct.push((key, record));
                }
            }
        }
        for (region, entries) in &scans {
            for entry in entries {
                builder.add(
                    *region,
                    entry.offset,
                    &entry.header,
                    self.geometry.chunk_bytes,
                );
            }
        }
        if let Some((region, _, _)) = tail_end {
            for marker in &markers {
                builder.add(region, 0, marker, self.geometry.chunk_bytes);
            }
        }
        drop(scans);
        let seq_max = builder.seq_max;
        if builder.inconsistent > 0 {
            log::warn!(
                "shard {}: skipped {} inconsistent entries while recovering",
                self.shard,
                builder.inconsistent
            );
        }
        direct.extend(
            builder
                .finish_records()
                .into_iter()
                .map(|(key, record)| (Rc::from(key.into_joined()), record)),
        );
        *self.index.borrow_mut() = Index::built_from_shared(direct);
        self.next_seq.set(seq_max + 1);
        let mut in_use = vec![false; self.places.len()];
        for &(_, region) in &used {
            in_use[region] = true;
        }
        let region_blocks = (self.geometry.region_bytes / BLOCK_BYTES as u64) as u32;
        self.index
            .borrow()
            .assert_recovered(&in_use, region_blocks, seq_max + 1);
        let checkpoint_regions = checkpoint
            .as_ref()
            .map_or_else(Vec::new, |checkpoint| checkpoint.regions.clone());
        {
            let mut log = self.log.borrow_mut();
            log.sealed = used.iter().map(|&(_, region)| region).collect();
            log.checkpoint = checkpoint_regions.clone();
            log.free = (0..self.places.len())
                .filter(|region| !in_use[*region] && !checkpoint_regions.contains(region))
                .collect();
            // Skip one: the header of the last region opened may not have been durable, and its
            // entries may be, so its region_seq must never be used again.
            log.next_region_seq = seq_seen + 2;
            log.open = None;
            assert_eq!(
                log.sealed.len() + log.free.len() + log.checkpoint.len(),
                self.places.len(),
                "every region is sealed, free or part of the checkpoint after recovery"
            );
        }
        self.count(|counters| {
            counters.recovered_from_checkpoint = u64::from(checkpoint.is_some());
            counters.regions_scanned = scanned;
        });
        // Older and incomplete checkpoints, and stale log regions, are erased before anything
        // is written over them: none may be taken for current after a later crash.
        let stale_checkpoints = checkpoint_parts
            .values()
            .flatten()
            .map(|(region, _)| *region)
            .filter(|region| !checkpoint_regions.contains(region));
        let erase: Vec<usize> = stale.iter().copied().chain(stale_checkpoints).collect();
        for &region in &erase {
            self.erase_header(region).await?;
        }
        if let Some((region, region_seq, end)) = tail_end {
            let end = self
                .write_void_markers(region, region_seq, end, &markers)
                .await?;
            self.write_seal(region, region_seq, end).await?;
        } else if !erase.is_empty() {
            self.make_durable().await?;
        }
        let stats = self.stats();
        log::info!(
            "shard {}: recovered {} objects ({} bytes), {} of {} log regions scanned{}; {} free",
            self.shard,
            stats.objects,
            stats.object_bytes,
            scanned,
            used.len(),
            checkpoint
                .as_ref()
                .map_or(String::new(), |checkpoint| format!(
                    " after checkpoint {}",
                    checkpoint.checkpoint_seq
                )),
            stats.regions_free
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: EntryKind, seq: u64, object_bytes: u64) -> EntryHeader {
        let chunk = kind == EntryKind::Chunk;
        EntryHeader {
            kind,
            flags: ENTRY_FLAG_DIRTY,
            chunk_index: 0,
            chunk_count: u32::from(chunk),
            data_bytes: if chunk { object_bytes as u32 } else { 0 },
            seq,
            region_seq: 1,
            object_bytes,
            md5: None,
            modified_ms: 0,
            bucket: b"b".to_vec(),
            key: b"k".to_vec(),
            data_crcs: Vec::new(),
            attributes: Vec::new(),
        }
    }

    fn rebuilt(entries: &[EntryHeader]) -> (Index, u64) {
        let mut builder = IndexBuilder::default();
        for (block, header) in entries.iter().enumerate() {
            builder.add(0, (block as u64 + 1) * BLOCK_BYTES as u64, header, 4096);
        }
        let seq_max = builder.seq_max;
        (builder.finish(), seq_max)
    }

    #[test]
    fn a_voided_tombstone_deletes_nothing_and_a_voided_put_is_not_indexed() {
        let key = ObjectKey::new("b", "k").unwrap();
        // Version 5 acknowledged; a delete (7) and a put (8) that failed and were voided.
        let (index, _) = rebuilt(&[
            entry(EntryKind::Chunk, 5, 100),
            entry(EntryKind::Tombstone, 7, 0),
            entry(EntryKind::Void, 0, 7),
            entry(EntryKind::Chunk, 8, 200),
            entry(EntryKind::Void, 0, 8),
        ]);
        assert_eq!(index.get(&key).map(|record| record.seq), Some(5));
        // An acknowledged tombstone still deletes.
        let (index, _) = rebuilt(&[
            entry(EntryKind::Chunk, 5, 100),
            entry(EntryKind::Tombstone, 7, 0),
        ]);
        assert!(index.get(&key).is_none());
    }

    #[test]
    fn after_a_checkpoint_only_its_versions_those_in_progress_and_newer_ones_are_added() {
        let key = ObjectKey::new("b", "k").unwrap();
        let location = Location {
            region: 0,
            block: 1,
            first_crc: 0,
        };
        let record = ObjectRecord {
            seq: 6,
            bytes: 100,
            flags: 0,
            chunks: Chunks::One(location),
            stamp: Stamp::default().into(),
        };
        let valid: HashSet<u32> = [0].into_iter().collect();
        let after = |in_progress: &[u64]| {
            let mut builder = IndexBuilder {
                after: Some(AfterCheckpoint {
                    next_seq: 20,
                    in_progress: in_progress.iter().copied().collect(),
                }),
                ..IndexBuilder::default()
            };
            builder.seq_max = 19;
            builder
        };
        let add = |builder: &mut IndexBuilder, header: &EntryHeader| {
            builder.add(1, 8 * BLOCK_BYTES as u64, header, 4096)
        };
        // The key was deleted before the checkpoint (it holds no record); a put overtaken by
        // that delete wrote its entry again after the checkpoint's regions: not brought back.
        let mut builder = after(&[]);
        add(&mut builder, &entry(EntryKind::Chunk, 10, 100));
        assert!(builder.finish().get(&key).is_none());
        // The same put still in progress when the checkpoint was taken: it may have finished.
        let mut builder = after(&[10]);
        add(&mut builder, &entry(EntryKind::Chunk, 10, 100));
        assert_eq!(
            builder.finish().get(&key).map(|record| record.seq),
            Some(10)
        );
        // The checkpoint's own version, moved by reclaim since, and a newer version.
        let mut builder = after(&[]);
        builder.seed(key.clone(), &record, &HashSet::new());
        add(&mut builder, &entry(EntryKind::Chunk, 6, 100));
        let index = builder.finish();
        let found = index.get(&key).expect("the checkpoint's version");
        assert_eq!((found.seq, found.chunks.get(0).region), (6, 1));
        let mut builder = after(&[]);
        builder.seed(key.clone(), &record, &valid);
        add(&mut builder, &entry(EntryKind::Chunk, 21, 100));
        assert_eq!(
            builder.finish().get(&key).map(|record| record.seq),
            Some(21)
        );
        // A tombstone after the checkpoint deletes its version.
        let mut builder = after(&[]);
        builder.seed(key.clone(), &record, &valid);
        add(&mut builder, &entry(EntryKind::Tombstone, 22, 0));
        assert!(builder.finish().get(&key).is_none());
    }

    #[test]
    fn a_seq_named_only_by_a_marker_is_never_given_out_again() {
        // The voided version's entries are gone; its marker stays.
        let (_, seq_max) = rebuilt(&[
            entry(EntryKind::Chunk, 5, 100),
            entry(EntryKind::Void, 0, 9),
            entry(EntryKind::Clean, 0, 11),
        ]);
        assert!(seq_max >= 11, "{seq_max}");
    }
}
