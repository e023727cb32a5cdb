//! Plain GETs, answered without s3s's generic operation machinery.
//!
//! A data loader's requests are almost all GetObject of a whole object or one range, by an
//! anonymous client on loopback. For those, s3s's routing (the query string parsed into an
//! operation, every header into a typed input, an access check and a typed output serialized
//! header by header) costs more CPU than the read itself. A request that is such a GET, and
//! nothing more, is answered here: the same `Gateway::get` s3s's GetObject calls, with its
//! answer written as s3s writes GetObject's. Anything else (a query string, a signature,
//! conditions, a header this path does not know, a name with escapes, an endpoint with keys)
//! goes to s3s, as does an answer this path cannot write exactly (metadata that needs RFC 2047
//! encoding), which s3s then reads again. The test `plain_gets_answer_as_s3s_does` holds the
//! two doors to the same answers.

use std::net::SocketAddr;

use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, StatusCode};
use s3s::dto::{ChecksumMode, GetObjectInput, GetObjectOutput, Range, Timestamp, TimestampFormat};
use s3s::path::S3Path;

use super::objects::Gateway;
use super::S3_COUNTERS;

/// The `x-amz-` headers a plain GET may carry: what SDKs send with every request, and which
/// GetObject (without keys, and as this gateway answers it) does not act on. (It acts on
/// `x-amz-checksum-mode`, which this path takes too.)
const IGNORED_AMZ_HEADERS: &[&str] = &["x-amz-date", "x-amz-user-agent", "x-amz-security-token"];

/// `x-amz-content-sha256` values of a GET without a body: the empty body's hash, or none.
const EMPTY_PAYLOAD_HASHES: &[&str] = &[
    "UNSIGNED-PAYLOAD",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
];

/// The GetObject `request` asks for, when it is a plain GET this path answers: on an endpoint
/// without keys (`open`), from loopback, by path, with no query string, no body, no signature
/// left (`prepare` takes a loopback request's off), and no header that GetObject acts on but
/// `Range` and `x-amz-checksum-mode`.
pub(super) fn plain_get_of<B>(
    request: &hyper::Request<B>,
    open: bool,
    peer: SocketAddr,
) -> Option<GetObjectInput> {
    if !open || !peer.ip().is_loopback() || request.method() != Method::GET {
        return None;
    }
    let uri = request.uri();
    // s3s percent-decodes the path: names with escapes take its way.
    if uri.query().is_some() || uri.path().contains('%') {
        return None;
    }
    let mut range = None;
    let mut checksum_mode = None;
    for (name, value) in request.headers() {
        let name = name.as_str();
        if name == header::RANGE {
            if range.is_some() {
                return None;
            }
            range = Some(Range::parse(value.to_str().ok()?).ok()?);
        } else if name == header::CONTENT_LENGTH {
            if value.as_bytes() != b"0" {
                return None;
            }
        } else if name == header::HOST {
            value.to_str().ok()?;
        } else if name == "x-amz-checksum-mode" {
            if checksum_mode.is_some() {
                return None;
            }
            checksum_mode = Some(ChecksumMode::from(value.to_str().ok()?.to_string()));
        } else if name == "x-amz-content-sha256" {
            if !EMPTY_PAYLOAD_HASHES.contains(&value.to_str().ok()?) {
                return None;
            }
        } else if name.starts_with("x-amz-") {
            if !IGNORED_AMZ_HEADERS.contains(&name) {
                return None;
            }
        } else if name.starts_with("if-")
            || name == header::AUTHORIZATION
            || name == header::TRANSFER_ENCODING
            || name == header::EXPECT
            || name == "content-md5"
        {
            return None;
        }
    }
    let S3Path::Object { bucket, key } = s3s::path::parse_path_style(uri.path()).ok()? else {
        return None;
    };
    Some(GetObjectInput {
        bucket: bucket.into(),
        key: key.into(),
        range,
        checksum_mode,
        ..Default::default()
    })
}

/// The answer to a plain GET: `Gateway::get`'s, or its error as s3s writes errors; `None` when
/// the answer has something this path does not write, for s3s to answer instead.
pub(super) async fn answer(gateway: &Gateway, input: GetObjectInput) -> Option<s3s::HttpResponse> {
    let answer = match gateway.get(input).await {
        Ok(output) => written(output),
        Err(error) => error.to_http_response().ok(),
    };
    if answer.is_some() {
        S3_COUNTERS.count("GetObject");
        S3_COUNTERS
            .plain_gets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    answer
}

/// `output` as s3s writes a GetObject answer (the fields `Gateway::get` sets for a plain GET).
fn written(output: GetObjectOutput) -> Option<s3s::HttpResponse> {
    let GetObjectOutput {
        body,
        accept_ranges,
        cache_control,
        content_disposition,
        content_encoding,
        content_language,
        content_length,
        content_range,
        content_type,
        e_tag,
        expires,
        last_modified,
        metadata,
        parts_count,
        checksum_crc32,
        checksum_crc32c,
        checksum_crc64nvme,
        checksum_sha1,
        checksum_sha256,
        checksum_type,
        ..
    } = output;
    if parts_count.is_some() {
        return None;
    }
    let mut answer = hyper::Response::new(body.map(s3s::Body::from).unwrap_or_default());
    if content_range.is_some() {
        *answer.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    let headers = answer.headers_mut();
    let text_headers = [
        (header::ACCEPT_RANGES, accept_ranges),
        (header::CACHE_CONTROL, cache_control),
        (header::CONTENT_DISPOSITION, content_disposition),
        (header::CONTENT_ENCODING, content_encoding),
        (header::CONTENT_LANGUAGE, content_language),
    ];
    for (name, value) in text_headers {
        if let Some(value) = value {
            headers.insert(name, HeaderValue::try_from(value).ok()?);
        }
    }
    if let Some(length) = content_length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    for (name, value) in [
        (header::CONTENT_RANGE, content_range),
        (header::CONTENT_TYPE, content_type),
        (
            HeaderName::from_static("x-amz-checksum-crc32"),
            checksum_crc32,
        ),
        (
            HeaderName::from_static("x-amz-checksum-crc32c"),
            checksum_crc32c,
        ),
        (
            HeaderName::from_static("x-amz-checksum-crc64nvme"),
            checksum_crc64nvme,
        ),
        (
            HeaderName::from_static("x-amz-checksum-sha1"),
            checksum_sha1,
        ),
        (
            HeaderName::from_static("x-amz-checksum-sha256"),
            checksum_sha256,
        ),
        (
            HeaderName::from_static("x-amz-checksum-type"),
            checksum_type.map(|kind| kind.as_str().to_string()),
        ),
    ] {
        if let Some(value) = value {
            headers.insert(name, HeaderValue::try_from(value).ok()?);
        }
    }
    if let Some(etag) = e_tag {
        headers.insert(header::ETAG, etag.to_http_header().ok()?);
    }
    for (name, time) in [
        (header::EXPIRES, expires),
        (header::LAST_MODIFIED, last_modified),
    ] {
        if let Some(time) = time {
            headers.insert(name, http_date(&time)?);
        }
    }
    for (name, value) in metadata.into_iter().flatten() {
        // s3s writes other values in RFC 2047's encoding: those answers are its to write.
        if !value.bytes().all(|byte| (0x20..0x7f).contains(&byte)) {
            return None;
        }
        let name = HeaderName::try_from(format!("x-amz-meta-{name}")).ok()?;
        headers.insert(name, HeaderValue::try_from(value).ok()?);
    }
    Some(answer)
}

fn http_date(time: &Timestamp) -> Option<HeaderValue> {
    let mut text = Vec::with_capacity(32);
    time.format(TimestampFormat::HttpDate, &mut text).ok()?;
    HeaderValue::from_bytes(&text).ok()
}
