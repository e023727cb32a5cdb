//! The read path: an object (whole or a range) from its chunks, checked piece by piece where
//! it lands (pinned buffers, or a same-host client's region).

use std::rc::Rc;

use super::*;

impl Store {
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

    pub(super) async fn read_version_into(
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
    pub(super) async fn read_chunk_into(
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
    pub(super) async fn read_version(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<VersionRead> {
        let record = {
            let mut index = self.index.borrow_mut();
            match index.set_visited(key, true) {
                Some(record) => record.clone(),
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
            stamp: record.stamp.into(),
            start,
            parts,
        }))
    }

    /// The attributes of version `seq` of `key` (none when it was written without them), read
    /// from its first chunk's header (and its last chunk's, for a checksum known only at the
    /// end); `None` when that version is not the indexed one (replaced
    /// or deleted meanwhile, or never here).
    pub async fn attributes(&self, key: &ObjectKey, seq: u64) -> Result<Option<Attributes>> {
        let (record, location) = match self.index.borrow().get(key) {
            Some(record) if record.seq == seq && !record.described() => {
                return Ok(Some(Attributes::default()))
            }
            Some(record) if record.seq == seq => (record.clone(), record.chunks.get(0)),
            _ => return Ok(None),
        };
        if let Some(cached) = self.attributes_cache.borrow().get(seq) {
            return Ok(Some((*cached).clone()));
        }
        let mut attributes = self.header_attributes(key, &record, location, 0).await?;
        if attributes.checksum_pending() {
            // The checksum came after the body: its value is in the last chunk's header.
            let last = record.chunks.as_slice().len() - 1;
            let closing = match last {
                0 => Attributes::default(),
                _ => {
                    // Looked up again after the first read: reclaim may have moved the chunk,
                    // or the version may be gone.
                    let location = match self.index.borrow().get(key) {
                        Some(now) if now.seq == seq => now.chunks.get(last),
                        _ => return Ok(None),
                    };
                    self.header_attributes(key, &record, location, last).await?
                }
            };
            let algorithm = attributes.checksum.take().map(|(algorithm, _)| algorithm);
            attributes.checksum = closing
                .checksum
                .filter(|(named, value)| Some(named) == algorithm.as_ref() && !value.is_empty());
        }
        self.attributes_cache
            .borrow_mut()
            .insert(seq, std::rc::Rc::new(attributes.clone()));
        Ok(Some(attributes))
    }

    /// The attributes in the header of chunk `chunk` of `record`'s version, at `location`,
    /// read and checked.
    async fn header_attributes(
        &self,
        key: &ObjectKey,
        record: &ObjectRecord,
        location: Location,
        chunk: usize,
    ) -> Result<Attributes> {
        let region = location.region as usize;
        let offset = self.device_offset(region, location.block as u64);
        let (result, buf) = {
            // The region's reader count keeps it from being reused while it is read (a
            // relocated copy leaves this one as it was).
            let _reader = RegionReader::new(self, region);
            read_at(
                self.file_of(region),
                self.arena.allocate(BLOCK_BYTES),
                offset,
                BLOCK_BYTES,
            )
            .await
        };
        self.check_read(result, BLOCK_BYTES, region)?;
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        let data_bytes = (record.bytes - chunk as u64 * chunk_bytes).min(chunk_bytes) as u32;
        let header = self.chunk_header(buf.as_slice(), key, record, chunk, data_bytes)?;
        let attributes = Attributes::decode(&header.attributes)
            .ok_or_else(|| self.checksum_failed(key, record, chunk, "attributes"))?;
        self.count(|counters| counters.attribute_reads += 1);
        Ok(attributes)
    }

    /// Say that reads of `key` until the guard drops want its version's attributes too: a read
    /// of the first chunk from the device then takes them from the header block (see
    /// `read_chunk`). Reads that do not want them (the native protocol's) read no header for
    /// them and leave the cache to those that do.
    pub fn want_attributes(self: &Rc<Self>, key: &ObjectKey) -> AttributesWanted {
        *self
            .attributes_wanted
            .borrow_mut()
            .entry(key.clone())
            .or_default() += 1;
        AttributesWanted {
            store: self.clone(),
            key: key.clone(),
        }
    }

    /// Whether a read of `key` wants the attributes of `record`'s version and this shard has
    /// not cached them.
    fn attributes_unread(&self, key: &ObjectKey, record: &ObjectRecord) -> bool {
        record.described()
            && self.attributes_wanted.borrow().contains_key(key)
            && self.attributes_cache.borrow().get(record.seq).is_none()
    }

    /// Cache the attributes in `header`, the first chunk header of `record`'s version, read
    /// and checked (`chunk_header`) for its data. Ones that do not decode are left for
    /// `attributes` to read and report.
    fn keep_attributes(&self, record: &ObjectRecord, header: &EntryHeader) {
        // A checksum still to be read from the last chunk's header is left for `attributes`.
        let decoded = Attributes::decode(&header.attributes);
        if let Some(attributes) = decoded.filter(|attributes| !attributes.checksum_pending()) {
            self.attributes_cache
                .borrow_mut()
                .insert(record.seq, std::rc::Rc::new(attributes));
        }
    }

    /// Read bytes `want` of one chunk and verify them. Small chunks are read without their
    /// header (the index holds their checksum), but for the first chunk of a version with
    /// attributes this shard has not cached; larger ones with it, and only the checksummed
    /// pieces that `want` touches. A first chunk's header read here leaves its version's
    /// attributes in the cache, so that a GET that wants them reads no header block again.
    pub(super) async fn read_chunk(
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
            // The header block too, in the same read, when its attributes are wanted.
            let header_bytes = if chunk == 0 && self.attributes_unread(key, record) {
                BLOCK_BYTES
            } else {
                0
            };
            let len = header_bytes + align_up(data_bytes as usize);
            let (result, buf) = read_at(
                file,
                self.arena.allocate(len),
                entry_offset + (BLOCK_BYTES - header_bytes) as u64,
                len,
            )
            .await;
            self.check_read(result, len, region)?;
            let data = &buf.as_slice()[header_bytes..header_bytes + data_bytes as usize];
            if hydrant_crc::crc32c(data) != location.first_crc {
                return Err(self.checksum_failed(key, record, chunk, "data"));
            }
            if header_bytes != 0 {
                if let Ok(header) =
                    self.chunk_header(&buf.as_slice()[..BLOCK_BYTES], key, record, 0, data_bytes)
                {
                    self.keep_attributes(record, &header);
                }
            }
            return Ok(ReadPart {
                buf,
                start: header_bytes + want.start as usize,
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
        if chunk == 0 && self.attributes_unread(key, record) {
            self.keep_attributes(record, &header);
        }
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
    pub(super) fn chunk_header(
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

    pub(super) fn check_read(
        &self,
        result: std::io::Result<usize>,
        len: usize,
        region: usize,
    ) -> Result<()> {
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
    pub(super) fn checksum_failed(
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
}

/// Counts a read in flight on a region for as long as it lives.
pub(super) struct RegionReader<'a> {
    store: &'a Store,
    region: usize,
}

impl<'a> RegionReader<'a> {
    pub(super) fn new(store: &'a Store, region: usize) -> RegionReader<'a> {
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
pub(super) fn checked_span(data_bytes: u32, piece_bytes: u32, want: &Range<u32>) -> Range<u32> {
    if data_bytes <= piece_bytes {
        return 0..data_bytes;
    }
    let first_piece = want.start / piece_bytes;
    let last_piece = (want.end - 1) / piece_bytes;
    first_piece * piece_bytes..data_bytes.min((last_piece + 1) * piece_bytes)
}

/// A read's wish for a key's attributes (`Store::want_attributes`), for as long as it lives.
pub struct AttributesWanted {
    store: Rc<Store>,
    key: ObjectKey,
}

impl Drop for AttributesWanted {
    fn drop(&mut self) {
        let mut wanted = self.store.attributes_wanted.borrow_mut();
        if let Some(count) = wanted.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                wanted.remove(&self.key);
            }
        }
    }
}
