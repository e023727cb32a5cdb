//! The write path: puts and deletes as operations on the log (placed, written, made durable by
//! group commit, then applied to the index), void markers for those that fail.

use super::*;

impl Store {
    /// Store `data` as the new version of `key`; returns once it is durable on the device.
    /// `dirty` pins it until it is written back to the origin.
    pub async fn put(&self, key: ObjectKey, data: &[u8], dirty: bool) -> Result<ObjectMeta> {
        self.put_stamped(key, data, dirty, Stamp::now(), &[]).await
    }

    /// `put` of a version that says `stamp` of itself (its time, its MD5 tag), with its encoded
    /// `attributes` (see `Attributes::encode`; empty for none).
    pub async fn put_stamped(
        &self,
        key: ObjectKey,
        data: &[u8],
        dirty: bool,
        stamp: Stamp,
        attributes: &[u8],
    ) -> Result<ObjectMeta> {
        self.writable()?;
        self.check_object_bytes(data.len() as u64)?;
        let chunk_bytes = self.geometry.chunk_bytes as usize;
        self.check_attributes_room(&key, data.len().min(chunk_bytes), attributes)?;
        let chunk_count = data.len().div_ceil(chunk_bytes).max(1);
        let entries = (0..chunk_count)
            .map(|chunk| {
                let piece = &data[(chunk * chunk_bytes).min(data.len())
                    ..((chunk + 1) * chunk_bytes).min(data.len())];
                let mut header =
                    self.new_chunk_entry(&key, chunk, data.len() as u64, dirty, piece, stamp);
                if chunk == 0 {
                    header.attributes = attributes.to_vec();
                }
                (header, piece)
            })
            .collect();
        let described = !attributes.is_empty();
        let meta = self
            .write_operation(&key, entries, Versioned::Yes, |seq, locations| {
                self.install_put(
                    &key,
                    seq,
                    data.len() as u64,
                    dirty,
                    locations,
                    stamp,
                    described,
                )
            })
            .await?;
        self.count(|counters| {
            counters.puts += 1;
            counters.bytes_written += data.len() as u64;
        });
        Ok(meta)
    }

    /// Refuse attributes that do not fit the first chunk's header (of `first_chunk_bytes`)
    /// beside the key and the chunk's checksums.
    pub(super) fn check_attributes_room(
        &self,
        key: &ObjectKey,
        first_chunk_bytes: usize,
        attributes: &[u8],
    ) -> Result<()> {
        let crcs =
            crate::format::crc_count(first_chunk_bytes as u64, self.geometry.crc_block_bytes);
        let room =
            crate::format::attributes_room(key.bucket_bytes().len() + key.key_bytes().len(), crcs);
        if attributes.len() > room {
            return Err(Error::new(
                ErrorKind::AttributesTooLarge,
                format!(
                    "the object's headers and metadata take {} bytes; beside a key of {} bytes this store has room for {room}",
                    attributes.len(),
                    key.key_bytes().len()
                ),
            ));
        }
        Ok(())
    }

    /// Refuse an object this shard cannot hold beside the rest of its data.
    pub(super) fn check_object_bytes(&self, object_bytes: u64) -> Result<()> {
        self.refuse_larger_than(object_bytes, self.object_bytes_limit())
    }

    /// TOO_LARGE for an object of more than `limit` bytes.
    pub(super) fn refuse_larger_than(&self, object_bytes: u64, limit: u64) -> Result<()> {
        if object_bytes > limit {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "an object of {object_bytes} bytes does not fit beside the rest of shard {}: its limit is {limit} bytes",
                    self.shard
                ),
            ));
        }
        Ok(())
    }

    /// The entry header of chunk `chunk` of a put of `object_bytes` (its seq is set when its
    /// operation's first entry is placed).
    pub(super) fn new_chunk_entry(
        &self,
        key: &ObjectKey,
        chunk: usize,
        object_bytes: u64,
        dirty: bool,
        piece: &[u8],
        stamp: Stamp,
    ) -> EntryHeader {
        let crcs = data_checksums(piece, self.geometry.crc_block_bytes as usize);
        self.chunk_entry_checksummed(key, chunk, object_bytes, dirty, (piece.len(), crcs), stamp)
    }

    /// `new_chunk_entry` of a chunk of `data_bytes` whose piece checksums (`data_crcs`) are
    /// already known.
    pub(super) fn chunk_entry_checksummed(
        &self,
        key: &ObjectKey,
        chunk: usize,
        object_bytes: u64,
        dirty: bool,
        (data_bytes, data_crcs): (usize, Vec<u32>),
        stamp: Stamp,
    ) -> EntryHeader {
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        EntryHeader {
            kind: EntryKind::Chunk,
            flags: if dirty { ENTRY_FLAG_DIRTY } else { 0 },
            chunk_index: chunk as u32,
            chunk_count: object_bytes.div_ceil(chunk_bytes).max(1) as u32,
            data_bytes: data_bytes as u32,
            seq: 0,
            region_seq: 0,
            object_bytes,
            md5: stamp.md5,
            modified_ms: stamp.modified_ms,
            bucket: key.bucket_bytes().to_vec(),
            key: key.key_bytes().to_vec(),
            data_crcs,
            attributes: Vec::new(),
        }
    }

    /// Make version `seq` of `key` (its chunks at `locations`, all durable) the indexed one,
    /// unless a newer operation on the key already finished. `described`: its first chunk's
    /// header holds attributes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn install_put(
        &self,
        key: &ObjectKey,
        seq: u64,
        object_bytes: u64,
        dirty: bool,
        locations: Vec<Location>,
        stamp: Stamp,
        described: bool,
    ) -> ObjectMeta {
        let record = ObjectRecord {
            seq,
            bytes: object_bytes,
            flags: if dirty { RECORD_FLAG_DIRTY } else { 0 }
                | if described { RECORD_FLAG_ATTRIBUTES } else { 0 },
            chunks: Chunks::from_vec(locations),
            stamp: stamp.into(),
        };
        let meta = ObjectMeta::of(key, &record);
        if seq > self.pending.borrow()[key].newest_finished {
            self.index.borrow_mut().install(key.clone(), record);
        }
        meta
    }

    /// The largest object a streamed put accepts: as many whole chunk entries as the regions
    /// beside the reserve (and the open one) hold, and never less than a put from memory
    /// accepts. Its chunks stay pinned until it ends, so it never reclaims them; other data may
    /// be evicted (or, if pinned, make it fail with NoSpace midway, leaving nothing behind).
    pub(super) fn streamed_object_bytes_limit(&self) -> u64 {
        let usable_regions = self.places.len().saturating_sub(self.regions_kept() + 1) as u64;
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        let entries_per_region =
            (self.geometry.region_bytes - BLOCK_BYTES as u64) / (chunk_bytes + BLOCK_BYTES as u64);
        (usable_regions * entries_per_region * chunk_bytes).max(self.object_bytes_limit())
    }

    /// The largest object a put accepts on this shard: half of what its regions can hold beside
    /// the reserve that reclaim needs (and the checkpoint's regions), so that writing it never
    /// has to reclaim its own chunks.
    pub(super) fn object_bytes_limit(&self) -> u64 {
        let usable_regions = self.places.len().saturating_sub(self.regions_kept()) as u64;
        usable_regions * (self.geometry.region_bytes - BLOCK_BYTES as u64) / 2
    }

    /// Delete `key`; returns whether it was stored. A tombstone is written (and made durable)
    /// either way, so that no older copy on the device can come back after a restart.
    pub async fn delete(&self, key: ObjectKey) -> Result<bool> {
        self.writable()?;
        let header = EntryHeader::marker(
            EntryKind::Tombstone,
            key.bucket_bytes().to_vec(),
            key.key_bytes().to_vec(),
            0,
        );
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
    pub(super) async fn write_operation<T>(
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
                self.write_placed_entry(entries[0].0.clone(), first, None, place)
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
    pub(super) async fn void(&self, key: &ObjectKey, seq: u64, error: Error) -> Error {
        if self.failure.borrow().is_some() {
            return error;
        }
        let header =
            EntryHeader::void_marker(key.bucket_bytes().to_vec(), key.key_bytes().to_vec(), seq);
        // The marker comes after every entry of the version in the log, so it is reclaimed
        // only once they are gone (reclaim takes the oldest region first and never moves
        // entries the index does not hold).
        let written = async {
            // The one write that may take the region kept for reclaim: without the marker
            // the store would have to stop.
            let buf = self.entry_buffer(&header, &[]);
            let place = self.allocate_taking_reserve(buf.len() as u64).await?;
            let placed = self.write_placed_entry(header, buf, None, place).await?;
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

    /// Start an operation whose first entry went into a region opened as `region_seq`.
    pub(super) fn begin_operation(&self, key: &ObjectKey, region_seq: u64) -> u64 {
        let seq = self.take_seq();
        self.operations.borrow_mut().insert(seq, region_seq);
        let mut pending = self.pending.borrow_mut();
        let entry = pending.entry(key.clone()).or_default();
        entry.newest_started = seq;
        entry.running += 1;
        seq
    }

    pub(super) fn finish_operation(&self, key: &ObjectKey, seq: u64, succeeded: bool) {
        let started = self.operations.borrow_mut().remove(&seq);
        assert!(started.is_some(), "an operation finished twice");
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
    pub(super) async fn wait_earlier_writes(&self, region: usize, offset: u64) {
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
    pub(super) fn entry_buffer(&self, header: &EntryHeader, data: &[u8]) -> IoBuf {
        let entry_bytes = header.entry_bytes() as usize;
        let mut buf = self.arena.allocate(entry_bytes);
        buf.set_len(entry_bytes);
        let bytes = buf.as_mut_slice();
        bytes[BLOCK_BYTES..BLOCK_BYTES + data.len()].copy_from_slice(data);
        bytes[BLOCK_BYTES + data.len()..].fill(0);
        buf
    }

    /// Write one entry (header and data) into the log; returns where it went. Not yet durable.
    pub(super) async fn write_entry(
        &self,
        header: EntryHeader,
        data: &[u8],
    ) -> Result<PlacedEntry> {
        let buf = self.entry_buffer(&header, data);
        let place = self.allocate(buf.len() as u64).await?;
        self.write_placed_entry(header, buf, None, place).await
    }

    /// Seal `header` (with its place's region_seq) into `buf` and write it where it was placed
    /// (with `client`'s bytes after its first block: see `write_placed`).
    pub(super) async fn write_placed_entry(
        &self,
        mut header: EntryHeader,
        mut buf: IoBuf,
        client: Option<crate::buf::ExternalBuf>,
        place: space::Place,
    ) -> Result<PlacedEntry> {
        header.region_seq = place.region_seq;
        header.encode_into(&mut buf.as_mut_slice()[..BLOCK_BYTES]);
        self.write_placed(&place, buf, client).await?;
        Ok(placed_entry(&header, &place))
    }

    /// A write placed by `allocate` has ended: release the region's in-flight count.
    fn release_placed(&self, place: &space::Place) {
        let removed = self.regions.borrow_mut()[place.region]
            .writes_in_flight
            .remove(&place.offset);
        assert!(removed, "a write completed that was never placed");
        self.region_idle.wake_all();
    }

    /// Write `buf` where `allocate` placed it, then release the region's in-flight count. With
    /// `client` (whole blocks of a same-host client's memory), `buf`'s first block, then
    /// `client` where it lies, then the rest of `buf`, in one write.
    pub(super) async fn write_placed(
        &self,
        place: &space::Place,
        buf: IoBuf,
        client: Option<crate::buf::ExternalBuf>,
    ) -> Result<()> {
        let file = self.file_of(place.region);
        let offset = self.places[place.region].offset + place.offset;
        let (result, _buf) = match client {
            None => write_at(file, buf, offset).await,
            Some(client) => {
                crate::rt::op::write_split_at(file, buf, BLOCK_BYTES, client, offset).await
            }
        };
        self.release_placed(place);
        result.map_err(|error| {
            self.fail(
                format!("write to region {} at {}", place.region, place.offset),
                error,
            )
        })
    }

    /// Wait until every write completed so far is durable (group commit).
    pub(super) async fn make_durable(&self) -> Result<()> {
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
}

/// Where an entry with `header` written at `place` went.
fn placed_entry(header: &EntryHeader, place: &space::Place) -> PlacedEntry {
    PlacedEntry {
        location: Location {
            region: place.region as u32,
            block: (place.offset / BLOCK_BYTES as u64) as u32,
            first_crc: header.data_crcs.first().copied().unwrap_or(0),
        },
        region_seq: place.region_seq,
    }
}
