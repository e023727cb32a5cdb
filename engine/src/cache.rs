//! What one shard serves: its NVMe store in front of the origin of each bucket.
//!
//! A read is answered from the store when it holds a current copy; otherwise from the origin
//! (one request per chunk however many readers wait, see `origin::read`), and what came back is
//! admitted to the store. Objects up to the chunk size are cached whole under their own key;
//! larger ones chunk by chunk under chunk keys tied to the origin version, so a range read
//! caches only the chunks it touched. Writes follow the bucket's write mode.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::origin::read::{version_tag, Reads, DISCOVER};
use crate::origin::remote::{self, Condition, Fetch};
use crate::origin::writeback::{Upload, WriteBack};
use crate::origin::{OriginVersion, Origins, Revalidate, Route, WriteMode};
use crate::store::{resolve_range, ByteRange, ObjectKey, ObjectMeta, Store};
use crate::{Error, ErrorKind, Result};

/// Times a read starts over when the origin object changes under it.
const READ_ATTEMPTS_MAX: usize = 3;
/// Chunks read ahead of a sequential reader of a large origin object.
const READAHEAD_CHUNKS: u64 = 2;

/// An answer to a get.
pub struct CacheRead {
    /// Size of the whole object.
    pub bytes: u64,
    /// The version on NVMe (0 for data straight from the origin).
    pub seq: u64,
    pub dirty: bool,
    /// Offset in the object of the first byte of `data`.
    pub start: u64,
    pub data: Vec<u8>,
    /// Whether the origin was asked for (part of) the data.
    pub from_origin: bool,
}

/// A shard's origin side: the shared origins, what this shard knows of them, its write-back.
pub(crate) struct ShardOrigin {
    pub origins: Arc<Origins>,
    pub reads: Rc<Reads>,
    pub writes: WriteBack,
}

pub struct Cache {
    store: Rc<Store>,
    origin: Option<ShardOrigin>,
}

impl Cache {
    /// A shard's cache over its opened store. Dirty objects found on the device are queued
    /// for upload again.
    pub(crate) fn new(store: Rc<Store>, origins: Option<Arc<Origins>>) -> Rc<Cache> {
        let origin = origins.map(|origins| ShardOrigin {
            reads: Rc::new(Reads::new(origins.config().metadata_entries_max)),
            writes: WriteBack::default(),
            origins,
        });
        let cache = Rc::new(Cache { store, origin });
        if let Some(origin) = &cache.origin {
            let recovered = cache.store.dirty_objects();
            if !recovered.is_empty() {
                log::info!(
                    "shard {}: {} dirty objects found on the device are queued for upload",
                    cache.store.shard(),
                    recovered.len()
                );
            }
            for (key, seq, bytes) in recovered {
                origin.origins.add_recovered_dirty(bytes);
                origin.writes.enqueue(Upload { key, seq, bytes });
            }
            crate::rt::spawn(crate::origin::writeback::upload_loop(cache.clone()));
        }
        cache
    }

    pub fn store(&self) -> &Rc<Store> {
        &self.store
    }

    pub fn shard(&self) -> u32 {
        self.store.shard()
    }

    pub(crate) fn origin(&self) -> Option<&ShardOrigin> {
        self.origin.as_ref()
    }

    /// The origin of `key`'s bucket, if it has one.
    fn route(&self, key: &ObjectKey) -> Result<Option<(&ShardOrigin, Arc<Route>)>> {
        let Some(origin) = &self.origin else {
            return Ok(None);
        };
        Ok(origin
            .origins
            .route(key.bucket())?
            .map(|route| (origin, route)))
    }

    // ----- reads -----

    /// The object (whole, or `range`), from NVMe or through it from the origin. `None` when
    /// neither has it.
    pub async fn get(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<CacheRead>> {
        let Some((origin, route)) = self.route(key)? else {
            return self.get_stored(key, range).await;
        };
        for _ in 0..READ_ATTEMPTS_MAX {
            if let Some(meta) = self.store.head(key) {
                let current = meta.dirty
                    || origin.reads.fresh(key, route.revalidate).is_some()
                    || route.revalidate == Revalidate::Immutable;
                if current {
                    if let Some(read) = self.get_stored(key, range).await? {
                        return Ok(Some(read));
                    }
                    continue; // deleted or evicted meanwhile
                }
                match self.revalidate(origin, &route, key, range).await? {
                    Revalidated::Current => {
                        if let Some(read) = self.get_stored(key, range).await? {
                            return Ok(Some(read));
                        }
                        continue;
                    }
                    Revalidated::Replaced(read) => return Ok(Some(read)),
                    Revalidated::Gone => return Ok(None),
                    Revalidated::Large => {}
                }
            }
            match self.read_through(origin, &route, key, range).await? {
                Through::Read(read) => return Ok(Some(read)),
                Through::NotFound => return Ok(None),
                Through::Changed => origin.reads.forget(key),
            }
        }
        Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!(
                "{}/{} kept changing at the origin while it was read",
                key.bucket(),
                key.key()
            ),
        ))
    }

    async fn get_stored(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<CacheRead>> {
        Ok(self.store.get(key, range).await?.map(|read| CacheRead {
            bytes: read.bytes,
            seq: read.seq,
            dirty: read.dirty,
            start: read.start,
            data: read.to_vec(),
            from_origin: false,
        }))
    }

    /// Check a whole-object copy whose TTL ran out: a conditional GET of the object with its
    /// cached ETag (for objects up to a chunk; larger ones are checked by the chunked read).
    async fn revalidate(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Revalidated> {
        let chunk_bytes = self.store.geometry().chunk_bytes as u64;
        let seen = origin.reads.last_seen(key);
        if seen.as_ref().is_some_and(|seen| seen.bytes > chunk_bytes) {
            // A large object written through this node: drop the whole copy and read it
            // through in chunks, which checks the version.
            return Ok(Revalidated::Large);
        }
        let condition = match seen.and_then(|seen| seen.etag) {
            Some(etag) => Condition::IfNoneMatch(etag),
            None => Condition::None,
        };
        let path = route.path(key.key())?;
        let origins = origin.origins.clone();
        let fetched = origins
            .run(remote::fetch(
                origins.clone(),
                route.clone(),
                path,
                None,
                chunk_bytes,
                condition,
            ))
            .await?;
        match fetched {
            Fetch::NotModified => {
                origin.reads.confirm(key);
                Ok(Revalidated::Current)
            }
            Fetch::NotFound => {
                origin.reads.forget(key);
                self.store.delete(key.clone()).await?;
                Ok(Revalidated::Gone)
            }
            Fetch::Changed => Ok(Revalidated::Large),
            Fetch::Data {
                version,
                start: _,
                data,
            } => {
                origin.reads.remember(key, version.clone());
                if version.bytes > chunk_bytes {
                    self.store.delete(key.clone()).await?;
                    return Ok(Revalidated::Large);
                }
                self.store.put(key.clone(), &data, false).await?;
                let read = answer(&version, 0, &data, range)?;
                Ok(Revalidated::Replaced(read))
            }
        }
    }

    /// Read from the origin what NVMe does not hold, admitting it as it arrives.
    async fn read_through(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Through> {
        let chunk_bytes = self.store.geometry().chunk_bytes as u64;
        let mut discovered = None;
        let version = match origin.reads.fresh(key, route.revalidate) {
            Some(version) => version,
            None => {
                // The first read of an unknown object: its first chunk (the whole object when
                // small), which also tells its size and ETag.
                let fetched = self.fetch_chunk(origin, route, key, DISCOVER, None).await?;
                match &*fetched {
                    Fetch::Data { version, data, .. } => {
                        if version.bytes <= chunk_bytes || data_covers(range, data.len() as u64) {
                            return Ok(Through::Read(answer(version, 0, data, range)?));
                        }
                        let version = version.clone();
                        discovered = Some(fetched);
                        version
                    }
                    Fetch::NotFound => return Ok(Through::NotFound),
                    Fetch::Changed | Fetch::NotModified => return Ok(Through::Changed),
                }
            }
        };
        let (start, end) = resolve_range(range, version.bytes)?;
        if version.bytes <= chunk_bytes {
            let fetched = self
                .fetch_chunk(origin, route, key, 0, Some(&version))
                .await?;
            return Ok(match &*fetched {
                Fetch::Data { version, data, .. } => {
                    Through::Read(answer(version, 0, data, range)?)
                }
                Fetch::NotFound => Through::NotFound,
                Fetch::Changed | Fetch::NotModified => Through::Changed,
            });
        }
        let first = start / chunk_bytes;
        let last = if end == start {
            first
        } else {
            (end - 1) / chunk_bytes
        };
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut from_origin = false;
        for chunk in first..=last {
            let chunk_start = chunk * chunk_bytes;
            let chunk_end = (chunk_start + chunk_bytes).min(version.bytes);
            let wanted = start.max(chunk_start)..end.min(chunk_end).max(start.max(chunk_start));
            let chunk_key = key.origin_chunk(version_tag(&version), chunk);
            let first_chunk = if chunk == 0 { discovered.take() } else { None };
            if let (Some(chunk_key), None) = (&chunk_key, &first_chunk) {
                let inner = ByteRange {
                    start: wanted.start - chunk_start,
                    end: Some(wanted.end - chunk_start),
                };
                if let Some(read) = self.store.get(chunk_key, Some(inner)).await? {
                    data.extend_from_slice(&read.to_vec());
                    continue;
                }
            }
            from_origin = true;
            let fetched = match first_chunk {
                Some(fetched) => fetched,
                None => {
                    self.fetch_chunk(origin, route, key, chunk, Some(&version))
                        .await?
                }
            };
            match &*fetched {
                Fetch::Data {
                    start: fetched_start,
                    data: fetched_data,
                    ..
                } => {
                    let offset = (wanted.start - fetched_start) as usize;
                    let length = (wanted.end - wanted.start) as usize;
                    if offset + length > fetched_data.len() {
                        return Err(Error::new(
                            ErrorKind::OriginUnavailable,
                            format!(
                                "origin {} returned a short chunk {chunk} of {}/{}",
                                route.url,
                                key.bucket(),
                                key.key()
                            ),
                        ));
                    }
                    data.extend_from_slice(&fetched_data[offset..offset + length]);
                }
                Fetch::NotFound => return Ok(Through::NotFound),
                Fetch::Changed | Fetch::NotModified => return Ok(Through::Changed),
            }
        }
        if origin.reads.note_sequential(key, first, last) {
            self.read_ahead(origin, route, key, &version, last);
        }
        Ok(Through::Read(CacheRead {
            bytes: version.bytes,
            seq: 0,
            dirty: false,
            start,
            data,
            from_origin,
        }))
    }

    /// Start fetching the chunks after `last` for a sequential reader, unless cached or in
    /// flight.
    fn read_ahead(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        version: &OriginVersion,
        last: u64,
    ) {
        let chunk_bytes = self.store.geometry().chunk_bytes as u64;
        let chunks = version.bytes.div_ceil(chunk_bytes);
        for chunk in last + 1..(last + 1 + READAHEAD_CHUNKS).min(chunks) {
            let cached = key
                .origin_chunk(version_tag(version), chunk)
                .is_none_or(|chunk_key| self.store.head(&chunk_key).is_some());
            if cached || origin.reads.in_flight(&(key.clone(), chunk)) {
                continue;
            }
            let fetch = self.start_fetch(origin, route, key, chunk, Some(version));
            crate::rt::spawn(async move {
                let _ = fetch.await;
            });
        }
    }

    async fn fetch_chunk(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> Result<Rc<Fetch>> {
        self.start_fetch(origin, route, key, chunk, version).await
    }

    /// The coalesced origin read of `chunk` of `key` (`DISCOVER`: its first chunk, version
    /// unknown), admitted to the store when it arrives.
    fn start_fetch(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> impl std::future::Future<Output = Result<Rc<Fetch>>> + 'static {
        let chunk_bytes = self.store.geometry().chunk_bytes as u64;
        let origins = origin.origins.clone();
        let reads = origin.reads.clone();
        let store = self.store.clone();
        let path = route.path(key.key());
        let route = route.clone();
        let key = key.clone();
        let version = version.cloned();
        async move {
            let path = path?;
            let (range, condition) = match &version {
                None => (None, Condition::None),
                Some(version) => {
                    let etag = version
                        .etag
                        .clone()
                        .map_or(Condition::None, Condition::IfMatch);
                    if version.bytes <= chunk_bytes {
                        (None, etag)
                    } else {
                        let start = chunk * chunk_bytes;
                        let end = (start + chunk_bytes).min(version.bytes);
                        (Some(start..end), etag)
                    }
                }
            };
            let fetch = move || {
                origins.run(remote::fetch(
                    origins.clone(),
                    route,
                    path,
                    range,
                    chunk_bytes,
                    condition,
                ))
            };
            let admitted_reads = reads.clone();
            let admitted_key = key.clone();
            let admit = move |fetched: Rc<Fetch>| async move {
                admit(
                    &store,
                    &admitted_reads,
                    &admitted_key,
                    &fetched,
                    chunk_bytes,
                )
                .await;
            };
            reads.coalesced((key, chunk), fetch, admit).await
        }
    }

    /// The object's metadata: from NVMe, else from the origin (HEAD, remembered for the
    /// metadata TTL).
    pub async fn head(&self, key: &ObjectKey) -> Result<Option<ObjectMeta>> {
        if let Some(meta) = self.store.head(key) {
            return Ok(Some(meta));
        }
        let Some((origin, route)) = self.route(key)? else {
            return Ok(None);
        };
        let metadata_ttl = Revalidate::Ttl(origin.origins.config().metadata_ttl);
        let version = match origin.reads.fresh(key, metadata_ttl) {
            Some(version) => Some(version),
            None => {
                let path = route.path(key.key())?;
                let origins = origin.origins.clone();
                let found = origins
                    .run(remote::head(origins.clone(), route.clone(), path))
                    .await?;
                match &found {
                    Some(version) => origin.reads.remember(key, version.clone()),
                    None => origin.reads.forget(key),
                }
                found
            }
        };
        Ok(version.map(|version| ObjectMeta {
            bucket: key.bucket().to_string(),
            key: key.key().to_string(),
            bytes: version.bytes,
            seq: 0,
            dirty: false,
        }))
    }

    // ----- writes -----

    /// Store `data` as `key` by the bucket's write mode: NVMe only (no origin), write-back
    /// (dirty, acknowledged once durable on NVMe), write-through (acknowledged once the origin
    /// has it), or refused (read-only).
    pub async fn put(&self, key: ObjectKey, data: Vec<u8>) -> Result<ObjectMeta> {
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.put(key, &data, false).await;
        };
        let path = route.path(key.key())?;
        match route.write {
            WriteMode::ReadOnly => Err(read_only(&key, &route)),
            WriteMode::Through => {
                let bytes = data.len() as u64;
                let data = Bytes::from(data);
                let origins = origin.origins.clone();
                let etag = if bytes > origins.config().multipart_threshold_bytes {
                    put_multipart_from_memory(&origins, &route, path, data.clone()).await?
                } else {
                    origins
                        .run(remote::put(
                            origins.clone(),
                            route.clone(),
                            path,
                            data.clone(),
                        ))
                        .await?
                };
                origin.reads.remember(&key, OriginVersion { bytes, etag });
                self.store.put(key, &data, false).await
            }
            WriteMode::Back => {
                let bytes = data.len() as u64;
                origin.origins.reserve_dirty(bytes).await?;
                match self.store.put(key.clone(), &data, true).await {
                    Ok(meta) => {
                        origin.writes.enqueue(Upload {
                            key,
                            seq: meta.seq,
                            bytes,
                        });
                        Ok(meta)
                    }
                    Err(error) => {
                        origin.origins.release_dirty(bytes);
                        Err(error)
                    }
                }
            }
        }
    }

    /// Delete `key` here and at its origin; returns whether either had it.
    pub async fn delete(&self, key: ObjectKey) -> Result<bool> {
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.delete(key).await;
        };
        if route.write == WriteMode::ReadOnly {
            return Err(read_only(&key, &route));
        }
        let path = route.path(key.key())?;
        let at_origin = match self.head(&key).await? {
            Some(meta) => !meta.dirty || meta.seq == 0,
            None => false,
        };
        let stored = self.store.delete(key.clone()).await?;
        origin.reads.forget(&key);
        // An upload in flight would bring the object back at the origin after the delete.
        origin.writes.idle(&key).await;
        let origins = origin.origins.clone();
        origins
            .run(remote::delete(origins.clone(), route.clone(), path))
            .await?;
        Ok(stored || at_origin)
    }

    /// Dirty keys under `prefix` not yet at the origin (what FLUSH waits for).
    pub fn pending_under(&self, prefix: &ObjectKey) -> usize {
        self.origin
            .as_ref()
            .map_or(0, |origin| origin.writes.pending_under(prefix))
    }

    /// Dirty keys not yet at the origin, all buckets.
    pub fn pending_count(&self) -> usize {
        self.origin
            .as_ref()
            .map_or(0, |origin| origin.writes.pending_count())
    }

    /// Wait until an upload finishes (or a short while), for FLUSH's polling.
    pub async fn wait_for_upload(&self, timeout: std::time::Duration) {
        let Some(origin) = &self.origin else {
            return;
        };
        let change = origin.writes.next_change();
        let sleep = crate::rt::time::sleep(timeout);
        futures::pin_mut!(change, sleep);
        futures::future::select(change, sleep).await;
    }

    /// Dirty objects of this shard under `prefix`, for LIST's view of what is not at the
    /// origin yet.
    pub fn dirty_listing(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
    ) -> Vec<ObjectMeta> {
        let Some(origin) = &self.origin else {
            return Vec::new();
        };
        origin
            .writes
            .pending_keys(prefix, start_after, limit)
            .into_iter()
            .filter_map(|key| self.store.head(&key))
            .collect()
    }
}

/// What checking a stale whole copy found.
enum Revalidated {
    Current,
    Replaced(CacheRead),
    Gone,
    /// The object is larger than a chunk: read it through in chunks.
    Large,
}

enum Through {
    Read(CacheRead),
    NotFound,
    /// The origin object changed during the read: start over.
    Changed,
}

fn read_only(key: &ObjectKey, route: &Route) -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "bucket {} is read-only (origin {})",
            key.bucket(),
            route.url
        ),
    )
}

/// Whether data read from the start of an object covers `range`.
fn data_covers(range: Option<ByteRange>, available: u64) -> bool {
    range.is_some_and(|range| range.end.is_some_and(|end| end <= available))
}

/// The part of `data` (the object's bytes from `data_start`) that `range` asks for.
fn answer(
    version: &OriginVersion,
    data_start: u64,
    data: &[u8],
    range: Option<ByteRange>,
) -> Result<CacheRead> {
    let (start, end) = resolve_range(range, version.bytes)?;
    let end = end.min(data_start + data.len() as u64);
    let slice = &data[(start - data_start) as usize..(end - data_start) as usize];
    Ok(CacheRead {
        bytes: version.bytes,
        seq: 0,
        dirty: false,
        start,
        data: slice.to_vec(),
        from_origin: true,
    })
}

/// Admit what an origin read returned: a small object whole under its key, a chunk of a large
/// one under its chunk key. A failed admission is logged; the reader already has its data.
async fn admit(store: &Store, reads: &Reads, key: &ObjectKey, fetched: &Fetch, chunk_bytes: u64) {
    let Fetch::Data {
        version,
        start,
        data,
    } = fetched
    else {
        if matches!(fetched, Fetch::NotFound | Fetch::Changed) {
            reads.forget(key);
        }
        return;
    };
    reads.remember(key, version.clone());
    let outcome = if version.bytes <= chunk_bytes {
        if store.head(key).is_some_and(|meta| meta.dirty) {
            return; // a newer write is waiting for upload: never replace it with origin data
        }
        store.put(key.clone(), data, false).await.map(|_| ())
    } else {
        let chunk = start / chunk_bytes;
        match key.origin_chunk(version_tag(version), chunk) {
            Some(chunk_key) if start % chunk_bytes == 0 => {
                store.put(chunk_key, data, false).await.map(|_| ())
            }
            _ => Ok(()),
        }
    };
    if let Err(error) = outcome {
        log::warn!(
            "could not cache {}/{} from the origin: {error}",
            key.bucket(),
            key.key()
        );
    }
}

/// Upload `data` in parts (write-through of a large object).
async fn put_multipart_from_memory(
    origins: &Arc<Origins>,
    route: &Arc<Route>,
    path: object_store::path::Path,
    data: Bytes,
) -> Result<Option<String>> {
    let part_bytes = origins.config().part_bytes as usize;
    let mut upload = origins
        .run(remote::start_multipart(
            origins.clone(),
            route.clone(),
            path,
        ))
        .await?;
    for start in (0..data.len()).step_by(part_bytes) {
        let part = data.slice(start..(start + part_bytes).min(data.len()));
        upload = origins
            .run(remote::put_part(
                origins.clone(),
                route.clone(),
                upload,
                part,
            ))
            .await?;
    }
    origins
        .run(remote::finish_multipart(
            origins.clone(),
            route.clone(),
            upload,
        ))
        .await
}
