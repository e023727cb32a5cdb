//! PUTs to an S3 origin that carry the writer's checksum. `object_store` signs only the headers
//! it sets itself, and S3 refuses a request with an `x-amz-*` header its signature does not
//! cover, so these go as a URL presigned with the checksum and the object's headers bound to
//! it, sent by our own HTTP client. The origin verifies the checksum against the bytes before
//! it keeps them (BadDigest otherwise), and keeps it with the object, as a PUT straight from
//! the writer would have.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::signer::{HeaderMap, HeaderName, HeaderValue, Method, SignedUrlOptions, Signer};

use super::errors::refused_status;
use crate::origin::{Origins, Route};
use crate::{Error, ErrorKind, Result};

/// How long a presigned PUT is valid: it is sent at once, so this only has to cover a clock
/// a little behind the origin's and a slow send of the largest single PUT.
const PRESIGNED_VALIDITY: Duration = Duration::from_secs(15 * 60);

/// Bytes of an origin's error answer read at most (S3's error documents are well under 1 KiB).
const ERROR_BODY_BYTES_MAX: usize = 16 << 10;

/// The way to send an S3 origin signed PUTs of our own.
pub(crate) struct SignedPuts {
    signer: Arc<AmazonS3>,
    http: reqwest::Client,
}

impl SignedPuts {
    /// For the store `signer`, whose requests give up after `timeout`.
    pub(super) fn new(signer: Arc<AmazonS3>, timeout: Duration) -> Result<SignedPuts> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|error| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    format!("cannot make an HTTP client for the origin: {error}"),
                )
            })?;
        Ok(SignedPuts { signer, http })
    }
}

/// The headers that say `checksum` (S3's algorithm name and its base64 value) in a PUT, or
/// `None` for a checksum a PUT cannot carry (a composite one, of an upload's parts, or one not
/// yet known).
pub(crate) fn checksum_headers(checksum: &(String, String)) -> Option<Vec<(String, String)>> {
    let (algorithm, value) = checksum;
    if value.is_empty() || value.contains('-') {
        return None;
    }
    Some(vec![
        (
            format!("x-amz-checksum-{}", algorithm.to_ascii_lowercase()),
            value.clone(),
        ),
        ("x-amz-sdk-checksum-algorithm".into(), algorithm.clone()),
    ])
}

/// The headers S3 takes `attributes` in.
fn attribute_headers(attributes: &object_store::Attributes) -> Vec<(String, String)> {
    use object_store::Attribute;
    attributes
        .iter()
        .filter_map(|(attribute, value)| {
            let name = match attribute {
                Attribute::ContentType => "content-type".to_string(),
                Attribute::ContentEncoding => "content-encoding".into(),
                Attribute::ContentDisposition => "content-disposition".into(),
                Attribute::ContentLanguage => "content-language".into(),
                Attribute::CacheControl => "cache-control".into(),
                Attribute::StorageClass => "x-amz-storage-class".into(),
                Attribute::Metadata(name) => format!("x-amz-meta-{name}"),
                _ => return None,
            };
            Some((name, value.as_ref().to_string()))
        })
        .collect()
}

/// PUT `data` at `path` with `checksum` (see `checksum_headers`) and `attributes`, every header
/// bound to the signature; the origin's ETag when it gives one.
pub(super) async fn put(
    origins: &Origins,
    route: &Route,
    signed: &SignedPuts,
    path: &Path,
    data: Bytes,
    checksum: Vec<(String, String)>,
    attributes: &object_store::Attributes,
) -> Result<Option<String>> {
    let refused = |what: String| {
        origins.counters.errors.fetch_add(1, Ordering::Relaxed);
        Error::new(
            ErrorKind::OriginRefused,
            format!("origin {} refused to store {path}: {what}", route.url),
        )
    };
    let mut headers = HeaderMap::new();
    for (name, value) in checksum.into_iter().chain(attribute_headers(attributes)) {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| refused(format!("{name:?} cannot be an HTTP header's name")))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|_| refused(format!("{value:?} cannot be the value of {name}")))?;
        headers.insert(name, value);
    }
    let mut options = SignedUrlOptions::default();
    for (name, value) in &headers {
        options = options.with_signed_header(name.clone(), value.clone());
    }
    let url = signed
        .signer
        .signed_url_opts(Method::PUT, path, PRESIGNED_VALIDITY, &options)
        .await
        .map_err(|error| {
            origins.counters.errors.fetch_add(1, Ordering::Relaxed);
            Error::new(
                ErrorKind::OriginUnavailable,
                format!("cannot sign a PUT to origin {}: {error}", route.url),
            )
        })?;
    let bytes = data.len() as u64;
    let failed = |what: String| {
        origins.counters.errors.fetch_add(1, Ordering::Relaxed);
        Error::new(
            ErrorKind::OriginUnavailable,
            format!("origin {} failed to store {path}: {what}", route.url),
        )
    };
    let mut response = signed
        .http
        .put(url)
        .headers(headers)
        .body(data)
        .send()
        .await
        .map_err(|error| failed(error.to_string()))?;
    let status = response.status();
    if status.is_success() {
        origins
            .counters
            .bytes_out
            .fetch_add(bytes, Ordering::Relaxed);
        let etag = response
            .headers()
            .get("etag")
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        return Ok(etag);
    }
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(piece)) => body.extend_from_slice(&piece),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES_MAX);
    let message = format!(
        "status code: {}, {}",
        status.as_u16(),
        String::from_utf8_lossy(&body).trim()
    );
    if message.contains("SlowDown") || status.as_u16() == 503 {
        origins.counters.slow_downs.fetch_add(1, Ordering::Relaxed);
    }
    // A PUT's NotFound is NoSuchBucket, which no retry changes.
    if status.as_u16() == 404 || refused_status(status.as_u16(), &message) {
        return Err(refused(message));
    }
    Err(failed(message))
}
