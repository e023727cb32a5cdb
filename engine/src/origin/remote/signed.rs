//! PUTs to an S3 origin that carry the writer's checksum. `object_store` signs only the headers
//! it sets itself, and S3 refuses a request with an `x-amz-*` header its signature does not
//! cover, so these go as a URL presigned with the checksum and the object's headers bound to
//! it, sent through the store's own HTTP client (its proxy, certificates and time limits). The
//! origin verifies the checksum against the bytes before it keeps them (BadDigest otherwise),
//! and keeps it with the object, as a PUT straight from the writer would have.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};
use object_store::path::Path;
use object_store::signer::{HeaderMap, HeaderName, HeaderValue, Method, SignedUrlOptions, Signer};
use object_store::{ClientOptions, RetryConfig};

use super::errors::refused_status;
use crate::origin::{Origins, Route};
use crate::{Error, ErrorKind};

/// How long a presigned PUT is valid: it is sent at once, so this only has to cover a clock
/// a little behind the origin's and a slow send of the largest single PUT.
const PRESIGNED_VALIDITY: Duration = Duration::from_secs(15 * 60);

/// Bytes of an origin's error answer read at most (S3's error documents are well under 1 KiB).
const ERROR_BODY_BYTES_MAX: usize = 16 << 10;

/// Whether PUTs to the store `builder` configures may go presigned: not where it adds headers
/// of its own to each request that a presigned URL would leave out (server-side encryption
/// with a KMS key or a customer's key), signs no requests, or signs with session credentials
/// of its own (S3 Express). Those origins are sent PUTs without the writer's checksum.
pub(super) fn may_sign(builder: &AmazonS3Builder) -> bool {
    let set = |key: AmazonS3ConfigKey| {
        builder
            .get_config_value(&key)
            .is_some_and(|value| !value.is_empty())
    };
    let on = |key: AmazonS3ConfigKey| {
        builder
            .get_config_value(&key)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"))
    };
    // By name: object_store does not export the encryption keys' type.
    let encryption = [
        "aws_server_side_encryption",
        "aws_sse_kms_key_id",
        "aws_sse_bucket_key_enabled",
        "aws_sse_customer_key_base64",
    ]
    .into_iter()
    .filter_map(|name| name.parse::<AmazonS3ConfigKey>().ok());
    !encryption.into_iter().any(set)
        && !on(AmazonS3ConfigKey::SkipSignature)
        && !on(AmazonS3ConfigKey::S3Express)
}

/// object_store's own HTTP connector, keeping the client it makes last (a store's client for
/// its requests, after those of its credential providers), so that our PUTs go through the
/// same proxy, certificates, time limits and connection pool as the store's.
#[derive(Clone, Debug, Default)]
pub(super) struct Connector {
    made: Arc<Mutex<Option<HttpClient>>>,
}

impl Connector {
    /// The store's client, once the store is built.
    pub(super) fn client(&self) -> Option<HttpClient> {
        self.made.lock().expect("connector lock").clone()
    }
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = ReqwestConnector::default().connect(options)?;
        *self.made.lock().expect("connector lock") = Some(client.clone());
        Ok(client)
    }
}

/// The way to send an S3 origin signed PUTs of our own.
pub(crate) struct SignedPuts {
    signer: Arc<AmazonS3>,
    http: HttpClient,
    /// Attempts and the waits between them, as the store's own requests have them.
    retry: RetryConfig,
}

impl SignedPuts {
    /// For the store `signer`, whose client is `http`.
    pub(super) fn new(signer: Arc<AmazonS3>, http: HttpClient, retry: RetryConfig) -> SignedPuts {
        SignedPuts {
            signer,
            http,
            retry,
        }
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

/// How a signed PUT ended, when it did not store the object.
pub(super) enum Declined {
    /// The origin does not take checksums (an S3-compatible store that answers them with
    /// NotImplemented or a 400 other than BadDigest): send it without.
    Unsupported(String),
    Failed(Error),
}

/// PUT `data` at `path` with `checksum` (see `checksum_headers`) and `attributes`, every header
/// bound to the signature; the origin's ETag when it gives one. Transient failures (a broken
/// connection, 5xx, SlowDown) are tried again as the store's own requests are.
pub(super) async fn put(
    origins: &Origins,
    route: &Route,
    signed: &SignedPuts,
    path: &Path,
    data: Bytes,
    checksum: Vec<(String, String)>,
    attributes: &object_store::Attributes,
) -> std::result::Result<Option<String>, Declined> {
    let refused = |what: String| {
        origins.counters.errors.fetch_add(1, Ordering::Relaxed);
        Declined::Failed(Error::new(
            ErrorKind::OriginRefused,
            format!("origin {} refused to store {path}: {what}", route.url),
        ))
    };
    let mut headers = HeaderMap::new();
    for (name, value) in checksum.into_iter().chain(attribute_headers(attributes)) {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| refused(format!("{name:?} cannot be an HTTP header's name")))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|_| refused(format!("{value:?} cannot be the value of {name}")))?;
        headers.append(name, value);
    }
    let mut options = SignedUrlOptions::default();
    for (name, value) in &headers {
        options = options.with_signed_header(name.clone(), value.clone());
    }
    let bytes = data.len() as u64;
    let mut wait = signed.retry.backoff.init_backoff;
    let mut attempt = 0;
    loop {
        let failure = match attempt_put(signed, path, &data, &headers, &options).await {
            Ok(etag) => {
                origins
                    .counters
                    .bytes_out
                    .fetch_add(bytes, Ordering::Relaxed);
                return Ok(etag);
            }
            Err(failure) => failure,
        };
        let transient = match &failure {
            Attempt::Unsigned(_) | Attempt::Unsent(_) => true,
            Attempt::Answered(status, message) => {
                if message.contains("SlowDown") || *status == 503 {
                    origins.counters.slow_downs.fetch_add(1, Ordering::Relaxed);
                }
                let bad_digest = message.contains("BadDigest");
                if *status == 501 || (*status == 400 && !bad_digest && !refused_name(message)) {
                    return Err(Declined::Unsupported(message.clone()));
                }
                // A PUT's NotFound is NoSuchBucket, which no retry changes.
                !(*status == 404 || refused_status(*status, message))
            }
        };
        attempt += 1;
        if transient && attempt <= signed.retry.max_retries {
            tokio::time::sleep(wait).await;
            wait = wait
                .mul_f64(signed.retry.backoff.base)
                .min(signed.retry.backoff.max_backoff);
            continue;
        }
        let message = failure.to_string();
        if transient {
            origins.counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Declined::Failed(Error::new(
                ErrorKind::OriginUnavailable,
                format!("origin {} failed to store {path}: {message}", route.url),
            )));
        }
        return Err(refused(message));
    }
}

/// Whether a 400's error names a name or size the origin refuses, which a PUT without the
/// checksum would be refused for too.
fn refused_name(message: &str) -> bool {
    [
        "KeyTooLong",
        "InvalidBucketName",
        "EntityTooLarge",
        "MetadataTooLarge",
    ]
    .iter()
    .any(|code| message.contains(code))
}

/// Why one attempt did not store the object.
enum Attempt {
    Unsigned(String),
    Unsent(String),
    /// The origin's status and (the start of) its error document.
    Answered(u16, String),
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attempt::Unsigned(error) => write!(f, "cannot sign the PUT: {error}"),
            Attempt::Unsent(error) => write!(f, "{error}"),
            Attempt::Answered(status, message) => write!(f, "status code: {status}, {message}"),
        }
    }
}

/// One PUT, signed anew.
async fn attempt_put(
    signed: &SignedPuts,
    path: &Path,
    data: &Bytes,
    headers: &HeaderMap,
    options: &SignedUrlOptions,
) -> std::result::Result<Option<String>, Attempt> {
    let url = signed
        .signer
        .signed_url_opts(Method::PUT, path, PRESIGNED_VALIDITY, options)
        .await
        .map_err(|error| Attempt::Unsigned(error.to_string()))?;
    let mut request = HttpRequest::new(data.clone().into());
    *request.method_mut() = Method::PUT;
    *request.uri_mut() = url
        .as_str()
        .parse()
        .map_err(|error| Attempt::Unsigned(format!("{error}")))?;
    *request.headers_mut() = headers.clone();
    request
        .headers_mut()
        .insert("content-length", HeaderValue::from(data.len()));
    let response = signed
        .http
        .execute(request)
        .await
        .map_err(|error| Attempt::Unsent(error.to_string()))?;
    let status = response.status();
    if status.is_success() {
        let etag = response
            .headers()
            .get("etag")
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        return Ok(etag);
    }
    let mut body = Vec::new();
    let mut pieces = response.into_body().bytes_stream();
    while body.len() < ERROR_BODY_BYTES_MAX {
        use futures::StreamExt;
        match pieces.next().await {
            Some(Ok(piece)) => body.extend_from_slice(&piece),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES_MAX);
    Err(Attempt::Answered(
        status.as_u16(),
        String::from_utf8_lossy(&body).trim().to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_that_add_headers_of_their_own_or_sign_nothing_are_not_sent_presigned_puts() {
        let plain = || AmazonS3Builder::new().with_bucket_name("b");
        assert!(may_sign(&plain()));
        for (name, value) in [
            ("aws_server_side_encryption", "aws:kms"),
            ("aws_sse_kms_key_id", "key"),
            ("aws_sse_bucket_key_enabled", "true"),
            ("aws_sse_customer_key_base64", "AAAA"),
            ("aws_skip_signature", "true"),
            ("aws_s3_express", "true"),
        ] {
            let builder = plain().with_config(name.parse().unwrap(), value);
            assert!(!may_sign(&builder), "{name}");
        }
        let builder = plain().with_config("aws_skip_signature".parse().unwrap(), "false");
        assert!(may_sign(&builder));
    }

    #[test]
    fn a_put_says_a_whole_objects_checksum_and_nothing_else() {
        let headers = checksum_headers(&("CRC32".into(), "AAAAAA==".into())).unwrap();
        assert_eq!(
            headers,
            [
                ("x-amz-checksum-crc32".to_string(), "AAAAAA==".to_string()),
                ("x-amz-sdk-checksum-algorithm".into(), "CRC32".into())
            ]
        );
        assert_eq!(checksum_headers(&("SHA256".into(), "x+/=-3".into())), None);
        assert_eq!(checksum_headers(&("SHA256".into(), String::new())), None);
    }
}
