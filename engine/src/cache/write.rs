//! Writes by the bucket's mode (NVMe only, write-back, write-through, read-only), deletes, and
//! what FLUSH and LIST ask of the write-back queue.

use super::*;

impl Cache {
    /// Store `data` as `key` by the bucket's write mode: NVMe only (no origin), write-back
    /// (dirty, acknowledged once durable on NVMe), write-through (acknowledged once the origin
    /// has it), or refused (read-only).
    pub async fn put(&self, key: ObjectKey, data: Vec<u8>) -> Result<ObjectMeta> {
        self.invalidate(&key);
        let Some((origin, route)) = self.route(&key)? else {
            return self.store.put(key, &data, false).await;
        };
        // From now until the answer, origin reads of the key are not admitted.
        let _change = origin.reads.change(&key);
        let path = route.path(key.key())?;
        if route.write == WriteMode::Back {
            origin.origins.check_failed_room()?;
            // Refused now, not after the acknowledgement, what the origin is known not to
            // be able to hold (a folder origin's file where a folder must go, say).
            if route.url.starts_with("file://") {
                let (checked, name) = (route.clone(), key.key().to_string());
                origin
                    .origins
                    .run(async move { remote::check_nameable(&checked, &name) })
                    .await?;
            }
        }
        match route.write {
            WriteMode::ReadOnly => Err(read_only(&key, &route)),
            WriteMode::Through => {
                let _guard = self.locks.lock(&key).await;
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
                match self.store.put(key.clone(), &data, false).await {
                    Ok(meta) => {
                        origin.reads.remember(&key, OriginVersion { bytes, etag });
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
                        })
                    }
                }
            }
            WriteMode::Back => {
                let bytes = data.len() as u64;
                origin.origins.reserve_dirty(bytes).await?;
                let _guard = self.locks.lock(&key).await;
                match self.store.put(key.clone(), &data, true).await {
                    Ok(meta) => {
                        self.forget_refused(origin, &key);
                        origin.writes.enqueue(Upload {
                            key,
                            seq: meta.seq,
                            bytes,
                            attempts: 0,
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
