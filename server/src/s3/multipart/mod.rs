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
use hydrant_engine::{ObjectKey as StoreKey, ObjectMeta, Precondition, LIST_LIMIT_MAX};
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

mod staged;

use super::attributes::{checksum_among, given, with_checksum};
use super::body::{announced_bytes, checksum_of, request_body, BodyCheck, Trailers, Verified};
use super::errors::s3_error as engine_error;
use super::get::{check_source_conditions, chunk_stream, Found};
use super::objects::{etag_of, last_modified, last_modified_of, Gateway, Terms};

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
/// Parts whose checksums Complete looks up at once.
const PART_HEADS_IN_FLIGHT: usize = 64;

use staged::*;

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
        let attributes = given!(input)?;
        let now = now_ms();
        let id = new_id(now)?;
        let record = upload_record(now, &attributes, &input.key);
        self.engine
            .put_key(
                staged(&upload_record_key(&input.bucket, &id))?,
                record,
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
        // The part keeps its checksum, for Complete to build the object's from.
        let terms = Terms {
            precondition: Precondition::Any,
            md5: None,
            attributes: Default::default(),
            keep_checksum: true,
        };
        let (_, Verified { sums, md5 }) = self
            .store_if(staged(&data_key)?, bytes, body, check, trailers, terms)
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
        let Found {
            meta,
            tag,
            body,
            range: resolved,
            ..
        } = self.read(source_bucket, source_key, range).await?;
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
        let sums = self.composite_checksum(&chosen, &named).await?;
        // A FULL_OBJECT checksum (asked for with the Complete, or given in it) is computed of
        // the assembled bytes and checked against the one given; else the parts' COMPOSITE.
        let given = checksum_among(&checksum_of(
            &input.checksum_crc32,
            &input.checksum_crc32c,
            &input.checksum_crc64nvme,
            &input.checksum_sha1,
            &input.checksum_sha256,
        ))
        .filter(|(_, value)| !value.contains('-'));
        let full_asked = input
            .checksum_type
            .as_ref()
            .is_some_and(|kind| kind.as_str() == ChecksumType::FULL_OBJECT);
        let full = match (&given, full_asked) {
            (Some((algorithm, _)), _) => Some(algorithm.clone()),
            (None, true) => sums.algorithm.clone(),
            (None, false) => None,
        };
        if let Some(algorithm) = &full {
            if !FULL_OBJECT_ALGORITHMS.contains(&algorithm.as_str()) {
                return Err(s3_error!(
                    InvalidRequest,
                    "a FULL_OBJECT checksum of an upload is a CRC32, CRC32C or CRC64NVME, not {algorithm}"
                ));
            }
        }
        let composite = match full {
            Some(_) => None,
            None => sums.composite,
        };
        let mut expected = Checksum::default();
        match given.clone() {
            Some((algorithm, value)) if algorithm == "CRC32" => {
                expected.checksum_crc32 = Some(value)
            }
            Some((algorithm, value)) if algorithm == "CRC32C" => {
                expected.checksum_crc32c = Some(value)
            }
            Some((_, value)) => expected.checksum_crc64nvme = Some(value),
            None => {}
        }
        let total: u64 = chosen.iter().map(StagedPart::bytes).sum();
        let md5 = multipart_tag(&chosen);
        let target = Self::key_of(&input.bucket, &input.key)?;
        let gateway = self.clone();
        let bucket = input.bucket.clone();
        let key = input.key.clone();
        // Assembling copies every byte once.
        let assemble = async move {
            let body = gateway.parts_body(&chosen);
            let (check, attributes) = match &full {
                Some(algorithm) => (
                    BodyCheck::computing(algorithm, expected),
                    upload.attributes.clone(),
                ),
                None => (
                    BodyCheck::empty(Checksum::default()),
                    with_checksum(upload.attributes.clone(), composite.clone(), |kept| {
                        gateway.engine.attributes_fit(&target, total, kept)
                    }),
                ),
            };
            let composite_kept = attributes.checksum.clone();
            let terms = Terms {
                precondition: Precondition::Any,
                md5,
                attributes,
                keep_checksum: full.is_some(),
            };
            let (meta, verified) = gateway
                .store_if(target, total, body.boxed(), check, &Trailers::None, terms)
                .await?;
            let kept = match &full {
                Some(_) => checksum_among(&verified.sums),
                None => composite_kept,
            };
            // The object is stored: a staged key left behind is garbage, not a failed upload.
            if let Err(error) = gateway.forget_upload(&upload.bucket, &upload.id).await {
                log::warn!(
                    "S3 multipart: upload {} completed, but its staged parts stay: {error}",
                    upload.id
                );
            }
            let mut output = CompleteMultipartUploadOutput {
                bucket: Some(bucket),
                key: Some(key),
                e_tag: Some(etag_of(&meta, 0)),
                ..Default::default()
            };
            let checksum = hydrant_engine::Attributes {
                checksum: kept,
                ..Default::default()
            };
            super::attributes::answer_checksum!(output, checksum, true);
            Ok(output)
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

    /// The checksum S3 answers for an object assembled from `parts` when each was sent with a
    /// checksum of one algorithm: the checksum of their checksums (decoded, one after the other)
    /// then `-` and their count (S3's COMPOSITE checksums; CRC64NVME has none). InvalidPart when
    /// `named` (the Complete's parts, one for each of `parts`) gives a part another checksum than
    /// the one it kept. (A part that kept none, its checksum crowded out of its first chunk's
    /// header by a long key, leaves the upload with none to answer.)
    async fn composite_checksum(
        &self,
        parts: &[StagedPart],
        named: &[CompletedPart],
    ) -> S3Result<PartSums> {
        let mut sums = Vec::with_capacity(parts.len());
        for batch in parts.chunks(PART_HEADS_IN_FLIGHT) {
            let heads = batch.iter().map(|part| async move {
                let Some(meta) = &part.data else {
                    return Ok(None);
                };
                let described = self
                    .engine
                    .head_described(StoreKey::staged(&meta.key).map_err(engine_error)?)
                    .await
                    .map_err(engine_error)?;
                Ok::<_, s3s::S3Error>(described.and_then(|(_, attributes)| attributes.checksum))
            });
            for sum in futures::future::join_all(heads).await {
                sums.push(sum?);
            }
        }
        for ((part, sum), given) in parts.iter().zip(&sums).zip(named) {
            let given = checksum_among(&checksum_of(
                &given.checksum_crc32,
                &given.checksum_crc32c,
                &given.checksum_crc64nvme,
                &given.checksum_sha1,
                &given.checksum_sha256,
            ));
            if let (Some((algorithm, value)), Some(kept)) = (given, sum) {
                if *kept != (algorithm.clone(), value.clone()) {
                    return Err(s3_error!(
                        InvalidPart,
                        "part {} was not uploaded with the {algorithm} checksum {value}",
                        part.number
                    ));
                }
            }
        }
        let Some(Some((algorithm, _))) = sums.first() else {
            return Ok(PartSums::default());
        };
        let alike = sums
            .iter()
            .all(|sum| matches!(sum, Some((same, _)) if same == algorithm));
        if !alike {
            return Ok(PartSums::default());
        }
        let mut found = PartSums {
            algorithm: Some(algorithm.clone()),
            composite: None,
        };
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        match algorithm.as_str() {
            "CRC32" => hasher.crc32 = Some(Default::default()),
            "CRC32C" => hasher.crc32c = Some(Default::default()),
            "SHA1" => hasher.sha1 = Some(Default::default()),
            "SHA256" => hasher.sha256 = Some(Default::default()),
            _ => return Ok(found),
        }
        for (_, value) in sums.iter().flatten() {
            let Ok(raw) = base64_simd::STANDARD.decode_to_vec(value) else {
                return Ok(found);
            };
            hasher.update(&raw);
        }
        found.composite = checksum_among(&hasher.finalize())
            .map(|(algorithm, value)| (algorithm, format!("{value}-{}", parts.len())));
        Ok(found)
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

/// What the parts of an upload were sent with: the one algorithm all of them have checksums
/// of, if they do, and the COMPOSITE checksum of those (none for CRC64NVME).
#[derive(Default)]
struct PartSums {
    algorithm: Option<String>,
    composite: Option<(String, String)>,
}

/// The algorithms S3 takes an upload's FULL_OBJECT checksum in.
const FULL_OBJECT_ALGORITHMS: [&str; 3] = ["CRC32", "CRC32C", "CRC64NVME"];
