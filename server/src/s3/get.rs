//! Reads of objects through S3: GetObject (a range, the read conditions, a body sent a chunk
//! at a time with one chunk read ahead) and what HEAD and CopyObject share with it.

use bytes::Bytes;
use futures::StreamExt;
use hydrant_engine::{
    Attributes, ByteRange, EngineHandle, ObjectKey as StoreKey, ObjectMeta, SharedRead,
};
use s3s::dto::*;
use s3s::{s3_error, S3Result};

use super::attributes::{answer, answer_checksum, checksum_asked};
use super::errors::s3_error as engine_error;
use super::objects::{etag_of, last_modified, modified_of, no_such_key, Gateway};

/// A version read for an answer: its metadata and attributes, the origin version tag of data
/// read through (see `etag_of`), the body (a chunk read already, the rest as it is sent) and
/// the range it covers (`None`: the whole object).
pub(super) struct Found {
    pub meta: ObjectMeta,
    pub tag: u64,
    pub body: StreamingBlob,
    pub range: Option<std::ops::Range<u64>>,
    pub attributes: Attributes,
}

/// A read's conditions, as HTTP orders them (RFC 9110): If-Match, else If-Unmodified-Since
/// (412 when it fails); then If-None-Match, else If-Modified-Since (304). Conditions on time
/// hold where the version's time is not known.
pub(super) fn check_read_conditions(
    etag: &ETag,
    modified: Option<&Timestamp>,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    if if_match.is_some() {
        check_if_match(if_match, etag)?;
    } else if let (Some(since), Some(modified)) = (if_unmodified_since, modified) {
        if modified > since {
            return Err(s3_error!(
                PreconditionFailed,
                "the object was modified after the If-Unmodified-Since time"
            ));
        }
    }
    if if_none_match.is_some() {
        check_if_none_match(if_none_match, etag)?;
    } else if let (Some(since), Some(modified)) = (if_modified_since, modified) {
        if modified <= since {
            return Err(s3_error!(NotModified));
        }
    }
    Ok(())
}

/// 412 unless `condition` matches `etag` (If-Match).
pub(super) fn check_if_match(condition: Option<&ETagCondition>, etag: &ETag) -> S3Result<()> {
    match condition {
        Some(ETagCondition::ETag(wanted)) if wanted.value() != etag.value() => Err(s3_error!(
            PreconditionFailed,
            "the object's ETag is {}",
            etag.value()
        )),
        _ => Ok(()),
    }
}

/// 304 when `condition` matches `etag` (If-None-Match on a read).
fn check_if_none_match(condition: Option<&ETagCondition>, etag: &ETag) -> S3Result<()> {
    let matches = match condition {
        Some(ETagCondition::Any) => true,
        Some(ETagCondition::ETag(wanted)) => wanted.value() == etag.value(),
        None => false,
    };
    if matches {
        Err(s3_error!(NotModified))
    } else {
        Ok(())
    }
}

/// A read's range resolved against the object's size: `start..end`, or InvalidRange (which
/// carries the size, see `super::with_object_size`).
fn resolve(range: Option<Range>, size: u64) -> S3Result<Option<std::ops::Range<u64>>> {
    match range {
        None => Ok(None),
        Some(range) => range.check(size).map(Some).map_err(|_| invalid_range(size)),
    }
}

/// InvalidRange for an object of `size` bytes, carrying the size for S3's error document.
fn invalid_range(size: u64) -> s3s::S3Error {
    let mut error = s3_error!(
        InvalidRange,
        "the range is outside an object of {size} bytes"
    );
    let mut headers = hyper::HeaderMap::new();
    headers.insert(super::ACTUAL_OBJECT_SIZE_HEADER, size.into());
    error.set_headers(headers);
    error
}

/// Chunks of a GET read ahead of the one being sent.
const GET_CHUNKS_AHEAD: usize = 1;

/// The bytes `next..end` of one version of an object, read a chunk at a time by a task of
/// their own (one chunk ahead of the one being sent); a read that finds another version (the
/// object changed meanwhile) ends the body with an error, so that the client never gets two
/// versions joined. A client that stops reading stops the task.
pub(super) fn chunk_stream(
    engine: EngineHandle,
    key: StoreKey,
    next: u64,
    end: u64,
    version: (u64, u64),
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static {
    let (chunks, received) = tokio::sync::mpsc::channel(GET_CHUNKS_AHEAD);
    super::spawn(async move {
        let chunk = engine.chunk_bytes();
        let mut next = next;
        while next < end {
            let stop = (next / chunk + 1) * chunk;
            let range = ByteRange {
                start: next,
                end: Some(stop.min(end)),
            };
            let read = engine.get_shared_key(key.clone(), Some(range)).await;
            let part = match read {
                Ok(Some(SharedRead {
                    meta,
                    data,
                    origin_version,
                    ..
                })) if (meta.seq, origin_version) == version && !data.is_empty() => {
                    next += data.len() as u64;
                    Ok(data)
                }
                Ok(Some(_)) | Ok(None) => Err(std::io::Error::other(format!(
                    "{}/{} changed while it was being read",
                    key.bucket(),
                    key.key()
                ))),
                Err(error) => Err(std::io::Error::other(error.to_string())),
            };
            let failed = part.is_err();
            if chunks.send(part).await.is_err() || failed {
                return;
            }
        }
    });
    futures::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|part| (part, received))
    })
}

/// A body of `bytes` bytes made of `first` (read already) and the rest, read as it is sent.
fn body_of(
    engine: &EngineHandle,
    key: StoreKey,
    meta: &ObjectMeta,
    tag: u64,
    first: Bytes,
    start: u64,
    end: u64,
) -> StreamingBlob {
    let first_end = start + first.len() as u64;
    let head = futures::stream::once(async move { Ok(first) });
    if first_end >= end {
        return StreamingBlob::wrap(head);
    }
    let rest = chunk_stream(engine.clone(), key, first_end, end, (meta.seq, tag));
    StreamingBlob::wrap(head.chain(rest))
}

/// A copy's conditions on its source (`x-amz-copy-source-if-match`, `-if-none-match`).
pub(super) fn check_source_conditions(
    source_etag: &ETag,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    check_if_match(if_match, source_etag)?;
    if let Some(ETagCondition::ETag(unwanted)) = if_none_match {
        if unwanted.value() == source_etag.value() {
            return Err(s3_error!(
                PreconditionFailed,
                "the source's ETag is {}",
                source_etag.value()
            ));
        }
    }
    Ok(())
}

impl Gateway {
    /// The whole object or a range of it, with its metadata and attributes.
    pub(super) async fn read(
        &self,
        bucket: &str,
        key: &str,
        range: Option<Range>,
    ) -> S3Result<Found> {
        let store_key = Self::key_of(bucket, key)?;
        let chunk = self.engine.chunk_bytes();
        // The first read: the range's first chunk (the object's, for a suffix or no range).
        let start = match range {
            Some(Range::Int { first, .. }) => first,
            _ => 0,
        };
        let first_end = match range {
            Some(Range::Int {
                first,
                last: Some(last),
            }) => (last.saturating_add(1)).min((first / chunk + 1) * chunk),
            _ => (start / chunk + 1) * chunk,
        };
        let first = self
            .engine
            .get_shared_described(
                store_key.clone(),
                Some(ByteRange {
                    start: start.min(first_end),
                    end: Some(first_end),
                }),
            )
            .await;
        let SharedRead {
            meta,
            data,
            origin_version: tag,
            attributes,
        } = match first {
            Ok(Some(found)) => found,
            Ok(None) => return Err(no_such_key(bucket, key)),
            Err(error) if error.kind() == hydrant_engine::ErrorKind::InvalidRange => {
                let head = self.engine.head_key(store_key).await;
                return Err(match head {
                    Ok(Some(meta)) => invalid_range(meta.bytes),
                    _ => s3_error!(InvalidRange, "{error}"),
                });
            }
            Err(error) => return Err(engine_error(error)),
        };
        let resolved = resolve(range, meta.bytes)?;
        let (start, end) = match &resolved {
            Some(range) => (range.start, range.end),
            None => (0, meta.bytes),
        };
        let body = if matches!(range, Some(Range::Suffix { .. })) && start != 0 {
            // The first read was the object's first chunk: read from the suffix's start.
            let rest = chunk_stream(self.engine.clone(), store_key, start, end, (meta.seq, tag));
            StreamingBlob::wrap(rest)
        } else {
            let mut data = data;
            data.truncate((end - start) as usize);
            body_of(&self.engine, store_key, &meta, tag, data, start, end)
        };
        Ok(Found {
            meta,
            tag,
            body,
            range: resolved,
            attributes,
        })
    }

    /// GetObject: the answer to `input`, its body read as it is sent. Both doors to GetObject
    /// come here: s3s's operation, and the plain GETs `plain_get` answers itself.
    pub(super) async fn get(&self, input: GetObjectInput) -> S3Result<GetObjectOutput> {
        if input.part_number.is_some_and(|part| part != 1) {
            return Err(s3_error!(
                InvalidArgument,
                "this object is stored whole: its only part is 1"
            ));
        }
        let Found {
            meta,
            tag,
            body,
            range,
            attributes,
        } = self.read(&input.bucket, &input.key, input.range).await?;
        let etag = etag_of(&meta, tag);
        let modified = modified_of(&meta);
        check_read_conditions(
            &etag,
            modified.as_ref(),
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let (length, content_range) = match &range {
            Some(range) => (
                range.end - range.start,
                Some(format!(
                    "bytes {}-{}/{}",
                    range.start,
                    range.end.saturating_sub(1),
                    meta.bytes
                )),
            ),
            None => (meta.bytes, None),
        };
        let mut output = GetObjectOutput {
            body: Some(body),
            content_length: Some(length as i64),
            content_range,
            accept_ranges: Some("bytes".to_string()),
            e_tag: Some(etag),
            last_modified: Some(modified.unwrap_or_else(last_modified)),
            parts_count: input.part_number.map(|_| 1),
            ..Default::default()
        };
        let whole = range.is_none() && input.part_number.is_none();
        answer_checksum!(
            output,
            attributes,
            whole && checksum_asked(input.checksum_mode.as_ref())
        );
        answer!(output, attributes);
        // The response-* parameters override what is kept, for this answer only.
        let overrides = [
            (&mut output.content_type, input.response_content_type),
            (
                &mut output.content_encoding,
                input.response_content_encoding,
            ),
            (
                &mut output.content_disposition,
                input.response_content_disposition,
            ),
            (
                &mut output.content_language,
                input.response_content_language,
            ),
            (&mut output.cache_control, input.response_cache_control),
        ];
        for (field, given) in overrides {
            if given.is_some() {
                *field = given;
            }
        }
        if input.response_expires.is_some() {
            output.expires = input.response_expires;
        }
        Ok(output)
    }
}
