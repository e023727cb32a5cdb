//! Objects through S3: the gateway (s3s's `S3` operations), HEAD, PUT (checksums verified
//! before the write is acknowledged), DELETE, DeleteObjects and CopyObject; GET's reads are in
//! `get`. Bodies move a chunk at a time: a PUT larger than a chunk is stored as a streamed put
//! (`EngineHandle::put_stream`), its chunks taken from the node's bound on streamed bytes.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hydrant_engine::{
    Attributes, EngineHandle, Md5Tag, ObjectKey as StoreKey, ObjectMeta, Precondition,
};
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};

use super::attributes::{
    answer, answer_checksum, checksum_among, checksum_asked, given, with_checksum,
};
use super::auth::Credentials;
use super::body::{
    announced_bytes, checksum_of, request_body, BodyCheck, Pieces, Trailers, Verified,
};
use super::buckets;
use super::errors::s3_error as engine_error;
use super::get::{check_if_match, check_read_conditions, check_source_conditions, Found};

/// How often a PUT waiting for room in the node's bound on streamed bytes looks again.
const STREAMED_ROOM_POLL: Duration = Duration::from_millis(1);
/// Objects of one DeleteObjects at most (S3's limit).
const DELETE_OBJECTS_MAX: usize = 1000;
/// Deletes of one DeleteObjects in flight at once.
const DELETES_IN_FLIGHT: usize = 64;

#[derive(Clone)]
pub(crate) struct Gateway {
    pub(super) engine: EngineHandle,
    pub(super) credentials: Option<Credentials>,
    /// Multipart uploads older than this are aborted (see `multipart`).
    pub(super) upload_expiry: Option<std::time::Duration>,
}

impl Gateway {
    pub(crate) fn new(
        engine: EngineHandle,
        credentials: Option<Credentials>,
        upload_expiry: Option<std::time::Duration>,
    ) -> Gateway {
        Gateway {
            engine,
            credentials,
            upload_expiry,
        }
    }
}

/// The ETag of a version: its MD5 tag where it has one (S3's ETag: an object written through
/// this endpoint, or read from an S3 origin). Else its shard's sequence number (or, for bytes
/// straight from the origin, the tag of the origin version) and its size: it changes whenever
/// the object does, and stays the same across restarts while the version is on NVMe.
pub(crate) fn etag_of(meta: &ObjectMeta, origin_version: u64) -> ETag {
    if let Some(md5) = meta.stamp.md5 {
        return ETag::Strong(md5.to_string());
    }
    let (seq, bytes) = (meta.seq, meta.bytes);
    if seq != 0 {
        ETag::Strong(format!("{seq:x}-{bytes:x}"))
    } else {
        ETag::Strong(format!("o{origin_version:x}-{bytes:x}"))
    }
}

/// When the version was written, to the second (HTTP dates have no finer unit, and LIST and
/// HEAD must agree for tools that compare times); `None` where the store does not know (a
/// version written by a build that kept no times).
pub(crate) fn modified_of(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.stamp.modified().map(|time| {
        let seconds = time
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Timestamp::from(std::time::UNIX_EPOCH + Duration::from_secs(seconds))
    })
}

/// The Last-Modified of a version: when it was written, or the time of the answer where that
/// is not known.
pub(crate) fn last_modified_of(meta: &ObjectMeta) -> Timestamp {
    modified_of(meta).unwrap_or_else(last_modified)
}

/// The time of the answer (of a bucket, a part, or a version of unknown time).
pub(crate) fn last_modified() -> Timestamp {
    Timestamp::from(std::time::SystemTime::now())
}

/// What a stored version is held to, and says of itself.
pub(super) struct Terms {
    /// Checked on the key's shard just before the install.
    pub precondition: Precondition,
    /// The version's MD5 tag where it is known before the body is (an assembled multipart
    /// upload's); else the MD5 the body's check computes, if it computes one.
    pub md5: Option<Md5Tag>,
    /// Its Content-Type, user metadata and the rest (see `attributes`).
    pub attributes: Attributes,
    /// Keep the whole object's checksum the sender gave with the version (a PUT's, a part's):
    /// given in a header, or in a trailer (of a body of several chunks, its value goes in the
    /// last chunk's header).
    pub keep_checksum: bool,
}

impl Gateway {
    /// A copy's source as (bucket, key), which the request's key (if any) must be allowed to
    /// read.
    pub(super) fn copy_source<'a>(
        &self,
        source: &'a CopySource,
        signed: Option<&s3s::auth::Credentials>,
    ) -> S3Result<(&'a str, &'a str)> {
        let CopySource::Bucket {
            bucket,
            key,
            version_id,
        } = source
        else {
            return Err(s3_error!(
                NotImplemented,
                "copies name their source as bucket/key"
            ));
        };
        if version_id.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "hydrant keeps one version of an object: copies cannot name a versionId"
            ));
        }
        if let (Some(credentials), Some(signed)) = (&self.credentials, signed) {
            if !credentials.allows(&signed.access_key, bucket, false) {
                return Err(s3_error!(
                    AccessDenied,
                    "{} may not read bucket {bucket}",
                    signed.access_key
                ));
            }
        }
        Ok((bucket, key))
    }

    /// Room for a chunk of `bytes` in the node's bound on streamed bytes, waiting for it.
    async fn streamed_chunk(&self, bytes: usize) -> hydrant_engine::StreamedChunk {
        self.streamed_room(bytes, true).await
    }

    /// `streamed_chunk`, with its data allocated (`allocate`) or not (for bytes kept in
    /// memory of the caller's own).
    async fn streamed_room(&self, bytes: usize, allocate: bool) -> hydrant_engine::StreamedChunk {
        loop {
            if let Some(chunk) = self.engine.try_streamed_room(bytes, allocate) {
                return chunk;
            }
            tokio::time::sleep(STREAMED_ROOM_POLL).await;
        }
    }

    /// Store `bytes` bytes from `body` as `key`, checked by `check` before the version becomes
    /// visible (nothing is stored when the body is short, long or fails its check), on `terms`:
    /// a precondition, checked on the key's shard just before the install, the version's MD5
    /// tag, its attributes and whether it keeps the sender's checksum.
    pub(super) async fn store_if<S>(
        &self,
        key: StoreKey,
        bytes: u64,
        body: S,
        mut check: BodyCheck,
        trailers: &Trailers,
        terms: Terms,
    ) -> S3Result<(ObjectMeta, Verified)>
    where
        S: futures::Stream<Item = Result<Bytes, s3s::StdError>> + Unpin,
    {
        let Terms {
            precondition,
            md5,
            mut attributes,
            keep_checksum,
        } = terms;
        let mut pieces = Pieces::new(body);
        let chunk_bytes = self.engine.chunk_bytes();
        let short = |got: u64| {
            s3s::S3Error::with_message(
                s3s::S3ErrorCode::IncompleteBody,
                format!("the body ended after {got} of the {bytes} bytes it announced"),
            )
        };
        if bytes <= chunk_bytes {
            // Within the node's bound on streamed bytes too, until the put is done.
            let room = self.streamed_room(bytes as usize, false).await;
            let mut data = Vec::with_capacity(bytes as usize);
            pieces.fill(&mut data, bytes as usize, &mut check).await?;
            if (data.len() as u64) < bytes {
                return Err(short(data.len() as u64));
            }
            if pieces.has_more().await? {
                return Err(long(bytes));
            }
            let sums = check.finish(trailers)?;
            if keep_checksum {
                attributes = with_checksum(attributes, checksum_among(&sums.sums), |kept| {
                    self.engine.attributes_fit(&key, bytes, kept)
                });
            }
            let tag = md5.or(sums.md5.map(Md5Tag::whole));
            let meta = self
                .engine
                .put_tagged(key, data, precondition, tag, &attributes)
                .await
                .map_err(engine_error)?;
            drop(room);
            return Ok((meta, sums));
        }
        if keep_checksum {
            // Verified before the last chunk goes, so before the version is visible. One that
            // comes in a trailer is known only then: the first chunk names its algorithm, and
            // the last chunk's header holds its value.
            let checksum = checksum_among(check.announced())
                .or_else(|| check.promised().map(|algorithm| (algorithm, String::new())));
            attributes = with_checksum(attributes, checksum, |kept| {
                self.engine.attributes_fit(&key, bytes, kept)
            });
        }
        let pending = attributes.checksum_pending();
        let (sink, done) = self
            .engine
            .put_stream_key(key, bytes, precondition, &attributes)
            .map_err(engine_error)?;
        let done = super::spawn(done);
        let mut sent = 0u64;
        let mut outcome = Ok(());
        let mut sums = None;
        while sent < bytes {
            let want = chunk_bytes.min(bytes - sent) as usize;
            let mut chunk = self.streamed_chunk(want).await;
            if let Err(error) = pieces.fill(&mut chunk.data, want, &mut check).await {
                outcome = Err(error);
                break;
            }
            if chunk.data.len() < want {
                outcome = Err(short(sent + chunk.data.len() as u64));
                break;
            }
            sent += want as u64;
            if sent == bytes {
                // The last chunk makes the version visible: send it only once the body has
                // ended where it said and its checksums match.
                outcome = match pieces.has_more().await {
                    Ok(true) => Err(long(bytes)),
                    Ok(false) => {
                        match std::mem::replace(&mut check, BodyCheck::empty(Checksum::default()))
                            .finish(trailers)
                        {
                            Ok(verified) => {
                                chunk.md5 = md5.or(verified.md5.map(Md5Tag::whole));
                                if pending {
                                    chunk.checksum = checksum_among(&verified.sums);
                                }
                                sums = Some(verified);
                                Ok(())
                            }
                            Err(error) => Err(error),
                        }
                    }
                    Err(error) => Err(error),
                };
                if outcome.is_err() {
                    break;
                }
            }
            if !sink.send(chunk).await {
                break; // the put ended early; its outcome says why
            }
        }
        drop(sink);
        let stored = done
            .await
            .map_err(|error| s3_error!(InternalError, "the put did not finish: {error}"))?;
        outcome?;
        let meta = stored.map_err(engine_error)?;
        Ok((meta, sums.unwrap_or_default()))
    }

    /// The engine's key of a client's `bucket/key` (InvalidArgument for a name the grammar
    /// refuses).
    pub(super) fn key_of(bucket: &str, key: &str) -> S3Result<StoreKey> {
        StoreKey::new(bucket, key).map_err(engine_error)
    }
}

fn long(bytes: u64) -> s3s::S3Error {
    s3_error!(
        InvalidRequest,
        "the body is longer than the {bytes} bytes it announced"
    )
}

pub(super) fn no_such_key(bucket: &str, key: &str) -> s3s::S3Error {
    s3_error!(
        NoSuchKey,
        "{bucket}/{key} is neither here nor at its origin"
    )
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        Ok(S3Response::new(self.get(req.input).await?))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let (meta, attributes) = self
            .engine
            .head_described(Self::key_of(&input.bucket, &input.key)?)
            .await
            .map_err(engine_error)?
            .ok_or_else(|| no_such_key(&input.bucket, &input.key))?;
        let etag = etag_of(&meta, 0);
        let modified = modified_of(&meta);
        // A HEAD of an object not on NVMe whose origin gave no MD5 tag has no version yet:
        // conditions compare with what a GET would answer only once it is. Its ETag says so
        // (SDKs require one).
        if meta.seq != 0 || meta.stamp.md5.is_some() {
            check_read_conditions(
                &etag,
                modified.as_ref(),
                input.if_match.as_ref(),
                input.if_none_match.as_ref(),
                input.if_modified_since.as_ref(),
                input.if_unmodified_since.as_ref(),
            )?;
        }
        let mut output = HeadObjectOutput {
            content_length: Some(meta.bytes as i64),
            accept_ranges: Some("bytes".to_string()),
            e_tag: Some(etag),
            last_modified: Some(modified.unwrap_or_else(last_modified)),
            ..Default::default()
        };
        answer_checksum!(
            output,
            attributes,
            input.part_number.is_none() && checksum_asked(input.checksum_mode.as_ref())
        );
        answer!(output, attributes);
        Ok(S3Response::new(output))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let bytes = announced_bytes(&req.headers, req.input.content_length)?;
        let mut input = req.input;
        let (body, trailers) = request_body(&req.headers, input.body.take(), req.trailing_headers)?;
        let attributes = given!(input)?;
        // Conditional writes: If-None-Match: * (create only) and If-Match (replace only the
        // version the writer read). Checked before the body is taken (a write bound to fail
        // does not read it), and again on the key's shard under its lock just before the
        // install, so of writers racing for one condition one wins.
        let mut precondition = Precondition::Any;
        if input.if_none_match.is_some() || input.if_match.is_some() {
            let found = self
                .engine
                .head(&input.bucket, &input.key)
                .await
                .map_err(engine_error)?;
            if let Some(ETagCondition::Any) = &input.if_none_match {
                if found.is_some() {
                    return Err(s3_error!(
                        PreconditionFailed,
                        "{}/{} exists (If-None-Match: *)",
                        input.bucket,
                        input.key
                    ));
                }
                precondition = Precondition::Absent;
            }
            if let Some(condition) = &input.if_match {
                let Some(found) = &found else {
                    return Err(no_such_key(&input.bucket, &input.key));
                };
                check_if_match(Some(condition), &etag_of(found, 0))?;
                if found.seq != 0 {
                    precondition = Precondition::Version(found.seq);
                }
            }
        }
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
        let key = Self::key_of(&input.bucket, &input.key)?;
        let (meta, Verified { sums, .. }) = self
            .store_if(
                key,
                bytes,
                body,
                check,
                &trailers,
                Terms {
                    precondition,
                    md5: None,
                    attributes,
                    keep_checksum: true,
                },
            )
            .await?;
        let output = PutObjectOutput {
            e_tag: Some(etag_of(&meta, 0)),
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            size: Some(meta.bytes as i64),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.engine
            .delete(&req.input.bucket, &req.input.key)
            .await
            .map_err(engine_error)?;
        Ok(S3Response::with_status(
            DeleteObjectOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let objects = input.delete.objects;
        if objects.len() > DELETE_OBJECTS_MAX {
            return Err(s3_error!(
                MalformedXML,
                "one DeleteObjects names at most {DELETE_OBJECTS_MAX} objects, not {}",
                objects.len()
            ));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for batch in objects.chunks(DELETES_IN_FLIGHT) {
            let calls = batch
                .iter()
                .map(|object| self.engine.delete(&input.bucket, &object.key));
            let outcomes = futures::future::join_all(calls).await;
            for (object, outcome) in batch.iter().zip(outcomes) {
                match outcome {
                    Ok(_) => {
                        if !quiet {
                            deleted.push(DeletedObject {
                                key: Some(object.key.clone()),
                                ..Default::default()
                            });
                        }
                    }
                    Err(error) => {
                        let error = engine_error(error);
                        errors.push(Error {
                            code: Some(error.code().as_str().to_string()),
                            key: Some(object.key.clone()),
                            message: error.message().map(str::to_string),
                            ..Default::default()
                        });
                    }
                }
            }
        }
        let output = DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let (source_bucket, source_key) =
            self.copy_source(&input.copy_source, req.credentials.as_ref())?;
        // The copy keeps the source's attributes, or takes the request's (REPLACE).
        let replace = match input
            .metadata_directive
            .as_ref()
            .map(|given| given.as_str())
        {
            None | Some(MetadataDirective::COPY) => false,
            Some(MetadataDirective::REPLACE) => true,
            Some(other) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-metadata-directive is COPY or REPLACE, not {other:?}"
                ))
            }
        };
        if !replace && (source_bucket, source_key) == (input.bucket.as_str(), input.key.as_str()) {
            return Err(s3_error!(
                InvalidRequest,
                "this copy request is illegal because it is trying to copy an object to itself without changing its metadata (send x-amz-metadata-directive: REPLACE)"
            ));
        }
        let given = if replace { Some(given!(input)?) } else { None };
        // The copy's bytes are the source's: so is its checksum, whichever attributes it takes.
        let Found {
            meta,
            tag,
            body,
            attributes,
            ..
        } = self.read(source_bucket, source_key, None).await?;
        check_source_conditions(
            &etag_of(&meta, tag),
            input.copy_source_if_match.as_ref(),
            input.copy_source_if_none_match.as_ref(),
        )?;
        // The copy's ETag is the MD5 of its bytes, as a PUT's (S3's, for a copy of a
        // multipart object too).
        let check = BodyCheck::empty(Checksum::default()).with_md5();
        let target = Self::key_of(&input.bucket, &input.key)?;
        // A checksum of the whole object's bytes; not one made of an upload's parts, which
        // the copy (stored whole) does not have.
        let checksum = attributes
            .checksum
            .clone()
            .filter(|(_, value)| !value.contains('-'));
        let attributes = with_checksum(given.unwrap_or(attributes), checksum, |kept| {
            self.engine.attributes_fit(&target, meta.bytes, kept)
        });
        let terms = Terms {
            precondition: Precondition::Any,
            md5: None,
            attributes,
            keep_checksum: false,
        };
        let (stored, _) = self
            .store_if(
                target,
                meta.bytes,
                body.boxed(),
                check,
                &Trailers::None,
                terms,
            )
            .await?;
        let output = CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag_of(&stored, 0)),
                last_modified: Some(last_modified_of(&stored)),
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        buckets::list_buckets(self, req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        buckets::head_bucket(self, req).await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        buckets::create_bucket(self, req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        buckets::delete_bucket(self, req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        buckets::list_objects(self, req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        buckets::list_objects_v2(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.create_upload(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.copy_part(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.put_part(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort_upload(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.list_upload_parts(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.list_uploads(req).await
    }

    async fn get_bucket_location(
        &self,
        _req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }
}
