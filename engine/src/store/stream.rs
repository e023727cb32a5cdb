//! A put whose bytes arrive a chunk at a time (a streamed PUT), so that an object of any size
//! is never whole in memory. Each chunk is written as it comes; the regions that hold them are
//! kept from reclaim until the put ends (a streamed chunk cannot be written again, its bytes are
//! gone), and the version is installed all at once when the last chunk is durable. A put that
//! ends before its last chunk leaves nothing behind: its chunks are never complete, and their
//! regions go back to reclaim. One that placed every chunk and then failed is voided.

use std::rc::Rc;

use super::*;
use crate::buf::ExternalBuf;

/// Chunks of one put being written at once, streamed or same-host (the shard's bound on
/// streamed writes, `STREAMED_WRITES_MAX`, applies to them too): a put that waited for each
/// chunk's write before starting the next left the device idle between them, and one writer
/// got about half of what the device takes.
const CHUNK_WRITES_PER_PUT: usize = 4;

/// A streamed put's chunk in memory, counted in the node's bound (`streamed_bytes_max`) until
/// dropped.
pub struct StreamedChunk {
    /// Its bytes, written to the device where they lie.
    pub data: crate::buf::ChunkData,
    /// The version's MD5 tag, on the last chunk of a put whose writer computed one (it is
    /// known only once every byte has come).
    pub md5: Option<Md5Tag>,
    /// The whole object's checksum (S3's algorithm name and base64 value), on the last chunk of
    /// a put whose first chunk's attributes promised it (`Attributes::checksum_pending`): it
    /// came after the body, and goes in the last chunk's header.
    pub checksum: Option<(String, String)>,
    /// The CRC32C of each of `data`'s pieces of the store's `crc_block_bytes` (the last one
    /// shorter), where whoever filled it computed them as the bytes came (a TCP PUT's
    /// connection, in the pass that checks its frames' checksums); `None`: the shard computes
    /// them.
    pub crcs: Option<Vec<u32>>,
    pub(crate) held: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) bytes: u64,
}

impl Drop for StreamedChunk {
    fn drop(&mut self) {
        self.held
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A chunk's entry, ready to be placed and written.
enum ChunkWrite {
    /// All of it in `buf`: a header block to fill, `length` data bytes, zeros to the block
    /// boundary.
    Whole {
        buf: crate::buf::IoBuf,
        length: usize,
        /// The data's piece checksums, when the writer computed them.
        crcs: Option<Vec<u32>>,
    },
    /// `whole`, the chunk's bytes in a same-host client's memory (starting aligned for direct
    /// I/O), written as a header block (`buf`'s first), the whole blocks of `whole` where they
    /// lie (`whole_blocks`), then the rest of `buf` (a copy of the last partial block, zeros to
    /// its end).
    Split {
        buf: crate::buf::IoBuf,
        whole: ExternalBuf,
    },
}

/// The whole blocks at the start of `bytes`.
fn whole_blocks(bytes: &ExternalBuf) -> ExternalBuf {
    bytes
        .slice(0, bytes.len() / BLOCK_BYTES * BLOCK_BYTES)
        .expect("within the bytes")
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
    /// Chunks whose write has started (placed, or in flight).
    started: usize,
    /// Where the chunks whose writes ended went, in order.
    placed: Vec<PlacedEntry>,
    /// The writes in flight, in order after `placed` (at most `CHUNK_WRITES_PER_PUT`).
    writes: std::collections::VecDeque<crate::rt::JoinHandle<Result<PlacedEntry>>>,
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
            started: 0,
            placed: Vec::new(),
            writes: std::collections::VecDeque::new(),
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

    /// Write the next chunk (exactly `chunk_len` bytes) from where it lies, holding `hold`
    /// (the chunk's room in the node's bound) until its write may start: from then on the
    /// chunk counts among the shard's `STREAMED_WRITES_MAX`, as an arena copy would, and the
    /// room goes to the next chunk. Returns once its write has started, or, with
    /// `CHUNK_WRITES_PER_PUT` of this put's writes in flight, once the oldest has ended; an
    /// error of a write shows here or in `finish`.
    pub async fn write_streamed(
        &mut self,
        data: crate::buf::ChunkData,
        crcs: Option<Vec<u32>>,
        hold: impl Sized,
    ) -> Result<()> {
        assert_eq!(
            data.len(),
            self.chunk_len(self.started),
            "a chunk of the wrong size"
        );
        let permit = self.make_room().await?;
        drop(hold);
        let length = data.len();
        self.start_write(
            ChunkWrite::Whole {
                buf: data.into_entry_buf(),
                length,
                crcs,
            },
            permit,
        )
        .await
    }

    /// Write every chunk still to come from `source`, memory shared with a client on this host
    /// that holds the object's bytes from its start. A chunk whose start is aligned for direct
    /// I/O is checksummed where it lies and written straight from there, between its header
    /// block and a copy of its last partial block, in one vectored write, on devices that
    /// allow it (`device::allows_unstable_writes`); others are copied into an arena buffer
    /// first. A client that changes its memory during the write
    /// costs itself that object: its entry may then not match its checksums, so that reads of
    /// it fail their check, and recovery voids it (never taking it for the log's torn end, which
    /// would drop other keys' acknowledged writes after it: see `ScanMode::Tail`). Returns once
    /// every chunk is written (not yet durable); on an error, only after every write in flight
    /// has ended. Once `abandoned` is set (the client went away), no further chunk is placed
    /// and the put ends in an error: unless every chunk was already placed, nothing of it can
    /// become visible.
    pub async fn write_shared(
        &mut self,
        source: &ExternalBuf,
        abandoned: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
        let chunk_bytes = self.store.geometry.chunk_bytes as usize;
        let mut result = Ok(());
        let mut copied = 0u64;
        for chunk in self.started..self.chunk_count {
            if abandoned.load(std::sync::atomic::Ordering::Acquire) {
                result = Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "the writer went away after {chunk} of {} chunks; nothing was stored",
                        self.chunk_count
                    ),
                ));
                break;
            }
            let start = chunk * chunk_bytes;
            let length = self.chunk_len(chunk);
            let whole = source.slice(start, length).expect("within the source");
            let direct =
                self.store.writes_from_client_memory && length >= BLOCK_BYTES && whole.is_aligned();
            result = if direct {
                copied += (length % BLOCK_BYTES) as u64;
                self.start_shared_chunk(whole).await
            } else {
                copied += length as u64;
                self.start_chunk(|room| {
                    whole.with_bytes(0, length, |piece| room.copy_from_slice(piece))
                })
                .await
            };
            if result.is_err() {
                break;
            }
        }
        let written = self.drain().await;
        result.and(written)?;
        self.store.count(|counters| {
            counters.shared_bytes_written += self.object_bytes;
            counters.shared_bytes_copied += copied;
        });
        Ok(())
    }

    /// Place the next chunk, `whole` in a same-host client's memory (starting aligned for
    /// direct I/O), and start its write in a task of its own: its whole blocks from where they
    /// lie, between the header block and a copy of the last partial block in one arena buffer.
    /// As `start_chunk`, but the arena holds at most two blocks of it.
    async fn start_shared_chunk(&mut self, whole: ExternalBuf) -> Result<()> {
        let permit = self.make_room().await?;
        let body = whole.len() / BLOCK_BYTES * BLOCK_BYTES;
        let rest = whole.len() - body;
        let mut buf = self
            .store
            .arena
            .allocate(BLOCK_BYTES + crate::buf::align_up(rest));
        buf.set_len(BLOCK_BYTES + crate::buf::align_up(rest));
        let tail = &mut buf.as_mut_slice()[BLOCK_BYTES..];
        whole.with_bytes(body, rest, |piece| tail[..rest].copy_from_slice(piece));
        tail[rest..].fill(0);
        self.start_write(ChunkWrite::Split { buf, whole }, permit)
            .await
    }

    /// Copy the next chunk into an entry's buffer (`fill` is given exactly its bytes), place
    /// it and start its write in a task of its own (so that it runs while this put waits for
    /// its next chunk or place, and the next place may wait for it). Waits first while
    /// `CHUNK_WRITES_PER_PUT` of this put's writes are in flight, then for one of the shard's
    /// `STREAMED_WRITES_MAX`, which the write holds until it ends: the buffer is taken only
    /// then, so the chunks a shard holds in memory stay few however many puts arrive.
    async fn start_chunk(&mut self, fill: impl FnOnce(&mut [u8])) -> Result<()> {
        let permit = self.make_room().await?;
        let length = self.chunk_len(self.started);
        let entry_bytes = BLOCK_BYTES + crate::buf::align_up(length);
        let mut buf = self.store.arena.allocate(entry_bytes);
        buf.set_len(entry_bytes);
        let room = &mut buf.as_mut_slice()[BLOCK_BYTES..];
        fill(&mut room[..length]);
        room[length..].fill(0);
        self.start_write(
            ChunkWrite::Whole {
                buf,
                length,
                crcs: None,
            },
            permit,
        )
        .await
    }

    /// Wait while `CHUNK_WRITES_PER_PUT` of this put's writes are in flight, then for one of
    /// the shard's `STREAMED_WRITES_MAX`.
    async fn make_room(&mut self) -> Result<crate::rt::sync::OwnedPermit> {
        assert!(
            self.started < self.chunk_count,
            "more chunks than the object has"
        );
        while self.writes.len() >= CHUNK_WRITES_PER_PUT {
            let placed = self.writes.pop_front().expect("a write in flight").await?;
            self.placed.push(placed);
        }
        Ok(self.store.streamed_writes.acquire_owned().await)
    }

    /// Place the next chunk, whose entry `write` holds, and write it in a task of its own
    /// holding `permit`.
    async fn start_write(
        &mut self,
        mut write: ChunkWrite,
        permit: crate::rt::sync::OwnedPermit,
    ) -> Result<()> {
        let store = self.store.clone();
        let chunk = self.started;
        let stamp = if chunk + 1 == self.chunk_count {
            self.stamp
        } else {
            Stamp {
                md5: None,
                ..self.stamp
            }
        };
        let header_of = |data: &[u8]| {
            store.new_chunk_entry(&self.key, chunk, self.object_bytes, self.dirty, data, stamp)
        };
        let (entry_bytes, mut header) = match &mut write {
            ChunkWrite::Whole { buf, length, crcs } => {
                let data = &buf.as_slice()[BLOCK_BYTES..BLOCK_BYTES + *length];
                let header = match crcs.take() {
                    Some(crcs) => {
                        debug_assert_eq!(
                            crcs,
                            crate::format::data_checksums(
                                data,
                                store.geometry.crc_block_bytes as usize
                            ),
                            "a chunk's checksums as its writer computed them"
                        );
                        store.chunk_entry_checksummed(
                            &self.key,
                            chunk,
                            self.object_bytes,
                            self.dirty,
                            (data.len(), crcs),
                            stamp,
                        )
                    }
                    None => header_of(data),
                };
                (buf.len(), header)
            }
            ChunkWrite::Split { buf, whole } => {
                let mut header = whole.with_bytes(0, whole.len(), header_of);
                header.flags |= crate::format::ENTRY_FLAG_FROM_CLIENT;
                (buf.len() + whole_blocks(whole).len(), header)
            }
        };
        debug_assert_eq!(header.entry_bytes(), entry_bytes as u64);
        self.header_attributes(&mut header, chunk);
        let described = chunk == 0 && !header.attributes.is_empty();
        let place = match self.seq {
            None => {
                let (place, seq) = store
                    .allocate_operation(entry_bytes as u64, &self.key)
                    .await?;
                self.seq = Some(seq);
                place
            }
            Some(_) => store.allocate(entry_bytes as u64).await?,
        };
        // Pinned at once (no await since the place was given): reclaim takes only sealed
        // regions, and this one cannot be sealed before the next allocation.
        store.pin(place.region);
        self.pinned.push(place.region);
        self.described |= described;
        self.started += 1;
        header.seq = self.seq.expect("taken with the first place");
        self.writes.push_back(crate::rt::spawn(async move {
            let _permit = permit;
            let (buf, client) = match write {
                ChunkWrite::Whole { buf, .. } => (buf, None),
                ChunkWrite::Split { buf, whole } => (buf, Some(whole_blocks(&whole))),
            };
            store.write_placed_entry(header, buf, client, place).await
        }));
        Ok(())
    }

    /// Wait for every write in flight, keeping where each went; the first error, once all
    /// have ended (a place stays in flight until its write ends).
    async fn drain(&mut self) -> Result<()> {
        let mut result = Ok(());
        while let Some(write) = self.writes.pop_front() {
            match write.await {
                Ok(placed) if result.is_ok() => self.placed.push(placed),
                Ok(_) => {}
                Err(error) => {
                    if result.is_ok() {
                        result = Err(error);
                    }
                }
            }
        }
        result
    }

    /// Every chunk written: make them durable and install the version. Returns its metadata.
    pub async fn finish(mut self) -> Result<ObjectMeta> {
        assert_eq!(
            self.started, self.chunk_count,
            "finish before the last chunk"
        );
        let store = self.store.clone();
        let seq = self.seq.expect("a chunk was placed");
        let result = async {
            self.drain().await?;
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
        // Abandoned. Before its last chunk was started the version can never be complete:
        // nothing to undo. With every chunk started it might be, so it is voided once their
        // writes have ended, in a task of its own. The operation ends once its void marker is
        // written: until then a checkpoint must not cover its entries.
        let all_started = self.started == self.chunk_count;
        let writes = std::mem::take(&mut self.writes);
        if !all_started || self.seq.is_none() {
            self.end(false, true);
            return;
        }
        let seq = self.seq.expect("checked");
        self.end(false, false);
        let store = self.store.clone();
        let key = self.key.clone();
        crate::rt::spawn(async move {
            for write in writes {
                let _ = write.await;
            }
            let abandoned = Error::new(ErrorKind::Io, "the put was abandoned");
            let _ = store.void(&key, seq, abandoned).await;
            store.finish_operation(&key, seq, false);
        });
    }
}
