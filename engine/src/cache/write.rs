//! Writes by the bucket's mode (NVMe only, write-back, write-through, read-only), deletes, and
//! what FLUSH and LIST ask of the write-back queue.

use super::*;

/// What a conditional write requires of its key. It is checked on the key's shard under the
/// key's lock, which every write of the key through this node takes in turn, so no other write
/// slips between the check and the install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Nothing: an ordinary write.
    Any,
    /// No object under the key, here or at its origin (S3's `If-None-Match: *`).
    Absent,
    /// The version stored here is this one (by its seq; S3's `If-Match`).
    Version(u64),
}

/// Where a streamed put's bytes come from.
pub enum PutSource<'a> {
    /// Chunks in memory as they arrive (see `EngineHandle::put_stream`).
    Streamed(&'a crate::rt::channel::Receiver<crate::store::StreamedChunk>),
    /// The whole object in memory shared with a client on this host, from its start, and the
    /// flag its connection sets when the client goes away (see `PutStream::write_shared`).
    Shared(crate::buf::ExternalBuf, Arc<std::sync::atomic::AtomicBool>),
}

impl Cache {
    /// PreconditionFailed unless `key` is as `precondition` requires; the caller holds the
    /// key's lock.
    async fn check_precondition(&self, key: &ObjectKey, precondition: Precondition) -> Result<()> {
        let failed = match precondition {
            Precondition::Any => return Ok(()),
            Precondition::Absent => self.head(key).await?.is_some(),
            Precondition::Version(seq) => self
                .store
                .version(key)
                .is_none_or(|version| version.seq != seq),
        };
        if failed {
            return Err(Error::new(
                ErrorKind::PreconditionFailed,
                format!(
                    "{}/{} is not as the write requires ({precondition:?})",
                    key.bucket(),
                    key.key()
                ),
            ));
        }
        Ok(())
    }

    /// Store `data` as `key` by the bucket's write mode: NVMe only (no origin), write-back
    /// (dirty, acknowledged once durable on NVMe), write-through (acknowledged once the origin
    /// has it), or refused (read-only). A staged key is stored on NVMe only and pinned (kept
    /// like dirty data, never uploaded) until it is deleted.
    /// With a `precondition` other than `Any`, the write happens only if the key is as it
    /// requires (else PreconditionFailed, and nothing is written). `md5`: the version's MD5 tag,
    /// where the writer computed one (S3 answers it as the ETag). `attributes`: its encoded
    /// attributes (see `Attributes::encode`; empty for none).
    pub async fn put(
        &self,
        key: ObjectKey,
        data: Vec<u8>,
        precondition: Precondition,
        md5: Option<Md5Tag>,
        attributes: Vec<u8>,
    ) -> Result<ObjectMeta> {
        let stamp = Stamp::now_with(md5);
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            let pinned = key.is_staged();
            if precondition == Precondition::Any {
                return self
                    .store
                    .put_stamped(key, &data, pinned, stamp, &attributes)
                    .await;
            }
            let _guard = self.locks.lock(&key).await;
            self.check_precondition(&key, precondition).await?;
            return self
                .store
                .put_stamped(key, &data, pinned, stamp, &attributes)
                .await;
        };
        // From now until the answer, origin reads of the key are not admitted.
        let _change = origin.reads.change(&key);
        let path = route.path(key.key())?;
        if route.write == WriteMode::Back {
            check_write_back(origin, &route, &key).await?;
        }
        match route.write {
            WriteMode::ReadOnly => Err(read_only(&key, &route)),
            WriteMode::Through => {
                let _guard = self.locks.lock(&key).await;
                self.check_precondition(&key, precondition).await?;
                let bytes = data.len() as u64;
                let data = Bytes::from(data);
                let origins = origin.origins.clone();
                let mut described =
                    crate::attributes::Attributes::decode(&attributes).unwrap_or_default();
                // A whole object's checksum is known with it; an empty promise is none.
                if described.checksum_pending() {
                    described.checksum = None;
                }
                let kept = remote::origin_attributes(&route, &described);
                let checksum = described.checksum.clone();
                // What the origin keeps of them is what a read through it later says.
                let described = if kept.is_empty() {
                    Default::default()
                } else {
                    described
                };
                let etag = if bytes > origins.config().multipart_threshold_bytes {
                    put_multipart_from_memory(&origins, &route, path, data.clone(), kept).await?
                } else {
                    origins
                        .run(remote::put(
                            origins.clone(),
                            route.clone(),
                            path,
                            data.clone(),
                            kept,
                            checksum,
                        ))
                        .await?
                };
                match self
                    .store
                    .put_stamped(key.clone(), &data, false, stamp, &attributes)
                    .await
                {
                    Ok(meta) => {
                        origin.reads.remember(
                            &key,
                            OriginVersion {
                                bytes,
                                etag,
                                modified_ms: 0,
                                attributes: Arc::new(described),
                            },
                        );
                        Ok(meta)
                    }
                    Err(error) => {
                        // The origin has the object: it is written. The old copy must not
                        // outlive it here.
                        log::warn!(
                            "{}/{} is at the origin but could not be cached: {error}",
                            key.bucket(),
                            key.key()
                        );
                        origin.reads.forget(&key);
                        self.store.delete(key.clone()).await?;
                        Ok(ObjectMeta {
                            bucket: key.bucket().to_string(),
                            key: key.key().to_string(),
                            bytes,
                            seq: 0,
                            dirty: false,
                            stamp,
                        })
                    }
                }
            }
            WriteMode::Back => {
                let bytes = data.len() as u64;
                origin.origins.reserve_dirty(bytes).await?;
                let _guard = self.locks.lock(&key).await;
                if let Err(error) = self.check_precondition(&key, precondition).await {
                    origin.origins.release_dirty(bytes);
                    return Err(error);
                }
                match self
                    .store
                    .put_stamped(key.clone(), &data, true, stamp, &attributes)
                    .await
                {
                    Ok(meta) => {
                        self.forget_refused(origin, &key);
                        origin.writes.enqueue(Upload::new(key, meta.seq, bytes));
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

    /// Store as `key` an object of `object_bytes` whose bytes come from `source`: one chunk at a
    /// time (each exactly a chunk, the last the rest), so that it is never whole in memory, or
    /// from a same-host client's shared memory. By
    /// the bucket's write mode as `put`; write-through is written to NVMe first and answered
    /// once the uploader has it at the origin. A stream that ends early leaves nothing visible.
    /// With a `precondition` and `attributes`, as `put`: checked before the first chunk is
    /// written.
    pub async fn put_stream(
        &self,
        key: ObjectKey,
        object_bytes: u64,
        source: PutSource<'_>,
        precondition: Precondition,
        attributes: Vec<u8>,
    ) -> Result<ObjectMeta> {
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            let pinned = key.is_staged();
            if precondition == Precondition::Any {
                return self
                    .write_stream(key, object_bytes, pinned, source, attributes)
                    .await;
            }
            let _guard = self.locks.lock(&key).await;
            self.check_precondition(&key, precondition).await?;
            return self
                .write_stream(key, object_bytes, pinned, source, attributes)
                .await;
        };
        let _change = origin.reads.change(&key);
        route.path(key.key())?;
        if route.write == WriteMode::ReadOnly {
            return Err(read_only(&key, &route));
        }
        check_write_back(origin, &route, &key).await?;
        origin.origins.reserve_dirty(object_bytes).await?;
        let written = {
            let _guard = self.locks.lock(&key).await;
            match self.check_precondition(&key, precondition).await {
                Ok(()) => {
                    self.write_stream(key.clone(), object_bytes, true, source, attributes)
                        .await
                }
                Err(error) => Err(error),
            }
        };
        let meta = match written {
            Ok(meta) => meta,
            Err(error) => {
                origin.origins.release_dirty(object_bytes);
                return Err(error);
            }
        };
        self.forget_refused(origin, &key);
        origin
            .writes
            .enqueue(Upload::new(key.clone(), meta.seq, object_bytes));
        if route.write == WriteMode::Through {
            self.wait_uploaded(origin, &key, meta.seq).await?;
            return Ok(ObjectMeta {
                dirty: false,
                ..meta
            });
        }
        Ok(meta)
    }

    /// Write a streamed object to NVMe, chunk by chunk as they come (or all from shared memory).
    async fn write_stream(
        &self,
        key: ObjectKey,
        object_bytes: u64,
        dirty: bool,
        source: PutSource<'_>,
        attributes: Vec<u8>,
    ) -> Result<ObjectMeta> {
        let mut put = self.store.begin_put(key, object_bytes, dirty, attributes)?;
        let chunks = match source {
            PutSource::Streamed(chunks) => chunks,
            PutSource::Shared(bytes, abandoned) => {
                put.write_shared(&bytes, &abandoned).await?;
                return put.finish().await;
            }
        };
        for chunk in 0..put.chunk_count() {
            let Some(mut chunk_data) = chunks.recv().await else {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "the stream ended after {chunk} of {} chunks; nothing was stored",
                        put.chunk_count()
                    ),
                ));
            };
            let data = &chunk_data.data;
            if data.len() != put.chunk_len(chunk) {
                return Err(Error::new(
                    ErrorKind::InvalidRange,
                    format!(
                        "chunk {chunk} has {} bytes, not {}",
                        data.len(),
                        put.chunk_len(chunk)
                    ),
                ));
            }
            if let Some(md5) = chunk_data.md5 {
                put.set_md5(md5);
            }
            if let Some(checksum) = &chunk_data.checksum {
                put.set_closing_attributes(&crate::Attributes {
                    checksum: Some(checksum.clone()),
                    ..Default::default()
                });
            }
            // Written where it lies; its room in the node's bound goes to the next chunk once
            // its write may start.
            let data = std::mem::take(&mut chunk_data.data);
            let crcs = chunk_data.crcs.take();
            put.write_streamed(data, crcs, chunk_data).await?;
        }
        put.finish().await
    }

    /// Wait until version `seq` of `key` is at the origin (or no longer stored: deleted or
    /// replaced); an error when the origin refused it.
    async fn wait_uploaded(&self, origin: &ShardOrigin, key: &ObjectKey, seq: u64) -> Result<()> {
        loop {
            let stored = self.store.head(key);
            if !stored.is_some_and(|meta| meta.seq == seq && meta.dirty) {
                return Ok(());
            }
            if let Some(refused) = origin
                .writes
                .failed_under(key, 1)
                .0
                .into_iter()
                .find(|failed| failed.seq == seq && failed.key == key.key())
            {
                return Err(Error::new(ErrorKind::OriginRefused, refused.reason));
            }
            origin.writes.changed().await;
        }
    }

    /// Delete `key` here and at its origin; returns whether either had it.
    pub async fn delete(&self, key: ObjectKey) -> Result<bool> {
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.delete(key).await;
        };
        // From now until the answer, origin reads of the key are not admitted.
        let _change = origin.reads.change(&key);
        if route.write == WriteMode::ReadOnly {
            return Err(read_only(&key, &route));
        }
        let path = route.path(key.key())?;
        let at_origin = match self.head(&key).await? {
            Some(meta) => !meta.dirty || meta.seq == 0,
            None => false,
        };
        let _guard = self.locks.lock(&key).await;
        let stored = self.store.delete(key.clone()).await?;
        self.forget_refused(origin, &key);
        origin.reads.forget(&key);
        // An upload in flight would bring the object back at the origin after the delete.
        origin.writes.idle(&key).await;
        let origins = origin.origins.clone();
        origins
            .run(remote::delete(origins.clone(), route.clone(), path))
            .await?;
        Ok(stored || at_origin)
    }

    /// A refused version of `key` is superseded (a newer write or a delete): it stops counting.
    pub(super) fn forget_refused(&self, origin: &ShardOrigin, key: &ObjectKey) {
        if let Some(failed) = origin.writes.clear_failed(key) {
            origin.origins.forget_failed(failed.bytes);
        }
    }

    /// Uploads the origin refused under `prefix` (every bucket when `None`): at most `limit`
    /// of them, and how many there are.
    pub fn refused_uploads(
        &self,
        prefix: Option<&ObjectKey>,
        limit: usize,
    ) -> (Vec<crate::origin::writeback::FailedUpload>, usize) {
        match (&self.origin, prefix) {
            (None, _) => (Vec::new(), 0),
            (Some(origin), Some(prefix)) => origin.writes.failed_under(prefix, limit),
            (Some(origin), None) => origin.writes.failed_all(limit),
        }
    }

    /// Queue the refused uploads under `prefix` (every bucket when `None`) once more; returns
    /// how many.
    pub fn retry_refused(&self, prefix: Option<&ObjectKey>) -> usize {
        self.origin.as_ref().map_or(0, |origin| {
            origin.writes.retry_failed(prefix, &origin.origins)
        })
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
            .pending_keys(prefix, start_after, limit, |key| self.store.head(key))
    }
}

pub(super) fn read_only(key: &ObjectKey, route: &Route) -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "bucket {} is read-only (origin {})",
            key.bucket(),
            route.url
        ),
    )
}

/// Upload `data` in parts (write-through of a large object).
pub(super) async fn put_multipart_from_memory(
    origins: &Arc<Origins>,
    route: &Arc<Route>,
    path: object_store::path::Path,
    data: Bytes,
    attributes: object_store::Attributes,
) -> Result<Option<String>> {
    let part_bytes = origins.config().part_bytes as usize;
    let mut upload = origins
        .run(remote::start_multipart(
            origins.clone(),
            route.clone(),
            path,
            attributes,
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

/// What a write-back (or streamed write-through) PUT checks before it writes: that refused
/// uploads leave room, and that the origin is not known to be unable to hold the name (a folder
/// origin's file where a folder must go, say): refused now, not after the acknowledgement.
async fn check_write_back(origin: &ShardOrigin, route: &Arc<Route>, key: &ObjectKey) -> Result<()> {
    origin.origins.check_failed_room()?;
    if route.url.starts_with("file://") {
        let (checked, name) = (route.clone(), key.key().to_string());
        origin
            .origins
            .run(async move { remote::check_nameable(&checked, &name) })
            .await?;
    }
    Ok(())
}
