//! Buckets and listings through S3.
//!
//! A bucket is a name, as in the native protocol: every valid name is a bucket of the default
//! origin (or of NVMe only, without one), so CreateBucket is accepted for any valid name and
//! HeadBucket finds it; ListBuckets names the buckets with an origin of their own and the
//! top-level folders of the default origin. DeleteBucket refuses a bucket that holds objects.
//!
//! Listings page through the engine's flat, key-ordered listing; a delimiter folds keys into
//! CommonPrefixes, and a continuation resumes after the last key or prefix answered.

use hydrant_engine::ObjectMeta;
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::errors::s3_error as engine_error;
use super::objects::{etag_of, last_modified, last_modified_of, Gateway};

/// Keys one listing answers at most (S3's limit, and its default).
const LIST_KEYS_MAX: usize = 1000;
/// A character after every other: a listing that resumes after `prefix` + this skips every
/// key under `prefix`.
const AFTER_EVERY_KEY: char = '\u{10FFFF}';

pub(super) async fn list_buckets(
    gateway: &Gateway,
    req: S3Request<ListBucketsInput>,
) -> S3Result<S3Response<ListBucketsOutput>> {
    let mut names = gateway.engine.buckets().await.map_err(engine_error)?;
    if let (Some(credentials), Some(signed)) = (&gateway.credentials, &req.credentials) {
        names.retain(|name| credentials.allows(&signed.access_key, name, false));
    }
    let created = last_modified();
    let buckets = names
        .into_iter()
        .map(|name| Bucket {
            name: Some(name),
            creation_date: Some(created.clone()),
            ..Default::default()
        })
        .collect();
    Ok(S3Response::new(ListBucketsOutput {
        buckets: Some(buckets),
        ..Default::default()
    }))
}

fn check_bucket(bucket: &str) -> S3Result<()> {
    hydrant_proto::name::check_bucket(bucket)
        .map_err(|error| s3_error!(InvalidBucketName, "{error}"))
}

pub(super) async fn head_bucket(
    _gateway: &Gateway,
    req: S3Request<HeadBucketInput>,
) -> S3Result<S3Response<HeadBucketOutput>> {
    check_bucket(&req.input.bucket)?;
    Ok(S3Response::new(HeadBucketOutput::default()))
}

pub(super) async fn create_bucket(
    _gateway: &Gateway,
    req: S3Request<CreateBucketInput>,
) -> S3Result<S3Response<CreateBucketOutput>> {
    check_bucket(&req.input.bucket)?;
    Ok(S3Response::new(CreateBucketOutput {
        location: Some(format!("/{}", req.input.bucket)),
    }))
}

pub(super) async fn delete_bucket(
    gateway: &Gateway,
    req: S3Request<DeleteBucketInput>,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    let bucket = &req.input.bucket;
    check_bucket(bucket)?;
    let found = gateway
        .engine
        .list(bucket, "", None, 1)
        .await
        .map_err(engine_error)?;
    if !found.is_empty() {
        return Err(s3_error!(
            BucketNotEmpty,
            "{bucket} holds objects (here or at its origin)"
        ));
    }
    Ok(S3Response::with_status(
        DeleteBucketOutput::default(),
        hyper::StatusCode::NO_CONTENT,
    ))
}

/// One page of a listing.
struct Page {
    objects: Vec<ObjectMeta>,
    prefixes: Vec<String>,
    /// Where the next page starts (after this key), when there is one.
    next: Option<String>,
}

/// Up to `max_keys` keys and common prefixes of `bucket` under `prefix`, after `after`.
async fn list_page(
    gateway: &Gateway,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<String>,
    max_keys: usize,
) -> S3Result<Page> {
    check_bucket(bucket)?;
    let delimiter = delimiter.filter(|delimiter| !delimiter.is_empty());
    let mut page = Page {
        objects: Vec::new(),
        prefixes: Vec::new(),
        next: None,
    };
    let mut after = after;
    if max_keys == 0 {
        return Ok(page);
    }
    loop {
        let want = max_keys + 1 - page.objects.len() - page.prefixes.len();
        let found = gateway
            .engine
            .list(bucket, prefix, after.as_deref(), want)
            .await
            .map_err(engine_error)?;
        let exhausted = found.len() < want;
        let mut skipping: Option<String> = None;
        for meta in found {
            if skipping
                .as_deref()
                .is_some_and(|folded| meta.key.starts_with(folded))
            {
                continue;
            }
            let folded = delimiter.and_then(|delimiter| {
                let rest = &meta.key[prefix.len()..];
                rest.find(delimiter)
                    .map(|at| format!("{prefix}{}", &rest[..at + delimiter.len()]))
            });
            if page.objects.len() + page.prefixes.len() == max_keys {
                // One more than asked for: there is a next page.
                page.next = after;
                return Ok(page);
            }
            match folded {
                Some(folded) => {
                    after = Some(format!("{folded}{AFTER_EVERY_KEY}"));
                    page.prefixes.push(folded.clone());
                    skipping = Some(folded);
                }
                None => {
                    after = Some(meta.key.clone());
                    page.objects.push(meta);
                }
            }
        }
        if exhausted && skipping.is_none() {
            return Ok(page);
        }
        if exhausted {
            // The listing ended inside a folded prefix: nothing is after it.
            return Ok(page);
        }
    }
}

/// A name as the listing answers it: percent-encoded when the client asked for `url` encoding
/// (boto3 always does, and decodes what it gets).
fn encoded(name: String, url: bool) -> String {
    if url {
        urlencoding::encode(&name).into_owned()
    } else {
        name
    }
}

fn wants_url(encoding: &Option<EncodingType>) -> bool {
    encoding
        .as_ref()
        .is_some_and(|encoding| encoding.as_str() == EncodingType::URL)
}

fn object_of(meta: ObjectMeta, url: bool) -> Object {
    let modified = last_modified_of(&meta);
    Object {
        // Every entry has one (SDKs require it); an object listed from the origin whose
        // origin gave no MD5 tag has no version here, and its ETag says so.
        e_tag: Some(etag_of(&meta, 0)),
        key: Some(encoded(meta.key, url)),
        size: Some(meta.bytes as i64),
        last_modified: Some(modified),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        ..Default::default()
    }
}

fn max_keys_of(max_keys: Option<i32>) -> usize {
    max_keys.map_or(LIST_KEYS_MAX, |keys| {
        keys.clamp(0, LIST_KEYS_MAX as i32) as usize
    })
}

pub(super) async fn list_objects_v2(
    gateway: &Gateway,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let input = req.input;
    let url = wants_url(&input.encoding_type);
    let prefix = input.prefix.clone().unwrap_or_default();
    let max_keys = max_keys_of(input.max_keys);
    let after = input
        .continuation_token
        .clone()
        .or_else(|| input.start_after.clone());
    let page = list_page(
        gateway,
        &input.bucket,
        &prefix,
        input.delimiter.as_deref(),
        after,
        max_keys,
    )
    .await?;
    let key_count = (page.objects.len() + page.prefixes.len()) as i32;
    let output = ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(encoded(prefix, url)),
        max_keys: Some(max_keys as i32),
        key_count: Some(key_count),
        continuation_token: input.continuation_token,
        is_truncated: Some(page.next.is_some()),
        next_continuation_token: page.next,
        contents: Some(
            page.objects
                .into_iter()
                .map(|meta| object_of(meta, url))
                .collect(),
        ),
        common_prefixes: Some(
            page.prefixes
                .into_iter()
                .map(|prefix| CommonPrefix {
                    prefix: Some(encoded(prefix, url)),
                })
                .collect(),
        ),
        delimiter: input.delimiter,
        encoding_type: input.encoding_type,
        start_after: input.start_after,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(super) async fn list_objects(
    gateway: &Gateway,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let input = req.input;
    let url = wants_url(&input.encoding_type);
    let prefix = input.prefix.clone().unwrap_or_default();
    let max_keys = max_keys_of(input.max_keys);
    let page = list_page(
        gateway,
        &input.bucket,
        &prefix,
        input.delimiter.as_deref(),
        input.marker.clone(),
        max_keys,
    )
    .await?;
    let output = ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(encoded(prefix, url)),
        marker: input.marker,
        max_keys: Some(max_keys as i32),
        is_truncated: Some(page.next.is_some()),
        next_marker: page.next.map(|next| encoded(next, url)),
        contents: Some(
            page.objects
                .into_iter()
                .map(|meta| object_of(meta, url))
                .collect(),
        ),
        common_prefixes: Some(
            page.prefixes
                .into_iter()
                .map(|prefix| CommonPrefix {
                    prefix: Some(encoded(prefix, url)),
                })
                .collect(),
        ),
        delimiter: input.delimiter,
        encoding_type: input.encoding_type,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}
