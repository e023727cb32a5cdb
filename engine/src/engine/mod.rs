//! The front door: open the devices, check or write their superblocks, start one shard per core,
//! and route every call to the shard that owns its key.

use std::future::Future;
use std::rc::Rc;

use crate::cache::{Cache, CacheRead, Precondition};
use crate::device::{Device, DeviceConfig};
use crate::format::{
    Superblock, SuperblockProblem, BLOCK_BYTES, CHUNK_BYTES_MAX, CRC_BLOCK_BYTES_MIN,
    FORMAT_VERSION, PLACEMENT_CRC32C, REGIONS_OFFSET_BYTES, REGION_BYTES_MAX, SUPERBLOCK_OFFSETS,
};
use crate::origin::{FailedUpload, OriginConfig, OriginStats, Origins};
use crate::rt::channel;
use crate::rt::ReactorConfig;
use crate::shard::{self, Message, ShardHandle, ShardPlan};
use crate::stamp::Md5Tag;
use crate::store::{ByteRange, Geometry, ObjectKey, ObjectMeta, ShardStats};
use crate::{Error, ErrorKind, Result};

mod config;
mod superblocks;

pub use config::*;
use superblocks::*;

/// Most objects one `list` call returns.
pub const LIST_LIMIT_MAX: usize = 10_000;
/// Most objects one prefetch of a prefix reads.
const PREFETCH_KEYS_MAX: usize = 1_000_000;
/// How often FLUSH counts the objects still dirty when no upload finishes.
const FLUSH_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// An object's metadata and the bytes a get asked for.
pub type ObjectData = (ObjectMeta, Vec<u8>);

/// Chunks of one streamed put queued for its shard beyond the one being written.
const PUT_STREAM_CHUNKS_QUEUED: usize = 2;
/// How often a streamed put waiting for room in the node's bound looks again.
const STREAMED_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

pub use crate::store::StreamedChunk;

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

/// Refused writes a FLUSH names in its error.
const FLUSH_REFUSED_NAMED_MAX: usize = 5;

/// FLUSH's answer when writes under its prefix were refused by the origin.
fn refused_error(refused: &[FailedUpload], count: usize) -> Error {
    let named: Vec<String> = refused
        .iter()
        .take(FLUSH_REFUSED_NAMED_MAX)
        .map(|failed| format!("{}/{} ({})", failed.bucket, failed.key, failed.reason))
        .collect();
    let more = count.saturating_sub(named.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Error::new(
        ErrorKind::OriginRefused,
        format!(
            "{count} writes were refused by the origin and stay on NVMe: {}{more}; retry them with `hydrant uploads --retry` once the origin can take them, or delete them",
            named.join("; ")
        ),
    )
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
    /// Open (and format, as the policy allows) the devices, recover every shard and start
    /// serving.
    pub fn open(config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        let requested = Layout::requested(&config);
        requested.check()?;
        let devices = config
            .devices
            .iter()
            .map(|device| {
                // A new file is created only if it can hold the requested layout; an existing
                // device is checked against its own geometry once its superblock is read.
                let bytes_min = if device.path.exists() {
                    REGIONS_OFFSET_BYTES + BLOCK_BYTES as u64
                } else {
                    requested.device_bytes_min()
                };
                Device::open(device, bytes_min)
            })
            .collect::<Result<Vec<Device>>>()?;
        let states = match config.format {
            FormatPolicy::Always => devices.iter().map(|_| DeviceState::Blank).collect(),
            FormatPolicy::IfBlank => devices
                .iter()
                .map(read_device_state)
                .collect::<Result<Vec<_>>>()?,
        };
        let formatted: Vec<Superblock> = states
            .iter()
            .filter_map(|state| match state {
                DeviceState::Formatted(superblock) => Some(superblock.clone()),
                DeviceState::Blank => None,
            })
            .collect();
        let superblocks = if config.format == FormatPolicy::Always || formatted.is_empty() {
            for device in &devices {
                if device.bytes() < requested.device_bytes_min() {
                    return Err(Error::new(
                        ErrorKind::DeviceTooSmall,
                        format!(
                            "{} is {} bytes; {} shards of {}-byte regions need at least {} bytes",
                            device.path().display(),
                            device.bytes(),
                            requested.shards,
                            requested.region_bytes,
                            requested.device_bytes_min()
                        ),
                    ));
                }
            }
            format_devices(&devices, &requested)?
        } else if formatted.len() != devices.len() {
            return Err(Error::new(
                ErrorKind::GeometryMismatch,
                "some devices hold a hydrant store and others are blank; give the devices the store was formatted with, or format them all",
            ));
        } else {
            check_formatted(&config, &devices, &formatted)?;
            upgrade_format(&devices, formatted)?
        };
        let first = &superblocks[0];
        let geometry = Geometry {
            region_bytes: first.region_bytes,
            chunk_bytes: first.chunk_bytes,
            crc_block_bytes: first.crc_block_bytes,
            set_uuid: first.set_uuid,
        };
        let origins = config
            .origins
            .clone()
            .map(Origins::start)
            .transpose()?
            .map(std::sync::Arc::new);
        let mut engine = Engine {
            handle: EngineHandle {
                inboxes: Vec::new(),
                object_bytes_max: config.object_bytes_max,
                origins: origins.clone(),
                chunk_bytes: geometry.chunk_bytes,
                streamed_bytes: Default::default(),
                streamed_bytes_max: config.streamed_bytes_max,
            },
            threads: Vec::new(),
            devices,
            geometry: geometry.clone(),
        };
        let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
        let mut readiness = Vec::new();
        for shard in 0..first.shard_count {
            let (ready, ready_receiver) = channel::oneshot();
            let plan = ShardPlan {
                shard,
                cpu: config.pin_threads.then(|| match &config.cpus {
                    Some(list) if !list.is_empty() => list[shard as usize % list.len()],
                    _ => shard as usize % cpus,
                }),
                geometry: geometry.clone(),
                regions: shard_regions(&superblocks, shard),
                device_fds: engine.devices.iter().map(Device::raw_fd).collect(),
                arena_bytes: config.arena_bytes,
                reactor: ReactorConfig {
                    ring_entries: (config.io_depth_max as u32 * 2 + 8).next_power_of_two(),
                    io_depth_max: config.io_depth_max,
                    // At least one entry (a chunk and its header), so that the store's own
                    // reads and writes never have to go alone.
                    io_bytes_max: config
                        .io_bytes_in_flight_max
                        .max(u64::from(geometry.chunk_bytes) + BLOCK_BYTES as u64),
                    completion_batch_wait_us: config.completion_batch_wait_us,
                    receive_buffers: config.receive_buffers,
                },
                requests_in_flight_max: config.requests_in_flight_max,
                origins: origins.clone(),
                dram_bytes: config.dram_bytes / first.shard_count as u64,
                admission_bytes_per_second: config
                    .admission_bytes_per_second
                    .map(|rate| (rate / first.shard_count as u64).max(1)),
            };
            let started: ShardHandle = shard::start(plan, config.inbox_requests_max, ready)?;
            engine.handle.inboxes.push(started.inbox);
            engine.threads.extend(started.thread);
            readiness.push(ready_receiver);
        }
        for ready in readiness {
            match crate::rt::block_on(ready) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        "a shard thread stopped while opening (see the log: io_uring unavailable?)",
                    ))
                }
            }
        }
        Ok(engine)
    }

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
                    data: Vec::with_capacity(bytes as usize),
                    md5: None,
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
        )
    }

    /// `put_stream` of a key already made (a staged key, see `ObjectKey::staged`, among
    /// others), on the `precondition` (see `Cache::put`).
    pub fn put_stream_key(
        &self,
        key: ObjectKey,
        object_bytes: u64,
        precondition: Precondition,
    ) -> Result<(
        PutSink,
        impl Future<Output = Result<ObjectMeta>> + Send + 'static,
    )> {
        self.check_object_bytes(object_bytes)?;
        let (chunks, received) = channel::bounded(PUT_STREAM_CHUNKS_QUEUED);
        let shard = self.shard_of(&key);
        let done = self.on_shard(shard, move |cache| async move {
            let received = StreamedChunks(received);
            cache
                .put_stream(key, object_bytes, &received.0, precondition)
                .await
        });
        Ok((PutSink { chunks }, done))
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
        self.put_tagged(key, data, precondition, None)
    }

    /// `put_key` of a version whose MD5 tag the writer computed (S3's ETag of it).
    pub fn put_tagged(
        &self,
        key: ObjectKey,
        data: Vec<u8>,
        precondition: Precondition,
        md5: Option<Md5Tag>,
    ) -> impl Future<Output = Result<ObjectMeta>> + Send + 'static {
        let call = self.check_object_bytes(data.len() as u64).map(|()| {
            let shard = self.shard_of(&key);
            self.on_shard(shard, move |cache| async move {
                cache.put(key, data, precondition, md5).await
            })
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
    /// bytes are shared with the tier rather than copied (see `ReadData::into_shared`).
    pub fn get_shared_key(
        &self,
        key: ObjectKey,
        range: Option<ByteRange>,
    ) -> impl Future<Output = Result<Option<((ObjectMeta, bytes::Bytes), u64)>>> + Send + 'static
    {
        let shard = self.shard_of(&key);
        self.on_shard(shard, move |cache| async move {
            let read = cache.get_parts(&key, range).await?;
            Ok(read.map(|read| {
                let meta = ObjectMeta {
                    bucket: key.bucket().to_string(),
                    key: key.key().to_string(),
                    bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    stamp: read.stamp,
                };
                let (data, _) = read.data.into_shared();
                ((meta, data), read.origin_version)
            }))
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

    /// Up to `limit` (at most LIST_LIMIT_MAX) staged objects (see `ObjectKey::staged`) whose
    /// keys start with `prefix`, in key order, after `start_after`.
    pub fn list_staged(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ObjectMeta>>> + Send + 'static {
        let limit = limit.min(LIST_LIMIT_MAX);
        let keys = ObjectKey::staged_prefix(prefix).and_then(|prefix| {
            let after = start_after.map(ObjectKey::staged).transpose()?;
            Ok((prefix, after))
        });
        let calls = keys.map(|(prefix, after)| {
            (0..self.inboxes.len())
                .map(|shard| {
                    let prefix = prefix.clone();
                    let after = after.clone();
                    self.on_shard(shard, move |cache| async move {
                        Ok(cache.store().list(&prefix, after.as_ref(), limit))
                    })
                })
                .collect::<Vec<_>>()
        });
        async move {
            let mut merged: Vec<ObjectMeta> = Vec::new();
            for call in calls? {
                merged.extend(call.await?);
            }
            merged.sort_by(|left, right| left.key.cmp(&right.key));
            merged.truncate(limit);
            Ok(merged)
        }
    }

    /// Up to `limit` (at most LIST_LIMIT_MAX) objects of `bucket` whose keys start with
    /// `prefix`, in key order, after `start_after` (for paging). For a bucket with an origin:
    /// the origin's listing plus the objects written here and not uploaded yet.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ObjectMeta>>> + Send + 'static {
        let limit = limit.min(LIST_LIMIT_MAX);
        let route = match &self.origins {
            Some(origins) => origins
                .route(bucket)
                .map(|route| route.map(|r| (origins.clone(), r))),
            None => Ok(None),
        };
        let keys = ObjectKey::prefix(bucket, prefix).and_then(|prefix_key| {
            let after = start_after
                .map(|after| ObjectKey::new(bucket, after))
                .transpose()?;
            Ok((prefix_key, after))
        });
        let with_origin = matches!(route, Ok(Some(_)));
        let calls = keys.map(|(prefix_key, after)| {
            (0..self.inboxes.len())
                .map(|shard| {
                    let prefix_key = prefix_key.clone();
                    let after = after.clone();
                    self.on_shard(shard, move |cache| async move {
                        Ok(if with_origin {
                            // What is not at the origin yet, and the clean copies here (which
                            // say of an object what the origin's listing may not: the MD5
                            // tag and the time it was written through this node).
                            let dirty = cache.dirty_listing(&prefix_key, after.as_ref(), limit);
                            let mut clean = cache.store().list(&prefix_key, after.as_ref(), limit);
                            clean.retain(|meta| !meta.dirty);
                            (dirty, clean)
                        } else {
                            (
                                cache.store().list(&prefix_key, after.as_ref(), limit),
                                Vec::new(),
                            )
                        })
                    })
                })
                .collect::<Vec<_>>()
        });
        let origin_list = route.map(|route| {
            route.map(|(origins, route)| {
                let task = crate::origin::remote::list(
                    origins.clone(),
                    route,
                    prefix.to_string(),
                    start_after.map(str::to_string),
                    limit,
                );
                origins.run(task)
            })
        });
        let bucket = bucket.to_string();
        async move {
            let mut merged: Vec<ObjectMeta> = Vec::new();
            let mut clean: std::collections::HashMap<String, ObjectMeta> = Default::default();
            for call in calls? {
                let (listed, copies) = call.await?;
                merged.extend(listed);
                clean.extend(copies.into_iter().map(|meta| (meta.key.clone(), meta)));
            }
            if let Some(listing) = origin_list? {
                let local: std::collections::HashSet<String> =
                    merged.iter().map(|meta| meta.key.clone()).collect();
                for (key, version) in listing.await? {
                    if local.contains(&key) {
                        continue;
                    }
                    // The origin lists it: a clean copy of its size here is what HEAD and GET
                    // answer, so LIST answers it too.
                    match clean.remove(&key) {
                        Some(copy) if copy.bytes == version.bytes => merged.push(copy),
                        _ => merged.push(ObjectMeta {
                            bucket: bucket.clone(),
                            key,
                            bytes: version.bytes,
                            seq: 0,
                            dirty: false,
                            stamp: version.stamp(),
                        }),
                    }
                }
            }
            merged.sort_by(|left, right| left.key.cmp(&right.key));
            merged.truncate(limit);
            Ok(merged)
        }
    }

    /// Wait until every object of `bucket` under `prefix` written here is at its origin (all
    /// buckets with `None`), at most `timeout`.
    pub fn flush(
        &self,
        bucket: Option<&str>,
        prefix: &str,
        timeout: std::time::Duration,
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        let prefixes = match bucket {
            Some(bucket) => ObjectKey::prefix(bucket, prefix).map(|key| vec![key]),
            None => Ok(Vec::new()),
        };
        let handle = self.clone();
        async move {
            let prefixes = prefixes?;
            let deadline = std::time::Instant::now() + timeout;
            loop {
                let mut pending = 0;
                let mut refused = Vec::new();
                let mut refused_count = 0;
                for shard in 0..handle.inboxes.len() {
                    let prefixes = prefixes.clone();
                    let (waiting, listed, count) = handle
                        .on_shard(shard, move |cache| async move {
                            let prefix = prefixes.first();
                            let (listed, count) =
                                cache.refused_uploads(prefix, FLUSH_REFUSED_NAMED_MAX);
                            let waiting = match prefix {
                                None => cache.pending_count(),
                                Some(prefix) => cache.pending_under(prefix),
                            };
                            Ok((waiting, listed, count))
                        })
                        .await?;
                    pending += waiting;
                    refused.extend(listed);
                    refused_count += count;
                }
                if pending == 0 && refused_count == 0 {
                    return Ok(());
                }
                if pending == 0 {
                    return Err(refused_error(&refused, refused_count));
                }
                if std::time::Instant::now() >= deadline {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("{pending} objects are still on their way to the origin"),
                    ));
                }
                // A short wait (on shard 0's timers, so that any caller can await it), then
                // count again.
                handle
                    .on_shard(0, |_| async move {
                        crate::rt::time::sleep(FLUSH_POLL_INTERVAL).await;
                        Ok(())
                    })
                    .await?;
            }
        }
    }

    /// Writes the origin refused for good under `bucket`/`prefix` (every bucket when `None`):
    /// at most `limit` of them, and how many there are. With `retry`, they are queued for
    /// upload again first (and listed as they were).
    pub fn refused_uploads(
        &self,
        bucket: Option<&str>,
        prefix: &str,
        retry: bool,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<FailedUpload>, usize)>> + Send + 'static {
        let prefix = bucket
            .map(|bucket| ObjectKey::prefix(bucket, prefix))
            .transpose();
        let handle = self.clone();
        async move {
            let prefix = prefix?;
            let mut listed = Vec::new();
            let mut count = 0;
            for shard in 0..handle.inboxes.len() {
                let prefix = prefix.clone();
                let (shard_listed, shard_count) = handle
                    .on_shard(shard, move |cache| async move {
                        let found = cache.refused_uploads(prefix.as_ref(), limit);
                        if retry {
                            cache.retry_refused(prefix.as_ref());
                        }
                        Ok(found)
                    })
                    .await?;
                listed.extend(shard_listed);
                count += shard_count;
            }
            listed.sort_by(|a, b| (&a.bucket, &a.key).cmp(&(&b.bucket, &b.key)));
            listed.truncate(limit);
            Ok((listed, count))
        }
    }

    /// Read every object of `bucket` under `prefix` (or the listed `keys`) through from the
    /// origin into the cache, `parallel` at a time; returns (objects, bytes) warmed.
    pub fn prefetch(
        &self,
        bucket: &str,
        prefix: &str,
        keys: Vec<String>,
        parallel: usize,
    ) -> impl Future<Output = Result<(u64, u64)>> + Send + 'static {
        let handle = self.clone();
        let bucket = bucket.to_string();
        let prefix = prefix.to_string();
        async move {
            let mut keys = keys;
            if keys.is_empty() {
                let mut after: Option<String> = None;
                loop {
                    let page = handle
                        .list(&bucket, &prefix, after.as_deref(), LIST_LIMIT_MAX)
                        .await?;
                    let done = page.len() < LIST_LIMIT_MAX;
                    after = page.last().map(|meta| meta.key.clone());
                    keys.extend(page.into_iter().map(|meta| meta.key));
                    if done {
                        break;
                    }
                    if keys.len() > PREFETCH_KEYS_MAX {
                        return Err(Error::new(
                            ErrorKind::TooLarge,
                            format!("prefetch is limited to {PREFETCH_KEYS_MAX} objects; use narrower prefixes"),
                        ));
                    }
                }
            }
            let mut objects = 0;
            let mut bytes = 0;
            for batch in keys.chunks(parallel.max(1)) {
                let warms: Vec<_> = batch
                    .iter()
                    .map(|key| {
                        let key = ObjectKey::new(&bucket, key)?;
                        let shard = handle.shard_of(&key);
                        Ok(handle
                            .on_shard(shard, move |cache| async move { cache.warm(&key).await }))
                    })
                    .collect::<Result<_>>()?;
                for warmed in futures::future::join_all(warms).await {
                    if let Some(size) = warmed? {
                        objects += 1;
                        bytes += size;
                    }
                }
            }
            Ok((objects, bytes))
        }
    }

    /// Follow a plan named `id`: `keys` of `bucket` will be read in this order, so each shard
    /// reads its own of them ahead from the origin, at most its share of `window_bytes` beyond
    /// the readers, until none of them is asked for during `idle` (see `Cache::plan`). A plan
    /// of the same id is replaced; no keys end it. Returns how many keys are planned.
    pub fn plan(
        &self,
        bucket: &str,
        id: u64,
        keys: Vec<String>,
        window_bytes: u64,
        idle: std::time::Duration,
    ) -> impl Future<Output = Result<u64>> + Send + 'static {
        let handle = self.clone();
        let bucket = bucket.to_string();
        async move {
            let shards = handle.inboxes.len();
            let mut shares: Vec<Vec<ObjectKey>> = vec![Vec::new(); shards];
            for key in &keys {
                let key = ObjectKey::new(&bucket, key)?;
                shares[handle.shard_of(&key)].push(key);
            }
            let window_bytes = (window_bytes / shards as u64).max(handle.chunk_bytes());
            let calls: Vec<_> = shares
                .into_iter()
                .enumerate()
                .map(|(shard, share)| {
                    handle.on_shard(shard, move |cache| async move {
                        Ok(cache.plan(id, share, window_bytes, idle) as u64)
                    })
                })
                .collect();
            let mut planned = 0;
            for call in calls {
                planned += call.await?;
            }
            Ok(planned)
        }
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
