//! Writes to the origin: whole objects, multipart uploads (streamed, or driven part by part
//! with their own time limit), completions checked when their answer is lost, and deletes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use object_store::multipart::PartId;
use object_store::path::Path;
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutPayload};

use super::errors::{is_slow_down, origin_error};
use crate::origin::{Origins, Route};
use crate::Result;

/// The highest `NAME#N` a folder origin's leftovers are looked for at (object_store stages each
/// write of `NAME` as the first free `NAME#1`, `NAME#2`, ... and renames it when complete).
const STAGED_SUFFIX_MAX: u32 = 8;

/// For a local-folder origin: remove the staged files that a process killed mid-write left
/// beside `path` (object_store hides them from listings, so nothing else ever would). Only
/// those last written before this engine opened go: a write of this process is never touched.
/// Called before each write and delete of `path`.
async fn remove_stale_staged(origins: &Origins, route: &Route, path: &Path) {
    let Some(folder) = &route.folder else {
        return;
    };
    let file = folder.join(path.as_ref());
    let opened_at = origins.opened_at;
    // Blocking file calls: on the origin pool's blocking threads.
    let _ = tokio::task::spawn_blocking(move || remove_staged_before(&file, opened_at)).await;
}

fn remove_staged_before(file: &std::path::Path, opened_at: std::time::SystemTime) {
    for suffix in 1..=STAGED_SUFFIX_MAX {
        let mut staged = file.as_os_str().to_owned();
        staged.push(format!("#{suffix}"));
        let staged = std::path::PathBuf::from(staged);
        let Ok(meta) = std::fs::symlink_metadata(&staged) else {
            continue;
        };
        let stale = meta.is_file() && meta.modified().is_ok_and(|modified| modified < opened_at);
        if !stale {
            continue;
        }
        match std::fs::remove_file(&staged) {
            Ok(()) => log::info!(
                "removed {}, an unfinished write left at the origin by an earlier run",
                staged.display()
            ),
            Err(error) => log::warn!("cannot remove {}: {error}", staged.display()),
        }
    }
}

/// An object's attributes as `route`'s origin keeps them: an object store all but Expires
/// (which it has no field for), a local folder none (it keeps only the bytes).
pub(crate) fn origin_attributes(
    route: &Route,
    attributes: &crate::Attributes,
) -> object_store::Attributes {
    use object_store::Attribute;
    let mut kept = object_store::Attributes::new();
    if route.url.starts_with("file://") {
        return kept;
    }
    for (attribute, value) in [
        (Attribute::ContentType, &attributes.content_type),
        (Attribute::ContentEncoding, &attributes.content_encoding),
        (
            Attribute::ContentDisposition,
            &attributes.content_disposition,
        ),
        (Attribute::ContentLanguage, &attributes.content_language),
        (Attribute::CacheControl, &attributes.cache_control),
    ] {
        if let Some(value) = value {
            kept.insert(attribute, value.clone().into());
        }
    }
    for (name, value) in &attributes.metadata {
        kept.insert(
            Attribute::Metadata(name.clone().into()),
            value.clone().into(),
        );
    }
    kept
}

/// Put `data` at `path` with `attributes`, and with the writer's `checksum` (S3's algorithm
/// name and base64 value) where the origin can be given it (an S3 origin, a checksum of the
/// whole object): the origin verifies it and keeps it with the object.
pub(crate) async fn put(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    data: Bytes,
    attributes: object_store::Attributes,
    checksum: Option<(String, String)>,
) -> Result<Option<String>> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    let checksum = checksum.as_ref().and_then(super::signed::checksum_headers);
    if let (Some(checksum), Some(signed)) = (checksum, &route.signed) {
        let sent = data.clone();
        match super::signed::put(&origins, &route, signed, &path, sent, checksum, &attributes).await
        {
            Ok(etag) => return Ok(etag),
            Err(super::signed::Declined::Failed(error)) => return Err(error),
            Err(super::signed::Declined::Unsupported(why)) => log::info!(
                "origin {} does not take the writer's checksum of {path} ({why}): sent without it",
                route.url
            ),
        }
    }
    let bytes = data.len() as u64;
    let options = object_store::PutOptions {
        attributes,
        ..Default::default()
    };
    match route
        .store
        .put_opts(&path, PutPayload::from(data), options)
        .await
    {
        Ok(result) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(result.e_tag)
        }
        Err(error) => Err(origin_error(&origins.counters, &route, "store", error)),
    }
}

pub(crate) async fn start_multipart(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    attributes: object_store::Attributes,
) -> Result<Box<dyn object_store::MultipartUpload>> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    let options = object_store::PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    route
        .store
        .put_multipart_opts(&path, options)
        .await
        .map_err(|error| origin_error(&origins.counters, &route, "start an upload", error))
}

pub(crate) async fn put_part(
    origins: Arc<Origins>,
    route: Arc<Route>,
    mut upload: Box<dyn object_store::MultipartUpload>,
    data: Bytes,
) -> Result<Box<dyn object_store::MultipartUpload>> {
    let bytes = data.len() as u64;
    match upload.put_part(PutPayload::from(data)).await {
        Ok(()) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(upload)
        }
        Err(error) => {
            // The parts uploaded so far are abandoned; the next attempt starts over.
            let _ = upload.abort().await;
            Err(origin_error(
                &origins.counters,
                &route,
                "upload a part",
                error,
            ))
        }
    }
}

pub(crate) async fn finish_multipart(
    origins: Arc<Origins>,
    route: Arc<Route>,
    mut upload: Box<dyn object_store::MultipartUpload>,
) -> Result<Option<String>> {
    match upload.complete().await {
        Ok(result) => Ok(result.e_tag),
        Err(error) => {
            let _ = upload.abort().await;
            Err(origin_error(
                &origins.counters,
                &route,
                "complete an upload",
                error,
            ))
        }
    }
}

/// Begin a multipart upload of `path`, driven part by part (object stores only).
pub(crate) async fn create_upload(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    attributes: object_store::Attributes,
) -> Result<MultipartId> {
    origins.counters.puts.fetch_add(1, Ordering::Relaxed);
    let options = object_store::PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    route
        .parts()
        .create_multipart_opts(&path, options)
        .await
        .map_err(|error| origin_error(&origins.counters, &route, "start an upload", error))
}

/// What the origin said to a part.
pub(crate) enum PartAnswer {
    Uploaded(PartId),
    /// SlowDown (or another 503) after `object_store`'s own retries: the prefix is throttled.
    SlowDown,
    /// The origin no longer knows the upload (it expired or was aborted): start over.
    Gone,
}

/// Upload part `index` (from 0) of upload `id`.
pub(crate) async fn upload_part(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    id: MultipartId,
    index: usize,
    data: Bytes,
) -> Result<PartAnswer> {
    let bytes = data.len() as u64;
    match route
        .parts()
        .put_part(&path, &id, index, PutPayload::from(data))
        .await
    {
        Ok(part) => {
            origins
                .counters
                .bytes_out
                .fetch_add(bytes, Ordering::Relaxed);
            Ok(PartAnswer::Uploaded(part))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(PartAnswer::Gone),
        Err(error) if is_slow_down(&error) => {
            origins.counters.slow_downs.fetch_add(1, Ordering::Relaxed);
            Ok(PartAnswer::SlowDown)
        }
        Err(error) => Err(origin_error(
            &origins.counters,
            &route,
            "upload a part",
            error,
        )),
    }
}

/// How a completion ended.
pub(crate) enum Completion {
    /// The object is at the origin, with this ETag when it gave one.
    Done(Option<String>),
    /// The origin no longer knows the upload and does not hold the object: start over.
    Gone,
}

/// Complete upload `id` of `path`, `bytes` long, from `parts`. A completion whose answer was lost
/// (a timeout, a broken connection, an error from an origin that had in fact finished it) is
/// checked with a HEAD, so that an object already assembled is neither uploaded again nor its
/// upload aborted: it counts as done when the origin's object has the upload's size and the
/// ETag S3 gives a multipart object (the MD5 of its parts' MD5s, then `-` and their count).
/// Where the parts' ETags are not MD5s (S3 with SSE-KMS or SSE-C, some compatible stores) the
/// object cannot be told from an older one of the same size, so an upload the origin has
/// forgotten starts over. Any other failure leaves the upload open, to be completed again by
/// the next attempt.
pub(crate) async fn complete_upload(
    origins: Arc<Origins>,
    route: Arc<Route>,
    path: Path,
    id: MultipartId,
    parts: Vec<PartId>,
    bytes: u64,
) -> Result<Completion> {
    let expected = multipart_etag(&parts);
    let error = match route.parts().complete_multipart(&path, &id, parts).await {
        Ok(result) => return Ok(Completion::Done(result.e_tag)),
        Err(error) => error,
    };
    let gone = matches!(error, object_store::Error::NotFound { .. });
    // Without MD5 part ETags no object at the origin can be recognised: no HEAD to ask.
    let found = match expected.as_deref() {
        Some(_) => {
            origins.counters.heads.fetch_add(1, Ordering::Relaxed);
            route.store.head(&path).await.ok()
        }
        None => None,
    };
    if let Some(meta) = found {
        if is_assembled(expected.as_deref(), bytes, meta.e_tag.as_deref(), meta.size) {
            log::info!(
                "origin {}: the completion of {path} failed ({error}), but the object it makes is there",
                route.url
            );
            return Ok(Completion::Done(meta.e_tag));
        }
    }
    if gone {
        return Ok(Completion::Gone);
    }
    Err(origin_error(
        &origins.counters,
        &route,
        "complete an upload",
        error,
    ))
}

/// Abort upload `id` of `path`; its parts are freed at the origin. Failures are logged only: an
/// upload left behind is what S3's lifecycle rules for incomplete uploads are for.
pub(crate) async fn abort_upload(route: Arc<Route>, path: Path, id: MultipartId) -> Result<()> {
    if let Err(error) = route.parts().abort_multipart(&path, &id).await {
        log::warn!(
            "origin {}: could not abort an upload of {path}: {error}",
            route.url
        );
    }
    Ok(())
}

/// Whether the origin's object (`etag`, `size`) is the one an upload of `bytes` whose parts make
/// the multipart ETag `expected` assembles. Without an expected ETag nothing tells it from an
/// older object of the same size: never.
fn is_assembled(expected: Option<&str>, bytes: u64, etag: Option<&str>, size: u64) -> bool {
    match (expected, etag) {
        (Some(expected), Some(etag)) => size == bytes && etag.trim_matches('"') == expected,
        _ => false,
    }
}

/// The ETag S3 gives an object completed from `parts`: the MD5 of their MD5s (their ETags)
/// and their count; `None` when a part's ETag is not an MD5 (other stores, encryption with KMS).
fn multipart_etag(parts: &[PartId]) -> Option<String> {
    use md5::{Digest, Md5};
    let mut digests = Md5::new();
    for part in parts {
        let etag = part.content_id.trim_matches('"');
        if etag.len() != 32 {
            return None;
        }
        for pair in etag.as_bytes().chunks(2) {
            let pair = std::str::from_utf8(pair).ok()?;
            digests.update([u8::from_str_radix(pair, 16).ok()?]);
        }
    }
    let digest = digests.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(format!("{hex}-{}", parts.len()))
}

pub(crate) async fn delete(origins: Arc<Origins>, route: Arc<Route>, path: Path) -> Result<()> {
    origins.counters.deletes.fetch_add(1, Ordering::Relaxed);
    remove_stale_staged(&origins, &route, &path).await;
    match route.store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(error) => Err(origin_error(&origins.counters, &route, "delete", error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assembled_upload_is_recognised_only_by_its_multipart_etag_and_size() {
        let parts: Vec<PartId> = [
            "5d41402abc4b2a76b9719d911017c592",
            "7d793037a0760186574b0282f2f435e7",
        ]
        .iter()
        .map(|md5| PartId {
            content_id: format!("\"{md5}\""),
        })
        .collect();
        let expected = multipart_etag(&parts).expect("MD5 part ETags");
        assert!(expected.ends_with("-2"), "{expected}");
        let quoted = format!("\"{expected}\"");
        assert!(is_assembled(Some(&expected), 100, Some(&quoted), 100));
        assert!(!is_assembled(Some(&expected), 100, Some(&quoted), 99));
        assert!(!is_assembled(Some(&expected), 100, Some("\"0123-2\""), 100));
        assert!(!is_assembled(Some(&expected), 100, None, 100));
        // Parts whose ETags are not MD5s (SSE-KMS): an older object of the same size at the
        // path is not taken for the upload's.
        let opaque = [PartId {
            content_id: "block-0001".to_string(),
        }];
        assert_eq!(multipart_etag(&opaque), None);
        assert!(!is_assembled(None, 100, Some("\"older\""), 100));
        assert!(!is_assembled(None, 100, None, 100));
    }
}
