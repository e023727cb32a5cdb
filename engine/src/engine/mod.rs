//! The front door: open the devices, check or write their superblocks, start one shard per core,
//! and route every call to the shard that owns its key.

use std::future::Future;
use std::rc::Rc;

use crate::attributes::Attributes;
use crate::buf::ExternalBuf;
use crate::cache::{Cache, CacheRead, Precondition, PutSource};
use crate::device::{Device, DeviceConfig};
use crate::format::{
    Superblock, SuperblockProblem, BLOCK_BYTES, CHUNK_BYTES_MAX, CRC_BLOCK_BYTES_MIN,
    FORMAT_VERSION, PLACEMENT_CRC32C, REGIONS_OFFSET_BYTES, REGION_BYTES_MAX, SUPERBLOCK_OFFSETS,
};
use crate::origin::{OriginConfig, OriginStats, Origins};
use crate::rt::channel;
use crate::shard::{self, Message};
use crate::stamp::Md5Tag;
use crate::store::{ByteRange, Geometry, ObjectKey, ObjectMeta, ShardStats};
use crate::{Error, ErrorKind, Result};

mod config;
mod listing;
mod open;
mod origin_work;
mod superblocks;

pub use config::*;

/// Most objects one `list` call returns.
pub const LIST_LIMIT_MAX: usize = 10_000;

/// An object's metadata and the bytes a get asked for.
pub type ObjectData = (ObjectMeta, Vec<u8>);

/// Chunks of one streamed put queued for its shard beyond the one being written.
const PUT_STREAM_CHUNKS_QUEUED: usize = 2;
/// How often a streamed put waiting for room in the node's bound looks again.
const STREAMED_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

pub use crate::store::StreamedChunk;

/// Reads of an object and its attributes that may start again when a write replaces it between
/// the two; beyond, the reader is told to retry.
const DESCRIBED_ATTEMPTS_MAX: usize = 4;

/// What `get_shared_key` answers.
pub struct SharedRead {
    pub meta: ObjectMeta,
    pub data: bytes::Bytes,
    /// The origin's version tag for data read through (0 for data on NVMe).
    pub origin_version: u64,
    pub attributes: Attributes,
}

fn replaced_while_read(key: &ObjectKey) -> Error {
    Error::new(
        ErrorKind::Busy,
        format!(
            "{}/{} was replaced {DESCRIBED_ATTEMPTS_MAX} times while it was read; retry",
            key.bucket(),
            key.key()
        ),
    )
}

/// The receiving end of a streamed put's chunks (on the owning shard).
struct StreamedChunks(channel::Receiver<StreamedChunk>);

/// The sending end of a streamed put (see `EngineHandle::put_stream`).
pub struct PutSink {
    chunks: channel::Sender<StreamedChunk>,
}

impl PutSink {
    /// Send the next chunk; waits while the shard has `PUT_STREAM_CHUNKS_QUEUED` waiting.
    /// `false` when the put has already ended (its outcome is the error to report).
    pub async fn send(&self, chunk: StreamedChunk) -> bool {
        self.chunks.send(chunk).await.is_ok()
    }
}

/// A running engine: it owns the shard threads and the devices, and stops them when closed or
/// dropped. Its calls (through `Deref` to [`EngineHandle`]) go to the shard that owns their key
/// and may be awaited from any executor or with `rt::block_on`.
pub struct Engine {
    handle: EngineHandle,
    threads: Vec<std::thread::JoinHandle<()>>,
    devices: Vec<Device>,
    geometry: Geometry,
}

/// A cheap, cloneable way to reach a running engine's shards, for any thread (shard threads
/// included: a shard's task may call another shard through it). It does not keep the engine
/// running: once the engine stops, calls answer `ShuttingDown`.
#[derive(Clone)]
pub struct EngineHandle {
    inboxes: Vec<channel::Sender<Message>>,
    object_bytes_max: u64,
    origins: Option<std::sync::Arc<Origins>>,
    chunk_bytes: u32,
    crc_block_bytes: u32,
    /// Bytes of streamed puts' chunks held in memory, all shards (see `StreamedChunk`).
    streamed_bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    streamed_bytes_max: u64,
}

impl std::ops::Deref for Engine {
    type Target = EngineHandle;

    fn deref(&self) -> &EngineHandle {
        &self.handle
    }
}

impl Engine {
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// A handle for other threads and tasks.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stop every shard after the requests in flight finish. Everything acknowledged is already
    /// durable, so there is nothing else to write.
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for inbox in &self.handle.inboxes {
            let _ = crate::rt::block_on(inbox.send(Message::Stop));
        }
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                log::error!("a shard thread panicked");
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

impl EngineHandle {
    /// The largest object a put accepts.
    pub fn object_bytes_max(&self) -> u64 {
        self.object_bytes_max
    }

    /// The chunk size: a streamed put's chunks are this large, the last one the rest.
    pub fn chunk_bytes(&self) -> u64 {
        u64::from(self.chunk_bytes)
    }

    /// Stored data is checksummed in pieces of this many bytes (`StreamedChunk::crcs`).
    pub fn crc_block_bytes(&self) -> u32 {
        self.crc_block_bytes
    }

    /// Whether a put of `object_bytes` at `key` has room for `attributes` in its first chunk's
    /// header, beside the key and the chunk's checksums (a put refuses them with
    /// ATTRIBUTES_TOO_LARGE otherwise).
    pub fn attributes_fit(
        &self,
        key: &ObjectKey,
        object_bytes: u64,
        attributes: &crate::Attributes,
    ) -> bool {
        let Ok(encoded) = attributes.encode() else {
            return false;
        };
        let crcs =
            crate::format::crc_count(object_bytes.min(self.chunk_bytes()), self.crc_block_bytes);
        let names = key.bucket_bytes().len() + key.key_bytes().len();
        encoded.len() <= crate::format::attributes_room(names, crcs)
    }

    /// Room for a streamed put's chunk of `bytes` in memory, within the node's bound
    /// (`streamed_bytes_max`, all streams together): waits while the bound is reached, so that
    /// writers slow down instead of the node running out of memory. The room goes back when
    /// the chunk (an empty vector of that capacity, to be filled) is dropped.
    pub async fn streamed_chunk(&self, bytes: usize) -> StreamedChunk {
        loop {
            if let Some(chunk) = self.try_streamed_chunk(bytes) {
                return chunk;
            }
            crate::rt::time::sleep(STREAMED_POLL_INTERVAL).await;
        }
    }

    /// `streamed_chunk` without waiting: `None` while the node's bound is reached (for callers
    /// off the shards, which wait on timers of their own).
    pub fn try_streamed_chunk(&self, bytes: usize) -> Option<StreamedChunk> {
        self.try_streamed_room(bytes, true)
    }

    /// `try_streamed_chunk`, with its data allocated (`allocate`) or not: room in the node's
    /// bound for bytes the caller keeps in memory of its own.
    pub fn try_streamed_room(&self, bytes: usize, allocate: bool) -> Option<StreamedChunk> {
        use std::sync::atomic::Ordering;
        let bytes = bytes as u64;
        loop {
            let held = self.streamed_bytes.load(Ordering::Acquire);
            // One chunk always fits, so that a bound smaller than a chunk cannot stall.
            if held != 0 && held + bytes > self.streamed_bytes_max {
                return None;
            }
            if self
                .streamed_bytes
                .compare_exchange(held, held + bytes, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(StreamedChunk {
                    data: if allocate {
                        crate::buf::ChunkData::with_capacity(bytes as usize)
                    } else {
                        crate::buf::ChunkData::default()
                    },
                    md5: None,
                    checksum: None,
                    crcs: None,
                    held: self.streamed_bytes.clone(),
                    bytes,
                });
            }
        }
    }

    /// Bytes of streamed chunks held in memory now, all shards.
    pub fn streamed_bytes(&self) -> u64 {
        self.streamed_bytes
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A put of `object_bytes` bytes that arrive a chunk at a time: send them with the
    /// returned `PutSink` (each exactly `chunk_bytes`, the last the rest), in order, then
    /// `finish`; dropping the sink before the last chunk abandons the put (nothing becomes
    /// visible). The returned future runs the put on the owning shard and must be driven
    /// meanwhile (spawned), else the sink waits for ever; it ends with the put's outcome.
    pub fn put_stream(
        &self,
        bucket: &str,
        key: &str,
        object_bytes: u64,
    ) -> Result<(
        PutSink,
        impl Future<Output = Result<ObjectMeta>> + Send + 'static,
    )> {
        self.put_stream_key(
            ObjectKey::new(bucket, key)?,
            object_bytes,
            Precondition::Any,
            &Attributes::default(),
        )
    }

    /// `put_stream` of a key already made (a staged key, see `ObjectKey::staged`, among
    /// others), on the `precondition`, with `attributes` (see `put_tagged`).
    pub fn put_stream_key(
        &self,
        key: ObjectKey,
        object_bytes: u64,
        precondition: Precondition,
        attributes: &Attributes,
    ) -> Result<(
        PutSink,
        impl Future<Output = Result<ObjectMeta>> + Send + 'static,
    )> {
        self.check_object_bytes(object_bytes)?;
        let attributes = attributes.encode()?;
        let (chunks, received) = channel::bounded(PUT_STREAM_CHUNKS_QUEUED);
        let shard = self.shard_of(&key);
        let done = self.on_shard(shard, move |cache| async move {
            let received = StreamedChunks(received);
            cache
                .put_stream(
                    key,
                    object_bytes,
                    PutSource::Streamed(&received.0),
                    precondition,
                    attributes,
                )
                .await
        });
        Ok((PutSink { chunks }, done))
    }

    /// A put of the first `object_bytes` bytes of `source`, memory shared with a client on this
    /// host, by the bucket's write mode as `put_stream`: the owning shard copies each chunk once
    /// from that memory into its own and writes it from there (see `PutStream::write_shared`),
    /// with no socket between the client and the shard. A client that changes the bytes before
    /// the put ends gets whichever bytes were there when each chunk was copied; nothing else is
    /// affected. Setting `abandoned` (the client went away) stops the put before its next chunk:
    /// it then fails and leaves nothing visible, unless every chunk was already written.
    pub fn put_shared(
        &self,
        key: ObjectKey,
        source: ExternalBuf,
        abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
        object_bytes: u64,
        precondition: Precondition,
        attributes: &Attributes,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        let call = self.check_object_bytes(object_bytes).and_then(|()| {
            if object_bytes > source.len() as u64 {
                return Err(Error::new(
                    ErrorKind::InvalidRange,
                    format!(
                        "a put of {object_bytes} bytes from {} bytes of shared memory",
                        source.len()
                    ),
                ));
            }
            let attributes = attributes.encode()?;
            let shard = self.shard_of(&key);
            Ok(self.on_shard(shard, move |cache| async move {
                cache
                    .put_stream(
                        key,
                        object_bytes,
                        PutSource::Shared(source, abandoned),
                        precondition,
                        attributes,
                    )
                    .await
            }))
        });
        async move { call?.await }
    }

    pub fn shard_count(&self) -> usize {
        self.inboxes.len()
    }

    /// The shard that owns `key`.
    pub fn shard_of(&self, key: &ObjectKey) -> usize {
        if self.inboxes.len() == 1 {
            return 0; // no hash needed to choose among one
        }
        crate::format::shard_of(key.bucket_bytes(), key.key_bytes(), self.inboxes.len())
    }

    /// Start `task` on shard `shard` as a task of its own (a listener, a connection), not
    /// counted among the shard's requests; completes once the shard has taken it.
    pub fn spawn_on_shard<F, Fut>(
        &self,
        shard: usize,
        task: F,
    ) -> impl Future<Output = Result<()>> + Send + 'static
    where
        F: FnOnce(Rc<Cache>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let message = Message::Call(Box::new(move |cache, permit| {
            drop(permit);
            crate::rt::spawn(task(cache));
        }));
        let inbox = self.inboxes[shard].clone();
        async move { inbox.send(message).await.map_err(|_| shard::shard_gone()) }
    }

    /// Run `call` on shard `shard` with its store, and return its result to the caller's thread.
    pub fn on_shard<T, F, Fut>(
        &self,
        shard: usize,
        call: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(Rc<Cache>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
    {
        let (reply, answer) = channel::oneshot();
        let message = Message::Call(Box::new(move |cache, permit| {
            crate::rt::spawn(async move {
                let result = call(cache).await;
                drop(permit);
                reply.send(result);
            });
        }));
        let inbox = self.inboxes[shard].clone();
        async move {
            if inbox.send(message).await.is_err() {
                return Err(shard::shard_gone());
            }
            answer.await.unwrap_or_else(|_| Err(shard::shard_gone()))
        }
    }

    /// Store `data` as `bucket/key` by the bucket's write mode; returns once it is durable
    /// (on NVMe, or at the origin for write-through buckets).
    pub fn put(
        &self,
        bucket: &str,
        key: &str,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        let call =
            ObjectKey::new(bucket, key).map(|key| self.put_key(key, data, Precondition::Any));
        async move { call?.await }
    }

    /// `put` of a key already made (a staged key, see `ObjectKey::staged`, among others), on
    /// the `precondition` (see `Cache::put`).
    pub fn put_key(
        &self,
        key: ObjectKey,
        data: Vec<u8>,
        precondition: Precondition,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        self.put_tagged(key, data, precondition, None, &Attributes::default())
    }

    /// `put_key` of a version whose MD5 tag the writer computed (S3's ETag of it), with its
    /// `attributes` (ATTRIBUTES_TOO_LARGE, before anything is written, when they do not fit).
    pub fn put_tagged(
        &self,
        key: ObjectKey,
        data: Vec<u8>,
        precondition: Precondition,
        md5: Option<Md5Tag>,
        attributes: &Attributes,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        let call = self.check_object_bytes(data.len() as u64).and_then(|()| {
            let attributes = attributes.encode()?;
            let shard = self.shard_of(&key);
            Ok(self.on_shard(shard, move |cache| async move {
                cache.put(key, data, precondition, md5, attributes).await
            }))
        });
        async move { call?.await }
    }

    /// Store `data` on NVMe only, `dirty` or not, whatever the bucket's origin (for tests and
    /// tools that exercise the store itself).
    pub fn put_with(
        &self,
        bucket: &str,
        key: &str,
        data: Vec<u8>,
        dirty: bool,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        let call = self.checked_put(bucket, key, &data).map(|key| {
            let shard = self.shard_of(&key);
            self.on_shard(shard, move |cache| async move {
                cache.store().put(key, &data, dirty).await
            })
        });
        async move { call?.await }
    }

    fn checked_put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<ObjectKey> {
        let key = ObjectKey::new(bucket, key)?;
        self.check_object_bytes(data.len() as u64)?;
        Ok(key)
    }

    fn check_object_bytes(&self, object_bytes: u64) -> Result<()> {
        if object_bytes > self.object_bytes_max {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "an object is at most {} bytes; this one is {object_bytes}",
                    self.object_bytes_max
                ),
            ));
        }
        Ok(())
    }

    /// The object's bytes (whole, or `range`), from NVMe or read through from the origin, or
    /// `None` when neither has it.
    pub fn get(
        &self,
        bucket: &str,
        key: &str,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<ObjectData>>> + Send + 'static {
        let call = self.get_versioned(bucket, key, range);
        async move { Ok(call.await?.map(|(data, _)| data)) }
    }

    /// Like `get`, with the tag of the origin version that data read through belongs to (0
    /// for data on NVMe): a reader of one object in parts compares (seq, tag) between parts so
    /// as never to join two versions.
    pub fn get_versioned(
        &self,
        bucket: &str,
        key: &str,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<(ObjectData, u64)>>> + Send + 'static {
        let call = ObjectKey::new(bucket, key).map(|key| self.get_versioned_key(key, range));
        async move { call?.await }
    }

    /// `get_versioned` of a key already made (a staged key, see `ObjectKey::staged`, among
    /// others).
    pub fn get_versioned_key(
        &self,
        key: ObjectKey,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<(ObjectData, u64)>>> + Send + 'static {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move {
            let read: Option<CacheRead> = cache.get(&key, range).await?;
            Ok(read.map(|read| {
                let meta = ObjectMeta {
                    bucket: key.bucket().to_string(),
                    key: key.key().to_string(),
                    bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    stamp: read.stamp,
                };
                ((meta, read.data), read.origin_version)
            }))
        })
    }

    /// `get_versioned_key` with the bytes in a buffer other threads may hold: a DRAM hit's
    /// bytes are shared with the tier rather than copied (see `ReadData::into_shared`). Its
    /// `attributes` are left empty (see `get_shared_described`).
    pub fn get_shared_key(
        &self,
        key: ObjectKey,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<SharedRead>>> + Send + 'static {
        self.get_shared(key, range, false)
    }

    /// `get_shared_key` with the version's attributes (for a version that has some, one more
    /// read of its first header block; from the origin, as it last said them).
    pub fn get_shared_described(
        &self,
        key: ObjectKey,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<SharedRead>>> + Send + 'static {
        self.get_shared(key, range, true)
    }

    fn get_shared(
        &self,
        key: ObjectKey,
        range: Option<ByteRange>,
        described: bool,
    ) -> impl Future<Output = Result<Option<SharedRead>>> + Send + 'static {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move {
            let _wanted = described.then(|| cache.want_attributes(&key));
            for _ in 0..DESCRIBED_ATTEMPTS_MAX {
                let Some(read) = cache.get_parts(&key, range).await? else {
                    return Ok(None);
                };
                let attributes = match (&read.origin_attributes, described) {
                    (_, false) => Attributes::default(),
                    // Read through: what the origin said with these bytes.
                    (Some(said), true) => (**said).clone(),
                    (None, true) => match cache.attributes(&key, read.seq).await? {
                        Some(attributes) => attributes,
                        None => continue, // replaced since it was read: read the new version
                    },
                };
                let meta = ObjectMeta {
                    bucket: key.bucket().to_string(),
                    key: key.key().to_string(),
                    bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    stamp: read.stamp,
                };
                let (data, _) = read.data.into_shared();
                return Ok(Some(SharedRead {
                    meta,
                    data,
                    origin_version: read.origin_version,
                    attributes,
                }));
            }
            Err(replaced_while_read(&key))
        })
    }

    pub fn head(
        &self,
        bucket: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>>> + Send + 'static {
        let call = ObjectKey::new(bucket, key).map(|key| self.head_key(key));
        async move { call?.await }
    }

    /// `head` of a key already made.
    pub fn head_key(
        &self,
        key: ObjectKey,
    ) -> impl Future<Output = Result<Option<ObjectMeta>>> + Send + 'static {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move { cache.head(&key).await })
    }

    /// `head_key` with the version's attributes (none for an object only at the origin).
    pub fn head_described(
        &self,
        key: ObjectKey,
    ) -> impl Future<Output = Result<Option<(ObjectMeta, Attributes)>>> + Send + 'static {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move {
            for _ in 0..DESCRIBED_ATTEMPTS_MAX {
                let Some(meta) = cache.head(&key).await? else {
                    return Ok(None);
                };
                if let Some(attributes) = cache.attributes(&key, meta.seq).await? {
                    return Ok(Some((meta, attributes)));
                }
            }
            Err(replaced_while_read(&key))
        })
    }

    /// Delete `bucket/key` (and at its origin); returns whether it existed.
    pub fn delete(
        &self,
        bucket: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let call = ObjectKey::new(bucket, key).map(|key| self.delete_key(key));
        async move { call?.await }
    }

    /// `delete` of a key already made.
    pub fn delete_key(
        &self,
        key: ObjectKey,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move { cache.delete(key).await })
    }

    /// The buckets that have an origin (see `Origins::bucket_names`); none without origins.
    pub fn buckets(&self) -> impl Future<Output = Result<Vec<String>>> + Send + 'static {
        let listing = self.origins.as_ref().map(|origins| origins.bucket_names());
        async move {
            match listing {
                Some(listing) => listing.await,
                None => Ok(Vec::new()),
            }
        }
    }

    /// Whether `bucket` has an origin to live at (a bucket of its own, or any valid name when
    /// there is a default origin).
    pub fn bucket_routed(&self, bucket: &str) -> bool {
        self.origins
            .as_ref()
            .is_some_and(|origins| matches!(origins.route(bucket), Ok(Some(_))))
    }

    /// Origin traffic and the dirty budget, when the engine has origins.
    pub fn origin_stats(&self) -> Option<OriginStats> {
        self.origins.as_ref().map(|origins| origins.stats())
    }

    /// Every shard's state and counters.
    /// Every shard's `Store::index_image`, shard by shard (for tests).
    #[doc(hidden)]
    pub fn index_image(&self) -> impl Future<Output = Result<Vec<String>>> + Send + 'static {
        let calls: Vec<_> = (0..self.inboxes.len())
            .map(|shard| {
                self.on_shard(shard, move |cache| async move {
                    let lines = cache.store().index_image();
                    Ok(lines
                        .into_iter()
                        .map(|line| format!("shard {shard}: {line}"))
                        .collect::<Vec<_>>())
                })
            })
            .collect();
        async move {
            let mut image = Vec::new();
            for call in calls {
                image.extend(call.await?);
            }
            Ok(image)
        }
    }

    pub fn stats(&self) -> impl Future<Output = Result<Vec<ShardStats>>> + Send + 'static {
        let calls: Vec<_> = (0..self.inboxes.len())
            .map(|shard| self.on_shard(shard, |cache| async move { Ok(cache.stats()) }))
            .collect();
        async move {
            let mut stats = Vec::with_capacity(calls.len());
            for call in calls {
                stats.push(call.await?);
            }
            Ok(stats)
        }
    }
}
