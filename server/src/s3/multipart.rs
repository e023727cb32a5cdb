//! S3's multipart uploads: parts are held durably on NVMe as staged objects (pinned like dirty
//! data, never uploaded, see `ObjectKey::staged`) and assembled into the object when the
//! upload completes, by the bucket's write mode like any PUT (so a write-back bucket uploads
//! the completed object to its origin, in parts when it is large).
//!
//! The staged keys of one upload:
//!
//! ```text
//! multipart/uploads/BUCKET/ID                 the upload: when it began and its key
//! multipart/parts/ID/NNNNN.NONCE.data         a part's bytes (NNNNN its number, 5 digits)
//! multipart/parts/ID/NNNNN.NONCE.MD5          the part is whole; MD5 (hex) is its ETag
//! ```
//!
//! A part counts only once its second key is written, after its bytes are durable, so a part
//! cut off by a crash or a dropped connection is never assembled. Sending a part again
//! writes it under a new nonce and then deletes the earlier one; Complete picks each part by
//! number and ETag, so it assembles exactly the parts its client named. An upload's ID is 32
//! hexadecimal digits: the millisecond it began (12) and randomness (20); anything else is
//! NoSuchUpload before any key is made.
//!
//! An upload that neither completes nor is aborted within the endpoint's expiry (24 hours by
//! default) is aborted by a sweep, so that abandoned parts do not hold NVMe for ever; until the
//! sweep reaches it, it is already answered as NoSuchUpload.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::StreamExt;
use hydrant_engine::{Md5Tag, ObjectKey as StoreKey, ObjectMeta, Precondition, LIST_LIMIT_MAX};
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::body::{announced_bytes, checksum_of, request_body, BodyCheck, Trailers, Verified};
use super::errors::s3_error as engine_error;
use super::objects::{
    check_source_conditions, chunk_stream, etag_of, last_modified, last_modified_of, Gateway,
};

/// Uploads in progress on this node at most (all buckets); CreateMultipartUpload answers
/// SlowDown beyond, until some complete or are aborted.
pub const MULTIPART_UPLOADS_MAX: usize = 1000;
/// Parts of one upload at most, and the highest part number (S3's limit).
const PARTS_MAX: u32 = 10_000;
/// Bytes of one part at most (S3's limit).
const PART_BYTES_MAX: u64 = 5 << 30;
/// Bytes of every part but the last at least (S3's limit).
const PART_BYTES_MIN: u64 = 5 << 20;
/// Parts or uploads of one listing answer at most (S3's limit).
const LISTED_MAX: usize = 1000;
/// Completed uploads up to this size are assembled before the answer starts, so that an error
/// is answered with its status; larger ones answer at once and send S3's keep-alive
/// (whitespace) while they are assembled, so that clients do not time out (a copy at 1 GB/s
/// takes about 4 s for this size; SDKs wait 60 s).
const COMPLETE_BEFORE_ANSWER_BYTES_MAX: u64 = 4 << 30;
/// What the first line of an upload's staged record says.
const UPLOAD_RECORD_MAGIC: &str = "hydrant multipart upload 1";

/// An upload in progress, as its staged record says.
struct Upload {
    bucket: String,
    id: String,
    key: String,
    initiated_ms: u64,
}

/// One part as staged: its bytes, and its ETag once it is whole.
#[derive(Clone)]
struct StagedPart {
    number: u32,
    nonce: String,
    data: Option<ObjectMeta>,
    md5: Option<String>,
}

impl StagedPart {
    fn whole(&self) -> bool {
        self.data.is_some() && self.md5.is_some()
    }

    fn bytes(&self) -> u64 {
        self.data.as_ref().map_or(0, |meta| meta.bytes)
    }
}

/// A part's number, which S3 allows from 1 to `PARTS_MAX`.
fn part_number(number: i32) -> S3Result<u32> {
    u32::try_from(number)
        .ok()
        .filter(|number| (1..=PARTS_MAX).contains(number))
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "part numbers are 1 to {PARTS_MAX}, not {number}"
            )
        })
}

/// A part's size, at most `PART_BYTES_MAX`.
fn check_part_bytes(bytes: u64) -> S3Result<()> {
    if bytes > PART_BYTES_MAX {
        return Err(s3_error!(
            EntityTooLarge,
            "a part is at most {PART_BYTES_MAX} bytes; this one is {bytes}"
        ));
    }
    Ok(())
}

fn staged(key: &str) -> S3Result<StoreKey> {
    StoreKey::staged(key).map_err(engine_error)
}

fn upload_record_key(bucket: &str, id: &str) -> String {
    format!("multipart/uploads/{bucket}/{id}")
}

fn parts_prefix(id: &str) -> String {
    format!("multipart/parts/{id}/")
}

fn part_key(id: &str, number: u32, nonce: &str, tag: &str) -> String {
    format!("{}{number:05}.{nonce}.{tag}", parts_prefix(id))
}

fn no_such_upload(id: &str) -> s3s::S3Error {
    s3_error!(
        NoSuchUpload,
        "there is no upload {id} in progress for this key (completed, aborted, or never begun)"
    )
}

/// 32 hexadecimal digits: the millisecond the upload began (12) and randomness (20).
fn new_id(now_ms: u64) -> S3Result<String> {
    let mut random = [0u8; 10];
    getrandom::fill(&mut random)
        .map_err(|error| s3_error!(InternalError, "no randomness for an upload ID: {error}"))?;
    Ok(format!(
        "{:012x}{}",
        now_ms & 0xffff_ffff_ffff,
        hex(&random)
    ))
}

/// When the upload `id` began, as its ID says, if that is a plausible time (IDs of earlier
/// builds were all randomness: their records say).
fn begun_ms(id: &str, now_ms: u64) -> Option<u64> {
    /// 2025-01-01, before any ID of this form.
    const EARLIEST_MS: u64 = 1_735_689_600_000;
    let begun = u64::from_str_radix(id.get(..12)?, 16).ok()?;
    (EARLIEST_MS..=now_ms.saturating_add(24 * 3600 * 1000))
        .contains(&begun)
        .then_some(begun)
}

/// How often the sweep looks for expired uploads: a quarter of the expiry, within 1 s..1 h.
fn sweep_period(expiry: std::time::Duration) -> std::time::Duration {
    (expiry / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn timestamp_of_ms(ms: u64) -> Timestamp {
    Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

/// Whether `text` is an MD5 as a part's ETag spells it (32 lowercase hexadecimal digits).
fn is_md5(text: &str) -> bool {
    valid_id(text)
}

/// The parts of a listing of `multipart/parts/ID/`, by number (every nonce of each).
fn parse_parts(listing: Vec<ObjectMeta>) -> BTreeMap<u32, Vec<StagedPart>> {
    let mut parts: BTreeMap<u32, Vec<StagedPart>> = BTreeMap::new();
    for meta in listing {
        let name = meta.key.rsplit('/').next().unwrap_or_default().to_string();
        let mut fields = name.split('.');
        let (Some(number), Some(nonce), Some(tag), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(number) = number.parse::<u32>() else {
            continue;
        };
        let versions = parts.entry(number).or_default();
        let index = match versions.iter().position(|part| part.nonce == nonce) {
            Some(index) => index,
            None => {
                versions.push(StagedPart {
                    number,
                    nonce: nonce.to_string(),
                    data: None,
                    md5: None,
                });
                versions.len() - 1
            }
        };
        if tag == "data" {
            versions[index].data = Some(meta);
        } else if is_md5(tag) {
            versions[index].md5 = Some(tag.to_string());
        }
    }
    parts
}

/// The newest whole staged version of each part (the one a listing shows).
fn whole_parts(parts: &BTreeMap<u32, Vec<StagedPart>>) -> Vec<StagedPart> {
    parts
        .values()
        .filter_map(|versions| {
            versions
                .iter()
                .filter(|part| part.whole())
                .max_by_key(|part| part.data.as_ref().map_or(0, |meta| meta.seq))
                .cloned()
        })
        .collect()
}

/// What an ETag a client sent says, without quotes.
fn etag_text(etag: &ETag) -> String {
    etag.value().trim_matches('"').to_ascii_lowercase()
}

impl Gateway {
    /// Every staged object under `prefix`, a page at a time, at most `limit` of them.
    async fn staged_listing(&self, prefix: &str, limit: usize) -> S3Result<Vec<ObjectMeta>> {
        let mut listing: Vec<ObjectMeta> = Vec::new();
        loop {
            let after = listing.last().map(|meta| meta.key.clone());
            let page = self
                .engine
                .list_staged(prefix, after.as_deref(), LIST_LIMIT_MAX.min(limit))
                .await
                .map_err(engine_error)?;
            let full = page.len() == LIST_LIMIT_MAX.min(limit);
            listing.extend(page);
            if !full || listing.len() >= limit {
                listing.truncate(limit);
                return Ok(listing);
            }
        }
    }

    /// A small staged object, whole.
    async fn staged_bytes(&self, key: &str) -> S3Result<Option<Vec<u8>>> {
        let read = self
            .engine
            .get_versioned_key(staged(key)?, None)
            .await
            .map_err(engine_error)?;
        Ok(read.map(|((_, data), _)| data))
    }

    /// Delete staged objects (best effort: one that stays is found and deleted again by the
    /// next Abort or Complete of its upload).
    async fn delete_staged(&self, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            let Ok(store_key) = staged(&key) else {
                continue;
            };
            if let Err(error) = self.engine.delete_key(store_key).await {
                log::warn!("S3 multipart: staged {key} could not be deleted: {error}");
            }
        }
    }

    /// The upload `id` of `bucket/key`, or NoSuchUpload.
    async fn upload(&self, bucket: &str, key: &str, id: &str) -> S3Result<Upload> {
        let upload = self.upload_of_bucket(bucket, id).await?;
        if upload.key != key {
            return Err(no_such_upload(id));
        }
        Ok(upload)
    }

    async fn upload_of_bucket(&self, bucket: &str, id: &str) -> S3Result<Upload> {
        if !valid_id(id) {
            return Err(no_such_upload(id));
        }
        let Some(record) = self.staged_bytes(&upload_record_key(bucket, id)).await? else {
            return Err(no_such_upload(id));
        };
        let upload = parse_upload_record(bucket, id, &record).ok_or_else(|| {
            s3_error!(InternalError, "the staged record of upload {id} is damaged")
        })?;
        if self.expired(upload.initiated_ms, now_ms()) {
            return Err(no_such_upload(id));
        }
        Ok(upload)
    }

    /// Whether an upload that began at `begun_ms` is past the expiry.
    fn expired(&self, begun_ms: u64, now_ms: u64) -> bool {
        self.upload_expiry
            .is_some_and(|expiry| now_ms.saturating_sub(begun_ms) > expiry.as_millis() as u64)
    }

    /// Abort every upload past the expiry; how many were.
    pub(super) async fn expire_uploads(&self) -> S3Result<usize> {
        if self.upload_expiry.is_none() {
            return Ok(0);
        }
        let records = self
            .staged_listing("multipart/uploads/", MULTIPART_UPLOADS_MAX)
            .await?;
        let now = now_ms();
        let mut expired = 0;
        for record in records {
            let Some((bucket, id)) = record
                .key
                .strip_prefix("multipart/uploads/")
                .and_then(|rest| rest.rsplit_once('/'))
            else {
                continue;
            };
            let begun = match begun_ms(id, now) {
                Some(begun) => Some(begun),
                None => self
                    .staged_bytes(&record.key)
                    .await?
                    .and_then(|text| parse_upload_record(bucket, id, &text))
                    .map(|upload| upload.initiated_ms),
            };
            if begun.is_some_and(|begun| self.expired(begun, now)) {
                log::info!("S3 multipart: upload {id} of bucket {bucket} expired; aborting it");
                self.forget_upload(bucket, id).await?;
                expired += 1;
            }
        }
        Ok(expired)
    }

    /// `expire_uploads` now and then, for as long as the endpoint runs.
    pub(super) async fn expire_uploads_forever(self) {
        let Some(expiry) = self.upload_expiry else {
            return;
        };
        loop {
            tokio::time::sleep(sweep_period(expiry)).await;
            if let Err(error) = self.expire_uploads().await {
                log::warn!("S3 multipart: the sweep of expired uploads failed: {error}");
            }
        }
    }

    /// The staged parts of upload `id`, by number.
    async fn staged_parts(&self, id: &str) -> S3Result<BTreeMap<u32, Vec<StagedPart>>> {
        // Each part has two keys, and a part sent again has two more until the earlier goes.
        let listing = self
            .staged_listing(&parts_prefix(id), 4 * PARTS_MAX as usize)
            .await?;
        Ok(parse_parts(listing))
    }

    /// Abort: the upload's record first (so no part is taken for it any more), then its parts.
    async fn forget_upload(&self, bucket: &str, id: &str) -> S3Result<()> {
        self.engine
            .delete_key(staged(&upload_record_key(bucket, id))?)
            .await
            .map_err(engine_error)?;
        let parts = self
            .staged_listing(&parts_prefix(id), 4 * PARTS_MAX as usize)
            .await?;
        self.delete_staged(parts.into_iter().map(|meta| meta.key))
            .await;
        Ok(())
    }

    pub(super) async fn create_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        // The object's name is checked now, not when the upload completes.
        Self::key_of(&input.bucket, &input.key)?;
        let mut open = self
            .staged_listing("multipart/uploads/", MULTIPART_UPLOADS_MAX)
            .await?;
        if open.len() >= MULTIPART_UPLOADS_MAX && self.expire_uploads().await? > 0 {
            open = self
                .staged_listing("multipart/uploads/", MULTIPART_UPLOADS_MAX)
                .await?;
        }
        if open.len() >= MULTIPART_UPLOADS_MAX {
            return Err(s3_error!(
                SlowDown,
                "this node holds {MULTIPART_UPLOADS_MAX} multipart uploads in progress, its most; complete or abort some"
            ));
        }
        let now = now_ms();
        let id = new_id(now)?;
        let record = format!("{UPLOAD_RECORD_MAGIC}\n{now}\n{}", input.key);
        self.engine
            .put_key(
                staged(&upload_record_key(&input.bucket, &id))?,
                record.into_bytes(),
                Precondition::Any,
            )
            .await
            .map_err(engine_error)?;
        let output = CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    pub(super) async fn put_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let bytes = announced_bytes(&req.headers, req.input.content_length)?;
        let mut input = req.input;
        let (body, trailers) = request_body(&req.headers, input.body.take(), req.trailing_headers)?;
        let number = part_number(input.part_number)?;
        check_part_bytes(bytes)?;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let check = BodyCheck::new(
            &req.headers,
            input.content_md5.clone(),
            checksum_of(
                &input.checksum_crc32,
                &input.checksum_crc32c,
                &input.checksum_crc64nvme,
                &input.checksum_sha1,
                &input.checksum_sha256,
            ),
            true,
        )?;
        let (md5, sums) = self
            .store_part(&upload, number, bytes, body, check, &trailers)
            .await?;
        let output = UploadPartOutput {
            e_tag: Some(ETag::Strong(md5)),
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    /// Store part `number` of `upload` from `body` (`bytes` of it, checked by `check`): its
    /// bytes durable first, then the key that makes it whole, then earlier sendings of the
    /// same number deleted. Its MD5 (hex, the part's ETag) and checksums.
    async fn store_part(
        &self,
        upload: &Upload,
        number: u32,
        bytes: u64,
        body: futures::stream::BoxStream<'static, Result<Bytes, s3s::StdError>>,
        check: BodyCheck,
        trailers: &Trailers,
    ) -> S3Result<(String, Checksum)> {
        // 64 bits of randomness tell this sending of the part from any other.
        let nonce = new_id(0)?[16..].to_string();
        let data_key = part_key(&upload.id, number, &nonce, "data");
        let (_, Verified { sums, md5 }) = self
            .store(staged(&data_key)?, bytes, body, check, trailers, None)
            .await?;
        let md5 = hex(&md5.expect("a part's MD5 is always computed"));
        let done_key = part_key(&upload.id, number, &nonce, &md5);
        self.engine
            .put_key(
                staged(&done_key)?,
                md5.clone().into_bytes(),
                Precondition::Any,
            )
            .await
            .map_err(engine_error)?;
        // An Abort or Complete that ran meanwhile has listed the parts already: take this
        // one back rather than leave it behind.
        if self
            .upload(&upload.bucket, &upload.key, &upload.id)
            .await
            .is_err()
        {
            self.delete_staged([data_key, done_key]).await;
            return Err(no_such_upload(&upload.id));
        }
        // The part replaces any earlier one of its number.
        let earlier = self
            .staged_listing(&format!("{}{number:05}.", parts_prefix(&upload.id)), 64)
            .await?
            .into_iter()
            .map(|meta| meta.key)
            .filter(|key| !key.contains(&format!(".{nonce}.")));
        self.delete_staged(earlier).await;
        Ok((md5, sums))
    }

    /// UploadPartCopy: part `number` from another object (or a range of it), within hydrant.
    pub(super) async fn copy_part(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let input = req.input;
        let number = part_number(input.part_number)?;
        let (source_bucket, source_key) =
            self.copy_source(&input.copy_source, req.credentials.as_ref())?;
        let range = input
            .copy_source_range
            .as_deref()
            .map(|text| {
                Range::parse(text).map_err(|_| {
                    s3_error!(
                        InvalidArgument,
                        "x-amz-copy-source-range {text:?} is not bytes=FIRST-LAST"
                    )
                })
            })
            .transpose()?;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let (meta, tag, body, resolved) = self.read(source_bucket, source_key, range).await?;
        check_source_conditions(
            &etag_of(&meta, tag),
            input.copy_source_if_match.as_ref(),
            input.copy_source_if_none_match.as_ref(),
        )?;
        let bytes = resolved.map_or(meta.bytes, |range| range.end - range.start);
        check_part_bytes(bytes)?;
        let check = BodyCheck::new(&req.headers, None, Checksum::default(), true)?;
        let (md5, _) = self
            .store_part(&upload, number, bytes, body.boxed(), check, &Trailers::None)
            .await?;
        let output = UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(md5)),
                last_modified: Some(last_modified()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    pub(super) async fn complete_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let named = input
            .multipart_upload
            .and_then(|upload| upload.parts)
            .unwrap_or_default();
        let chosen = choose_parts(&self.staged_parts(&upload.id).await?, &named)?;
        let total: u64 = chosen.iter().map(StagedPart::bytes).sum();
        let md5 = multipart_tag(&chosen);
        let target = Self::key_of(&input.bucket, &input.key)?;
        let gateway = self.clone();
        let bucket = input.bucket.clone();
        let key = input.key.clone();
        // Assembling copies every byte once.
        let assemble = async move {
            let body = gateway.parts_body(&chosen);
            let check = BodyCheck::empty(Checksum::default());
            let (meta, _) = gateway
                .store(target, total, body.boxed(), check, &Trailers::None, md5)
                .await?;
            // The object is stored: a staged key left behind is garbage, not a failed upload.
            if let Err(error) = gateway.forget_upload(&upload.bucket, &upload.id).await {
                log::warn!(
                    "S3 multipart: upload {} completed, but its staged parts stay: {error}",
                    upload.id
                );
            }
            Ok(CompleteMultipartUploadOutput {
                bucket: Some(bucket),
                key: Some(key),
                e_tag: Some(etag_of(&meta, 0)),
                ..Default::default()
            })
        };
        if total <= COMPLETE_BEFORE_ANSWER_BYTES_MAX {
            return Ok(S3Response::new(assemble.await?));
        }
        // The error of a keep-alive answer comes after its 200 (as S3 does it).
        let output = CompleteMultipartUploadOutput {
            future: Some(Box::pin(assemble)),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    /// The bytes of `parts`, one after the other, each read a chunk at a time.
    fn parts_body(
        &self,
        parts: &[StagedPart],
    ) -> impl futures::Stream<Item = Result<Bytes, s3s::StdError>> + Send + Unpin + 'static {
        let streams: Vec<_> = parts
            .iter()
            .filter_map(|part| {
                let meta = part.data.as_ref()?;
                let key = StoreKey::staged(&meta.key).ok()?;
                Some(chunk_stream(
                    self.engine.clone(),
                    key,
                    0,
                    meta.bytes,
                    (meta.seq, 0),
                ))
            })
            .collect();
        futures::stream::iter(streams)
            .flatten()
            .map(|piece| piece.map_err(|error| Box::new(error) as s3s::StdError))
            .boxed()
    }

    pub(super) async fn abort_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        self.forget_upload(&upload.bucket, &upload.id).await?;
        Ok(S3Response::with_status(
            AbortMultipartUploadOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    pub(super) async fn list_upload_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let max_parts = input
            .max_parts
            .map_or(LISTED_MAX, |max| (max.max(0) as usize).min(LISTED_MAX));
        let marker = input
            .part_number_marker
            .map_or(0, |marker| marker.max(0) as u32);
        let parts = whole_parts(&self.staged_parts(&upload.id).await?);
        let after: Vec<&StagedPart> = parts.iter().filter(|part| part.number > marker).collect();
        let truncated = after.len() > max_parts;
        let page = &after[..after.len().min(max_parts)];
        let output = ListPartsOutput {
            bucket: Some(upload.bucket.clone()),
            key: Some(upload.key.clone()),
            upload_id: Some(upload.id.clone()),
            max_parts: Some(max_parts as i32),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: page.last().map(|part| part.number as i32),
            is_truncated: Some(truncated),
            parts: Some(
                page.iter()
                    .map(|part| Part {
                        part_number: Some(part.number as i32),
                        e_tag: part.md5.clone().map(ETag::Strong),
                        size: Some(part.bytes() as i64),
                        last_modified: Some(
                            part.data
                                .as_ref()
                                .map_or_else(last_modified, last_modified_of),
                        ),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    pub(super) async fn list_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        let records = self
            .staged_listing(
                &format!("multipart/uploads/{}/", input.bucket),
                MULTIPART_UPLOADS_MAX,
            )
            .await?;
        let mut uploads = Vec::with_capacity(records.len());
        for record in records {
            let id = record.key.rsplit('/').next().unwrap_or_default();
            // One that completed or was aborted since the listing is simply not shown.
            if let Ok(upload) = self.upload_of_bucket(&input.bucket, id).await {
                uploads.push(upload);
            }
        }
        let prefix = input.prefix.clone().unwrap_or_default();
        uploads.retain(|upload| upload.key.starts_with(&prefix));
        uploads.sort_by(|left, right| {
            (&left.key, left.initiated_ms, &left.id).cmp(&(
                &right.key,
                right.initiated_ms,
                &right.id,
            ))
        });
        if let Some(marker) = &input.key_marker {
            let id_marker = input.upload_id_marker.clone().unwrap_or_default();
            uploads.retain(|upload| {
                upload.key > *marker || (upload.key == *marker && upload.id > id_marker)
            });
        }
        let max_uploads = input
            .max_uploads
            .map_or(LISTED_MAX, |max| (max.max(0) as usize).min(LISTED_MAX));
        let (listed, common_prefixes) =
            group_by_delimiter(uploads, &prefix, input.delimiter.as_deref(), max_uploads);
        let truncated = listed.truncated;
        let output = ListMultipartUploadsOutput {
            bucket: Some(input.bucket.clone()),
            prefix: input.prefix,
            delimiter: input.delimiter,
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            max_uploads: Some(max_uploads as i32),
            is_truncated: Some(truncated),
            next_key_marker: truncated
                .then(|| listed.uploads.last().map(|upload| upload.key.clone()))
                .flatten(),
            next_upload_id_marker: truncated
                .then(|| listed.uploads.last().map(|upload| upload.id.clone()))
                .flatten(),
            uploads: Some(
                listed
                    .uploads
                    .into_iter()
                    .map(|upload| MultipartUpload {
                        key: Some(upload.key),
                        upload_id: Some(upload.id),
                        initiated: Some(timestamp_of_ms(upload.initiated_ms)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            common_prefixes: (!common_prefixes.is_empty()).then(|| {
                common_prefixes
                    .into_iter()
                    .map(|prefix| CommonPrefix {
                        prefix: Some(prefix),
                    })
                    .collect()
            }),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }
}

fn parse_upload_record(bucket: &str, id: &str, record: &[u8]) -> Option<Upload> {
    let text = std::str::from_utf8(record).ok()?;
    let mut lines = text.splitn(3, '\n');
    if lines.next()? != UPLOAD_RECORD_MAGIC {
        return None;
    }
    let initiated_ms = lines.next()?.parse().ok()?;
    let key = lines.next()?.to_string();
    Some(Upload {
        bucket: bucket.to_string(),
        id: id.to_string(),
        key,
        initiated_ms,
    })
}

/// The staged parts a Complete names, in its order: each by number and ETag, in ascending
/// order, every one but the last at least `PART_BYTES_MIN`.
/// S3's ETag of an object assembled from `parts`: the MD5 of their MD5 digests, one after the
/// other, and their count (`None` if a part's MD5 is not known, which a whole part's always is).
fn multipart_tag(parts: &[StagedPart]) -> Option<Md5Tag> {
    use s3s::crypto::Checksum as _;
    let mut md5 = s3s::crypto::Md5::new();
    for part in parts {
        let tag = Md5Tag::parse(part.md5.as_deref()?)?;
        md5.update(&tag.digest);
    }
    Some(Md5Tag {
        digest: md5.finalize(),
        parts: u16::try_from(parts.len()).ok()?,
    })
}

fn choose_parts(
    staged: &BTreeMap<u32, Vec<StagedPart>>,
    named: &[CompletedPart],
) -> S3Result<Vec<StagedPart>> {
    if named.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "a CompleteMultipartUpload names at least one part"
        ));
    }
    if named.len() > PARTS_MAX as usize {
        return Err(s3_error!(
            MalformedXML,
            "an upload has at most {PARTS_MAX} parts"
        ));
    }
    let mut chosen: Vec<StagedPart> = Vec::with_capacity(named.len());
    for part in named {
        let number = part.part_number.unwrap_or(0);
        if chosen
            .last()
            .is_some_and(|previous| previous.number as i32 >= number)
        {
            return Err(s3_error!(
                InvalidPartOrder,
                "parts are named in ascending order of their numbers"
            ));
        }
        let wanted = part.e_tag.as_ref().map(etag_text);
        let found = u32::try_from(number)
            .ok()
            .and_then(|number| staged.get(&number))
            .and_then(|versions| {
                versions
                    .iter()
                    .find(|version| version.whole() && version.md5 == wanted)
            })
            .ok_or_else(|| {
                s3_error!(
                    InvalidPart,
                    "part {number} with ETag {} was not uploaded (or not whole)",
                    wanted.as_deref().unwrap_or("(none)")
                )
            })?;
        chosen.push(found.clone());
    }
    if let Some(small) = chosen[..chosen.len() - 1]
        .iter()
        .find(|part| part.bytes() < PART_BYTES_MIN)
    {
        return Err(s3_error!(
            EntityTooSmall,
            "part {} has {} bytes; every part but the last has at least {PART_BYTES_MIN}",
            small.number,
            small.bytes()
        ));
    }
    Ok(chosen)
}

/// A page of uploads, and the prefixes that a delimiter groups them into.
struct ListedUploads {
    uploads: Vec<Upload>,
    truncated: bool,
}

fn group_by_delimiter(
    uploads: Vec<Upload>,
    prefix: &str,
    delimiter: Option<&str>,
    max: usize,
) -> (ListedUploads, Vec<String>) {
    let mut listed = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut truncated = false;
    for upload in uploads {
        if listed.len() + prefixes.len() >= max {
            truncated = true;
            break;
        }
        let grouped = delimiter
            .filter(|delimiter| !delimiter.is_empty())
            .and_then(|delimiter| {
                upload.key[prefix.len()..]
                    .find(delimiter)
                    .map(|at| upload.key[..prefix.len() + at + delimiter.len()].to_string())
            });
        match grouped {
            Some(common) => {
                if prefixes.last() != Some(&common) {
                    prefixes.push(common);
                }
            }
            None => listed.push(upload),
        }
    }
    (
        ListedUploads {
            uploads: listed,
            truncated,
        },
        prefixes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged_meta(key: &str, bytes: u64, seq: u64) -> ObjectMeta {
        ObjectMeta {
            bucket: hydrant_engine::STAGED_BUCKET.to_string(),
            key: key.to_string(),
            bytes,
            seq,
            dirty: true,
            stamp: Default::default(),
        }
    }

    #[test]
    fn a_part_counts_once_whole_and_complete_picks_by_number_and_etag() {
        let id = "0123456789abcdef0123456789abcdef";
        let md5_a = "00112233445566778899aabbccddeeff";
        let md5_b = "ffeeddccbbaa99887766554433221100";
        let listing = vec![
            staged_meta(&part_key(id, 1, "n1", "data"), 6 << 20, 1),
            staged_meta(&part_key(id, 1, "n1", md5_a), 32, 2),
            // Part 2 sent twice: once whole, once cut off (no second key).
            staged_meta(&part_key(id, 2, "n2", "data"), 10, 3),
            staged_meta(&part_key(id, 2, "n2", md5_b), 32, 4),
            staged_meta(&part_key(id, 2, "n3", "data"), 99, 5),
        ];
        let parts = parse_parts(listing);
        let whole = whole_parts(&parts);
        assert_eq!(
            whole
                .iter()
                .map(|part| (part.number, part.bytes()))
                .collect::<Vec<_>>(),
            vec![(1, 6 << 20), (2, 10)]
        );
        let named = |number: i32, etag: &str| CompletedPart {
            part_number: Some(number),
            e_tag: Some(ETag::Strong(etag.to_string())),
            ..Default::default()
        };
        let chosen = choose_parts(&parts, &[named(1, md5_a), named(2, md5_b)]).unwrap();
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[1].nonce, "n2");
        let code = |result: S3Result<Vec<StagedPart>>| result.err().unwrap().code().clone();
        assert_eq!(
            code(choose_parts(&parts, &[named(1, md5_b)])),
            s3s::S3ErrorCode::InvalidPart
        );
        assert_eq!(
            code(choose_parts(&parts, &[named(2, md5_b), named(1, md5_a)])),
            s3s::S3ErrorCode::InvalidPartOrder
        );
        // Part 2 (10 bytes) may not come before another.
        let small_first = parse_parts(vec![
            staged_meta(&part_key(id, 1, "n1", "data"), 10, 1),
            staged_meta(&part_key(id, 1, "n1", md5_a), 32, 2),
            staged_meta(&part_key(id, 2, "n2", "data"), 10, 3),
            staged_meta(&part_key(id, 2, "n2", md5_b), 32, 4),
        ]);
        assert_eq!(
            code(choose_parts(
                &small_first,
                &[named(1, md5_a), named(2, md5_b)]
            )),
            s3s::S3ErrorCode::EntityTooSmall
        );
    }

    #[test]
    fn upload_ids_and_records_are_checked() {
        let id = new_id(now_ms()).unwrap();
        assert!(valid_id(&id));
        assert!(!valid_id("../../etc"));
        assert!(!valid_id(&id.to_uppercase()));
        let record = format!("{UPLOAD_RECORD_MAGIC}\n17\nkey with\nnewline");
        let upload = parse_upload_record("b", &id, record.as_bytes()).unwrap();
        assert_eq!(upload.key, "key with\nnewline");
        assert_eq!(upload.initiated_ms, 17);
        assert!(parse_upload_record("b", &id, b"something else\n1\nk").is_none());
    }

    #[test]
    fn an_upload_id_says_when_it_began_and_random_ids_are_not_read_as_times() {
        let now = now_ms();
        let id = new_id(now).unwrap();
        assert_eq!(begun_ms(&id, now), Some(now));
        // An ID of an earlier build (all randomness) reading as the far future or the past.
        assert_eq!(begun_ms("ffffffffffff00000000000000000000", now), None);
        assert_eq!(begun_ms("00000000000100000000000000000000", now), None);
        assert_eq!(
            sweep_period(std::time::Duration::from_secs(24 * 3600)),
            std::time::Duration::from_secs(3600)
        );
        assert_eq!(
            sweep_period(std::time::Duration::from_secs(2)),
            std::time::Duration::from_secs(1)
        );
    }
}
