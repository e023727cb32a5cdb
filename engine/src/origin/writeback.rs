//! A shard's write-back: the queue of dirty object versions waiting for the origin, and the
//! task that uploads them (whole, or in parts above the multipart threshold), retrying with
//! exponential backoff until the origin takes them. A version is marked clean only once the
//! origin has acknowledged it, and only if it is still the newest; the dirty budget is given
//! back then.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::ops::Bound;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;

use super::parts::Begun;
use super::{remote, OriginVersion, Route, ShardOrigin};
use crate::rt::sync::{Semaphore, WaitQueue};
use crate::store::{ByteRange, ObjectKey, Store};
use crate::{Error, ErrorKind, Result};

/// The first wait after a failed upload; it doubles up to `upload_backoff_max`.
const UPLOAD_BACKOFF_FIRST: Duration = Duration::from_millis(100);

/// One dirty version to upload, and the budget bytes it holds.
pub(crate) struct Upload {
    pub key: ObjectKey,
    pub seq: u64,
    pub bytes: u64,
    /// Failed attempts so far (each failure waits longer before the next).
    pub attempts: u32,
    /// A multipart upload of this version begun at an object store by an earlier attempt: the
    /// next attempt goes on from the parts the origin holds (or only completes it) instead of
    /// starting over.
    pub(crate) begun: Option<Begun>,
    /// When it was queued (its PUT acknowledged), for the time until it is clean.
    pub(crate) queued_at: Instant,
}

impl Upload {
    pub fn new(key: ObjectKey, seq: u64, bytes: u64) -> Upload {
        Upload {
            key,
            seq,
            bytes,
            attempts: 0,
            begun: None,
            queued_at: Instant::now(),
        }
    }
}

/// A dirty version the origin refused for good: kept on NVMe (pinned, never dropped), counted
/// apart from the dirty budget, reported by name, uploaded again only when asked (or at the
/// next start) or replaced by a newer write.
#[derive(Clone, Debug)]
pub struct FailedUpload {
    pub bucket: String,
    pub key: String,
    pub seq: u64,
    pub bytes: u64,
    pub reason: String,
}

#[derive(Default)]
pub(crate) struct WriteBack {
    /// Versions the origin refused, by key (at most one per key: the newest).
    failed: RefCell<BTreeMap<ObjectKey, FailedUpload>>,
    queue: RefCell<VecDeque<Upload>>,
    queued: WaitQueue,
    /// The newest dirty version of each key not yet at the origin (FLUSH waits on it).
    pending: RefCell<BTreeMap<ObjectKey, u64>>,
    /// Woken when an upload finishes (pending shrank, or a key stopped uploading).
    changed: WaitQueue,
    uploading: RefCell<HashSet<ObjectKey>>,
    /// When each queued version was queued, by (time, seq): the oldest is the first.
    ages: RefCell<std::collections::BTreeSet<(Instant, u64)>>,
}

impl WriteBack {
    /// Queue version `seq` of `key`. Its `bytes` are already taken from the dirty budget.
    pub fn enqueue(&self, upload: Upload) {
        // PUTs of one key may be acknowledged out of order: pending keeps the newest version.
        let mut pending = self.pending.borrow_mut();
        let newest = pending.entry(upload.key.clone()).or_insert(upload.seq);
        *newest = (*newest).max(upload.seq);
        drop(pending);
        self.ages
            .borrow_mut()
            .insert((upload.queued_at, upload.seq));
        self.queue.borrow_mut().push_back(upload);
        self.queued.wake_all();
    }

    /// How long the oldest version still queued or uploading has waited for the origin.
    pub fn oldest_age(&self) -> Option<Duration> {
        let ages = self.ages.borrow();
        ages.first().map(|(queued_at, _)| queued_at.elapsed())
    }

    /// Dirty keys under `prefix` (a joined bucket and key prefix) not yet at the origin.
    pub fn pending_under(&self, prefix: &ObjectKey) -> usize {
        self.pending
            .borrow()
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.as_bytes().starts_with(prefix.as_bytes()))
            .count()
    }

    /// Dirty keys not yet at the origin, all buckets.
    pub fn pending_count(&self) -> usize {
        self.pending.borrow().len()
    }

    /// Up to `limit` of `found(key)` for the dirty keys under `prefix` after `start_after`, in
    /// key order, skipping keys for which `found` gives nothing. The walk starts at the page's
    /// first key, so it costs the page (plus the skipped keys: those deleted while their
    /// upload waits in the queue), not the dirty keys before it.
    pub fn pending_keys<T>(
        &self,
        prefix: &ObjectKey,
        start_after: Option<&ObjectKey>,
        limit: usize,
        found: impl Fn(&ObjectKey) -> Option<T>,
    ) -> Vec<T> {
        // Every key after a `start_after` below the prefix is at or after the prefix.
        let first = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.pending
            .borrow()
            .range::<ObjectKey, _>((first, Bound::Unbounded))
            .take_while(|(key, _)| key.as_bytes().starts_with(prefix.as_bytes()))
            .filter_map(|(key, _)| found(key))
            .take(limit)
            .collect()
    }

    /// Refused uploads under `prefix`, at most `limit` of them, and how many there are.
    pub fn failed_under(&self, prefix: &ObjectKey, limit: usize) -> (Vec<FailedUpload>, usize) {
        let failed = self.failed.borrow();
        let under = || {
            failed
                .range(prefix.clone()..)
                .take_while(|(key, _)| key.as_bytes().starts_with(prefix.as_bytes()))
        };
        let listed = under()
            .take(limit)
            .map(|(_, failed)| failed.clone())
            .collect();
        (listed, under().count())
    }

    /// Every refused upload, at most `limit`, and how many there are.
    pub fn failed_all(&self, limit: usize) -> (Vec<FailedUpload>, usize) {
        let failed = self.failed.borrow();
        let listed = failed.values().take(limit).cloned().collect();
        (listed, failed.len())
    }

    /// Forget that `key` was refused (a newer write or a delete replaces it, or it is tried
    /// again); returns the bytes it held.
    pub fn clear_failed(&self, key: &ObjectKey) -> Option<FailedUpload> {
        self.failed.borrow_mut().remove(key)
    }

    /// Queue the refused uploads under `prefix` (every bucket when `None`) once more; returns
    /// how many.
    pub fn retry_failed(&self, prefix: Option<&ObjectKey>, origins: &super::Origins) -> usize {
        let keys: Vec<ObjectKey> = self
            .failed
            .borrow()
            .keys()
            .filter(|key| prefix.is_none_or(|prefix| key.as_bytes().starts_with(prefix.as_bytes())))
            .cloned()
            .collect();
        for key in &keys {
            let failed = self.clear_failed(key).expect("listed");
            origins.forget_failed(failed.bytes);
            origins.add_recovered_dirty(failed.bytes);
            self.enqueue(Upload::new(key.clone(), failed.seq, failed.bytes));
        }
        keys.len()
    }

    /// Wait until an upload finishes (or a key stops uploading).
    pub async fn changed(&self) {
        self.changed.wait().await;
    }

    /// Wait until `key` is not being uploaded (a delete must not race an upload that would
    /// bring the object back at the origin).
    pub async fn idle(&self, key: &ObjectKey) {
        while self.uploading.borrow().contains(key) {
            self.changed.wait().await;
        }
    }
}

/// What the uploader works with: the shard's store (it reads the versions it uploads and
/// marks them clean) and its origin side.
pub(crate) struct Uploader {
    pub store: Rc<Store>,
    pub origin: Rc<ShardOrigin>,
    /// The queues of upload record writes, one per object (see `journal::Records`).
    pub records: super::journal::Records,
}

/// The shard's uploader: takes queued versions and uploads up to `uploads_per_shard_max` at
/// once. Runs for the life of the shard.
pub(crate) async fn upload_loop(uploader: Rc<Uploader>) {
    super::parts::sweep_records(&uploader).await;
    let origin = &uploader.origin;
    let slots = Rc::new(Semaphore::new(
        origin.origins.config().uploads_per_shard_max,
    ));
    loop {
        let permit = slots.acquire_owned().await;
        let upload = loop {
            if let Some(upload) = origin.writes.queue.borrow_mut().pop_front() {
                break upload;
            }
            origin.writes.queued.wait().await;
        };
        let uploader = uploader.clone();
        crate::rt::spawn(async move {
            upload_one(&uploader, upload).await;
            drop(permit);
        });
    }
}

/// One attempt at uploading `upload`. On failure the attempt's slot is freed and the upload
/// is queued again after a backoff, so that an object the origin keeps refusing does not hold
/// a slot that others could use; its budget bytes stay taken until it succeeds.
async fn upload_one(uploader: &Rc<Uploader>, mut upload: Upload) {
    let origin = &uploader.origin;
    let writes = &origin.writes;
    writes.idle(&upload.key).await;
    writes.uploading.borrow_mut().insert(upload.key.clone());
    let current = uploader
        .store
        .head(&upload.key)
        .is_some_and(|meta| meta.seq == upload.seq && meta.dirty);
    let outcome = if !current {
        // Deleted, or superseded by a newer version with an upload of its own.
        if let Some(begun) = upload.begun.take() {
            begun.abort(&origin.origins);
            forget_record(uploader, &upload);
        }
        Ok(None)
    } else {
        match origin.origins.route(upload.key.bucket()) {
            Ok(Some(route)) => upload_version(uploader, &route, &mut upload).await,
            Ok(None) => Err(Error::new(
                ErrorKind::OriginRefused,
                "its bucket has no origin now (the configuration changed)",
            )),
            Err(error) => Err(Error::new(ErrorKind::OriginRefused, error.to_string())),
        }
    };
    writes.uploading.borrow_mut().remove(&upload.key);
    writes.changed.wake_all();
    match outcome {
        Ok(Some((etag, attributes))) => {
            origin
                .origins
                .counters
                .observe_clean(upload.queued_at.elapsed());
            let marked = uploader.store.mark_clean(&upload.key, upload.seq).await;
            if let Err(error) = &marked {
                // In memory it is clean; after a restart it is uploaded once more.
                log::warn!(
                    "could not record {}/{} as clean: {error}",
                    upload.key.bucket(),
                    upload.key.key()
                );
            }
            // Recording it clean took a write, during which a delete (or a newer version) may
            // have come and gone past this upload: the origin's version is remembered only if
            // it is still the node's, or a HEAD would answer for an object deleted since.
            let current = uploader
                .store
                .head(&upload.key)
                .is_some_and(|meta| meta.seq == upload.seq);
            if marked.unwrap_or(true) && current {
                origin.reads.remember(
                    &upload.key,
                    OriginVersion {
                        bytes: upload.bytes,
                        etag,
                        modified_ms: 0,
                        attributes: Arc::new(attributes),
                    },
                );
            }
            finish(uploader, &upload);
        }
        Ok(None) => finish(uploader, &upload),
        Err(error)
            if matches!(
                error.kind(),
                ErrorKind::OriginRefused | ErrorKind::InvalidKey
            ) =>
        {
            refused(uploader, upload, error)
        }
        Err(error) => {
            origin
                .origins
                .counters
                .uploads_retried
                .fetch_add(1, Ordering::Relaxed);
            let backoff = (UPLOAD_BACKOFF_FIRST * 2u32.saturating_pow(upload.attempts.min(16)))
                .min(origin.origins.config().upload_backoff_max);
            log::warn!(
                "upload of {}/{} failed (attempt {}), retrying in {backoff:?}: {error}",
                upload.key.bucket(),
                upload.key.key(),
                upload.attempts + 1
            );
            upload.attempts += 1;
            let origin = uploader.origin.clone();
            crate::rt::spawn(async move {
                crate::rt::time::sleep(backoff).await;
                origin.writes.queue.borrow_mut().push_back(upload);
                origin.writes.queued.wake_all();
            });
        }
    }
}

/// The origin refused `upload` for good: it stops being retried and stops holding the dirty
/// budget (so that one unwritable key never stalls every other writer); it stays dirty on NVMe,
/// is counted among the refused bytes (bounded apart, `failed_bytes_max`) and is reported by
/// name until it is retried, replaced or deleted.
fn refused(uploader: &Uploader, mut upload: Upload, error: Error) {
    let origin = &uploader.origin;
    if let Some(begun) = upload.begun.take() {
        begun.abort(&origin.origins);
        forget_record(uploader, &upload);
    }
    let current = uploader
        .store
        .head(&upload.key)
        .is_some_and(|meta| meta.seq == upload.seq && meta.dirty);
    if !current {
        // Deleted or replaced while it was being uploaded: nothing is left to refuse.
        finish(uploader, &upload);
        return;
    }
    log::error!(
        "the origin refused {}/{} (version {}, {} bytes); it stays on NVMe until retried, replaced or deleted: {error}",
        upload.key.bucket(),
        upload.key.key(),
        upload.seq,
        upload.bytes
    );
    let failed = FailedUpload {
        bucket: upload.key.bucket().to_string(),
        key: upload.key.key().to_string(),
        seq: upload.seq,
        bytes: upload.bytes,
        reason: error.context().to_string(),
    };
    if let Some(older) = origin
        .writes
        .failed
        .borrow_mut()
        .insert(upload.key.clone(), failed)
    {
        origin.origins.forget_failed(older.bytes);
    }
    origin.origins.add_failed(upload.bytes);
    finish(uploader, &upload);
}

/// Delete the upload record of `upload`'s version in the background, if it is still that
/// version's (a newer version's upload may have recorded itself while this one backed off).
fn forget_record(uploader: &Uploader, upload: &Upload) {
    uploader
        .records
        .recorder(&uploader.store, &upload.key)
        .forget(upload.seq);
}

/// The upload is done (or moot): its pending entry and budget bytes go.
fn finish(uploader: &Uploader, upload: &Upload) {
    let origin = &uploader.origin;
    origin
        .writes
        .ages
        .borrow_mut()
        .remove(&(upload.queued_at, upload.seq));
    {
        let mut pending = origin.writes.pending.borrow_mut();
        if pending.get(&upload.key) == Some(&upload.seq) {
            pending.remove(&upload.key);
        }
    }
    origin.origins.release_dirty(upload.bytes);
    origin.writes.changed.wake_all();
}

/// Upload one version; `Ok(None)` when it stopped being the stored version midway, else the
/// origin's ETag (when it gives one) and the attributes it keeps of the version.
async fn upload_version(
    uploader: &Uploader,
    route: &Arc<Route>,
    upload: &mut Upload,
) -> Result<Option<(Option<String>, crate::Attributes)>> {
    let origins = uploader.origin.origins.clone();
    let path = route.path(upload.key.key())?;
    let config = origins.config().clone();
    // The version's Content-Type, user metadata and the rest go to the origin with it.
    let Some(described) = uploader.store.attributes(&upload.key, upload.seq).await? else {
        return Ok(None);
    };
    let attributes = remote::origin_attributes(route, &described);
    // What a read through the origin will say of it later: no checksum (an object store is
    // not given the writer's).
    let kept = if attributes.is_empty() {
        Default::default()
    } else {
        crate::Attributes {
            checksum: None,
            ..described
        }
    };
    let etag = if upload.bytes <= config.multipart_threshold_bytes {
        let Some(data) = read_part(uploader, upload, 0, upload.bytes).await? else {
            return Ok(None);
        };
        Some(
            origins
                .run(remote::put(
                    origins.clone(),
                    route.clone(),
                    path,
                    data,
                    attributes,
                    described.checksum.clone(),
                ))
                .await?,
        )
    } else if route.parts.is_none() {
        upload_whole(uploader, route, upload, path, attributes).await?
    } else {
        super::parts::upload_in_parts(uploader, route, upload, path, attributes).await?
    };
    Ok(etag.map(|etag| (etag, kept)))
}

/// Upload a version in parts to an origin without part-wise uploads (a local folder): each
/// attempt starts over.
async fn upload_whole(
    uploader: &Uploader,
    route: &Arc<Route>,
    upload: &Upload,
    path: Path,
    attributes: object_store::Attributes,
) -> Result<Option<Option<String>>> {
    let origins = uploader.origin.origins.clone();
    let part_bytes = origins.config().part_bytes;
    let mut multipart = origins
        .run(remote::start_multipart(
            origins.clone(),
            route.clone(),
            path.clone(),
            attributes,
        ))
        .await?;
    let mut offset = 0;
    while offset < upload.bytes {
        let end = (offset + part_bytes).min(upload.bytes);
        let Some(data) = read_part(uploader, upload, offset, end).await? else {
            let abandoned = multipart;
            // Spawned on the origin pool; dropping the handle does not cancel it.
            drop(origins.run(async move {
                let mut abandoned = abandoned;
                let _ = abandoned.abort().await;
                Ok(())
            }));
            return Ok(None);
        };
        multipart = origins
            .run(remote::put_part(
                origins.clone(),
                route.clone(),
                multipart,
                data,
            ))
            .await?;
        offset = end;
    }
    let etag = origins
        .run(remote::finish_multipart(
            origins.clone(),
            route.clone(),
            multipart,
        ))
        .await?;
    Ok(Some(etag))
}

/// Bytes `start..end` of the version being uploaded, or `None` when it is no longer stored.
pub(crate) async fn read_part(
    uploader: &Uploader,
    upload: &Upload,
    start: u64,
    end: u64,
) -> Result<Option<Bytes>> {
    let range = ByteRange {
        start,
        end: Some(end),
    };
    let Some(read) = uploader.store.get(&upload.key, Some(range)).await? else {
        return Ok(None);
    };
    if read.seq != upload.seq {
        return Ok(None);
    }
    if read.len() as u64 != end - start {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "read {} bytes of {}/{} for upload, wanted {}",
                read.len(),
                upload.key.bucket(),
                upload.key.key(),
                end - start
            ),
        ));
    }
    Ok(Some(Bytes::from(read.to_vec())))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn queued(keys: &[(&str, &str)]) -> WriteBack {
        let writes = WriteBack::default();
        for (seq, (bucket, key)) in keys.iter().enumerate() {
            writes.enqueue(Upload::new(
                ObjectKey::new(bucket, key).unwrap(),
                seq as u64 + 1,
                1,
            ));
        }
        writes
    }

    fn page(writes: &WriteBack, prefix: &str, after: Option<&str>, limit: usize) -> Vec<String> {
        let prefix = ObjectKey::prefix("a", prefix).unwrap();
        let after = after.map(|after| ObjectKey::new("a", after).unwrap());
        writes.pending_keys(&prefix, after.as_ref(), limit, |key| {
            Some(key.key().to_string())
        })
    }

    #[test]
    fn pending_pages_keep_to_their_bucket_prefix_and_start() {
        let writes = queued(&[
            ("a", "x/1"),
            ("a", "x/2"),
            ("a", "x/3"),
            ("a", "y"),
            ("ab", "x/0"),
            ("ab", "x/9"),
        ]);
        assert_eq!(page(&writes, "", None, 10), ["x/1", "x/2", "x/3", "y"]);
        assert_eq!(page(&writes, "x/", None, 2), ["x/1", "x/2"]);
        assert_eq!(page(&writes, "x/", Some("x/2"), 10), ["x/3"]);
        assert_eq!(page(&writes, "x/", Some("w"), 10), ["x/1", "x/2", "x/3"]);
        assert!(page(&writes, "x/", Some("x/3"), 10).is_empty());
        assert!(page(&writes, "x/", Some("z"), 10).is_empty());
        assert_eq!(
            page(&writes, "", Some("x/3"), 10),
            ["y"],
            "bucket ab is not part of a"
        );
    }

    #[test]
    fn a_pending_page_skips_keys_the_store_no_longer_holds() {
        let names: Vec<String> = (0..1000).map(|index| format!("k{index:04}")).collect();
        let keys: Vec<(&str, &str)> = names.iter().map(|name| ("a", name.as_str())).collect();
        let writes = queued(&keys);
        let looked_up = Cell::new(0);
        let after = ObjectKey::new("a", "k0900").unwrap();
        let listed = writes.pending_keys(
            &ObjectKey::prefix("a", "k").unwrap(),
            Some(&after),
            10,
            |key| {
                looked_up.set(looked_up.get() + 1);
                // Every other key is gone from the store (deleted while its upload waits).
                let index: usize = key.key()[1..].parse().unwrap();
                index.is_multiple_of(2).then(|| key.key().to_string())
            },
        );
        assert_eq!(listed.first().map(String::as_str), Some("k0902"));
        assert_eq!(listed.len(), 10);
        assert_eq!(
            looked_up.get(),
            20,
            "looked up from k0901 until the page is full"
        );
    }
}
