//! A put whose bytes arrive a chunk at a time (a streamed PUT), so that an object of any size
//! is never whole in memory. Each chunk is written as it comes; the regions that hold them are
//! kept from reclaim until the put ends (a streamed chunk cannot be written again, its bytes are
//! gone), and the version is installed all at once when the last chunk is durable. A put that
//! ends before its last chunk leaves nothing behind: its chunks are never complete, and their
//! regions go back to reclaim. One that placed every chunk and then failed is voided.

use std::rc::Rc;

use super::*;
use crate::buf::ExternalBuf;

/// Chunks of one same-host put (`PutStream::write_shared`) written at once; the shard's bound on
/// streamed writes (`STREAMED_WRITES_MAX`) applies to them too.
const SHARED_WRITES_PER_PUT: usize = 4;

/// A streamed put's chunk in memory, counted in the node's bound (`streamed_bytes_max`) until
/// dropped.
pub struct StreamedChunk {
    pub data: Vec<u8>,
    /// The version's MD5 tag, on the last chunk of a put whose writer computed one (it is
    /// known only once every byte has come).
    pub md5: Option<Md5Tag>,
    /// The whole object's checksum (S3's algorithm name and base64 value), on the last chunk of
    /// a put whose first chunk's attributes promised it (`Attributes::checksum_pending`): it
    /// came after the body, and goes in the last chunk's header.
    pub checksum: Option<(String, String)>,
    pub(crate) held: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) bytes: u64,
}

impl Drop for StreamedChunk {
    fn drop(&mut self) {
        self.held
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A put in progress; see the module's comment. Dropped before `finish`, it is abandoned.
pub struct PutStream {
    store: Rc<Store>,
    key: ObjectKey,
    object_bytes: u64,
    dirty: bool,
    /// Its time (when it began) and, once the writer gives it, its MD5 tag.
    stamp: Stamp,
    /// Its encoded attributes, for the first chunk's header (empty for none).
    attributes: Vec<u8>,
    /// Encoded attributes for the last chunk's header (a checksum known only at the end;
    /// empty for none).
    closing_attributes: Vec<u8>,
    chunk_count: usize,
    /// The operation's seq, once its first chunk is placed.
    seq: Option<u64>,
    placed: Vec<PlacedEntry>,
    /// Regions holding this put's chunks, one entry per chunk (each counted in `pinned`).
    pinned: Vec<usize>,
    /// Its first chunk, written, holds attributes.
    described: bool,
    done: bool,
}

impl Store {
    /// Begin a put of `object_bytes` bytes to come, `dirty` or not, with its encoded
    /// `attributes` (empty for none).
    pub fn begin_put(
        self: &Rc<Self>,
        key: ObjectKey,
        object_bytes: u64,
        dirty: bool,
        attributes: Vec<u8>,
    ) -> Result<PutStream> {
        self.writable()?;
        self.refuse_larger_than(object_bytes, self.streamed_object_bytes_limit())?;
        let chunk_bytes = self.geometry.chunk_bytes as u64;
        self.check_attributes_room(&key, object_bytes.min(chunk_bytes) as usize, &attributes)?;
        Ok(PutStream {
            store: self.clone(),
            key,
            object_bytes,
            dirty,
            stamp: Stamp::now(),
            attributes,
            closing_attributes: Vec::new(),
            chunk_count: object_bytes.div_ceil(chunk_bytes).max(1) as usize,
            seq: None,
            placed: Vec::new(),
            pinned: Vec::new(),
            described: false,
            done: false,
        })
    }

    fn pin(&self, region: usize) {
        self.regions.borrow_mut()[region].pinned += 1;
    }

    fn unpin(&self, region: usize) {
        let mut regions = self.regions.borrow_mut();
        assert!(
            regions[region].pinned > 0,
            "a region unpinned more than pinned"
        );
        regions[region].pinned -= 1;
    }
}

impl PutStream {
    /// Bytes each chunk must hold: the chunk size, the last one the rest.
    pub fn chunk_len(&self, chunk: usize) -> usize {
        let chunk_bytes = self.store.geometry.chunk_bytes as u64;
        let start = chunk as u64 * chunk_bytes;
        (self.object_bytes - start).min(chunk_bytes) as usize
    }

    /// Chunks the object has.
    pub fn chunk_count(&self) -> usize {
        self.chunk_count
    }

    /// Put the attributes chunk `chunk`'s header carries into `header`: the first chunk's,
    /// or the closing ones on the last.
    fn header_attributes(&mut self, header: &mut EntryHeader, chunk: usize) {
        if chunk == 0 {
            header.attributes = std::mem::take(&mut self.attributes);
        } else if chunk + 1 == self.chunk_count {
            header.attributes = std::mem::take(&mut self.closing_attributes);
        }
    }

    /// The version's MD5 tag, given before its last chunk is written (whose header carries it:
    /// the bytes of a streamed put are known only once they have all come).
    pub fn set_md5(&mut self, md5: Md5Tag) {
        self.stamp.md5 = Some(md5);
    }

    /// Attributes for the last chunk's header, given before it is written: the whole object's
    /// checksum that came after the body, which the first chunk's attributes said would be
    /// there. Left out (and the checksum then unknown) where they do not fit beside the key and
    /// the chunk's checksums, or where the object has one chunk (its attributes are complete).
    pub fn set_closing_attributes(&mut self, attributes: &crate::Attributes) {
        let last = self.chunk_count - 1;
        let Ok(encoded) = attributes.encode() else {
            return;
        };
        let fits = self
            .store
            .check_attributes_room(&self.key, self.chunk_len(last), &encoded)
            .is_ok();
        if last > 0 && fits {
            self.closing_attributes = encoded;
        }
    }

    /// Chunks written so far.
    pub fn chunks_written(&self) -> usize {
        self.placed.len()
    }

    /// Write the next chunk (exactly `chunk_len` bytes); returns once it is written (not yet
    /// durable).
    pub async fn write_chunk(&mut self, data: &[u8]) -> Result<()> {
        let chunk = self.placed.len();
        assert!(chunk < self.chunk_count, "more chunks than the object has");
        assert_eq!(
            data.len(),
            self.chunk_len(chunk),
            "a chunk of the wrong size"
        );
        let store = self.store.clone();
        let _writing = store.streamed_writes.acquire().await;
        let stamp = if chunk + 1 == self.chunk_count {
            self.stamp
        } else {
            Stamp {
                md5: None,
                ..self.stamp
            }
        };
        let mut header =
            store.new_chunk_entry(&self.key, chunk, self.object_bytes, self.dirty, data, stamp);
        self.header_attributes(&mut header, chunk);
        let described = chunk == 0 && !header.attributes.is_empty();
        let buf = store.entry_buffer(&header, data);
        let place = match self.seq {
            None => {
                let (place, seq) = store
                    .allocate_operation(buf.len() as u64, &self.key)
                    .await?;
                self.seq = Some(seq);
                place
            }
            Some(_) => store.allocate(buf.len() as u64).await?,
        };
        // Pinned at once (no await since the place was given): reclaim takes only sealed
        // regions, and this one cannot be sealed before the next allocation.
        store.pin(place.region);
        self.pinned.push(place.region);
        header.seq = self.seq.expect("taken with the first place");
        let placed = store.write_placed_entry(header, buf, place).await?;
        self.placed.push(placed);
        self.described |= described;
        Ok(())
    }

    /// Write every chunk still to come from `source`, memory shared with a client on this host
    /// that holds the object's bytes from its start, up to `SHARED_WRITES_PER_PUT` chunks at
    /// once. Each chunk is copied once into the arena and checksummed there, so that what
    /// reaches the device is exactly what its checksums say even if the client changes its
    /// memory meanwhile (such a client gets whichever bytes were there when its chunk was
    /// copied). Writing straight from the client's memory would let a client that changes it
    /// during the device's read put an entry whose data fails its checksum in the log, and
    /// recovery takes such an entry in the newest region as the log's torn end, dropping what
    /// follows it: other keys' acknowledged writes. Returns once every chunk is written (not
    /// yet durable); on an error, only after every write in flight has ended. Once `abandoned`
    /// is set (the client went away), no further chunk is placed and the put ends in an error:
    /// unless every chunk was already placed, nothing of it can become visible.
    pub async fn write_shared(
        &mut self,
        source: &ExternalBuf,
        abandoned: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
        let store = self.store.clone();
        let chunk_bytes = store.geometry.chunk_bytes as usize;
        // Tasks of their own, so that they run while this one waits for the next place (which
        // may wait for them).
        let mut writes = std::collections::VecDeque::new();
        let mut failure = None;
        for chunk in self.placed.len()..self.chunk_count {
            if failure.is_some() {
                break;
            }
            if abandoned.load(std::sync::atomic::Ordering::Acquire) {
                failure = Some(Error::new(
                    ErrorKind::Io,
                    format!(
                        "the writer went away after {chunk} of {} chunks; nothing was stored",
                        self.chunk_count
                    ),
                ));
                break;
            }
            if writes.len() >= SHARED_WRITES_PER_PUT {
                match writes.pop_front().expect("a write in flight").await {
                    Ok(placed) => self.placed.push(placed),
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
            let start = chunk * chunk_bytes;
            let length = self.chunk_len(chunk);
            let stamp = if chunk + 1 == self.chunk_count {
                self.stamp
            } else {
                Stamp {
                    md5: None,
                    ..self.stamp
                }
            };
            // The copy first: the checksums are of the bytes that will be written.
            let entry_bytes = (BLOCK_BYTES + crate::buf::align_up(length)) as u64;
            let mut buf = store.arena.allocate(entry_bytes as usize);
            buf.set_len(entry_bytes as usize);
            let data = &mut buf.as_mut_slice()[BLOCK_BYTES..];
            source.with_bytes(start, length, |piece| data[..length].copy_from_slice(piece));
            data[length..].fill(0);
            let data = &buf.as_slice()[BLOCK_BYTES..BLOCK_BYTES + length];
            let mut header =
                store.new_chunk_entry(&self.key, chunk, self.object_bytes, self.dirty, data, stamp);
            debug_assert_eq!(header.entry_bytes(), entry_bytes);
            self.header_attributes(&mut header, chunk);
            self.described |= chunk == 0 && !header.attributes.is_empty();
            let place = match self.seq {
                None => match store.allocate_operation(entry_bytes, &self.key).await {
                    Ok((place, seq)) => {
                        self.seq = Some(seq);
                        place
                    }
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                },
                Some(_) => match store.allocate(entry_bytes).await {
                    Ok(place) => place,
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                },
            };
            // Pinned at once, as `write_chunk` does.
            store.pin(place.region);
            self.pinned.push(place.region);
            header.seq = self.seq.expect("taken with the first place");
            let store = store.clone();
            writes.push_back(crate::rt::spawn(async move {
                let _writing = store.streamed_writes.acquire().await;
                store.write_placed_entry(header, buf, place).await
            }));
        }
        // Every write placed is awaited, failed or not: its place stays in flight until then.
        while let Some(write) = writes.pop_front() {
            let written = write.await;
            match written {
                Ok(placed) if failure.is_none() => self.placed.push(placed),
                Ok(_) => {}
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        store.count(|counters| {
            counters.shared_bytes_written += self.object_bytes;
            counters.shared_bytes_copied += self.object_bytes;
        });
        Ok(())
    }

    /// Every chunk written: make them durable and install the version. Returns its metadata.
    pub async fn finish(mut self) -> Result<ObjectMeta> {
        assert_eq!(
            self.placed.len(),
            self.chunk_count,
            "finish before the last chunk"
        );
        let store = self.store.clone();
        let seq = self.seq.expect("a chunk was placed");
        let result = async {
            for entry in &self.placed {
                store
                    .wait_earlier_writes(entry.location.region as usize, entry.offset())
                    .await;
            }
            store.make_durable().await?;
            let regions = store.regions.borrow();
            let stale = self.placed.iter().any(|entry| {
                regions[entry.location.region as usize].region_seq != entry.region_seq
            });
            assert!(!stale, "a pinned region was reclaimed under a streamed put");
            Ok(())
        }
        .await;
        let result = match result {
            Ok(()) => {
                let locations = self.placed.iter().map(|entry| entry.location).collect();
                Ok(store.install_put(
                    &self.key,
                    seq,
                    self.object_bytes,
                    self.dirty,
                    locations,
                    self.stamp,
                    self.described,
                ))
            }
            Err(error) => Err(store.void(&self.key, seq, error).await),
        };
        self.end(result.is_ok(), true);
        if result.is_ok() {
            store.count(|counters| {
                counters.puts += 1;
                counters.bytes_written += self.object_bytes;
            });
        }
        result
    }

    /// Give the regions back to reclaim and, with `finish`, end the operation.
    fn end(&mut self, succeeded: bool, finish: bool) {
        self.done = true;
        for region in self.pinned.drain(..) {
            self.store.unpin(region);
        }
        if let (Some(seq), true) = (self.seq, finish) {
            self.store.finish_operation(&self.key, seq, succeeded);
        }
        self.store.region_idle.wake_all();
    }
}

impl Drop for PutStream {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Abandoned. Before its last chunk the version can never be complete: nothing to undo.
        // With every chunk written it might be, so it is voided, in a task of its own.
        // The operation ends once its void marker is written: until then a checkpoint must not
        // cover its entries.
        let all_placed = self.placed.len() == self.chunk_count;
        let seq = self.seq;
        self.end(false, !all_placed);
        if let (true, Some(seq)) = (all_placed, seq) {
            let store = self.store.clone();
            let key = self.key.clone();
            crate::rt::spawn(async move {
                let abandoned = Error::new(ErrorKind::Io, "the put was abandoned");
                let _ = store.void(&key, seq, abandoned).await;
                store.finish_operation(&key, seq, false);
            });
        }
    }
}
