//! A request's body as it arrives: its pieces (with the idle timeout), the checksums and
//! Content-MD5 its sender gave, compared with what arrived before anything is stored.

use bytes::Bytes;
use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3Result};

/// The checksums a PUT's sender gave (in headers, or promised in a trailer) and the digests
/// computed of the bytes as they arrive; compared before the object is stored.
pub(super) struct BodyCheck {
    /// The MD5 of the body, computed when the sender gave one (Content-MD5) or the caller
    /// needs it (a part's ETag), and the one the sender gave.
    md5: Option<(s3s::crypto::Md5, Option<String>)>,
    hasher: s3s::checksum::ChecksumHasher,
    expected: Checksum,
    /// The trailer header that carries the checksum, when it comes after the body.
    trailer: Option<String>,
    /// The algorithm of a checksum computed of the body to be kept with it (an assembled
    /// upload's FULL_OBJECT checksum), known only once the body has passed.
    computing: Option<String>,
}

impl BodyCheck {
    /// `md5`: compute the body's MD5 even when the sender gave none.
    pub(super) fn new(
        headers: &hyper::HeaderMap,
        content_md5: Option<String>,
        expected: Checksum,
        md5: bool,
    ) -> S3Result<BodyCheck> {
        use s3s::crypto::Checksum as _;
        let trailer: Option<String> = headers
            .get("x-amz-trailer")
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_ascii_lowercase());
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        let wants = |field: &Option<String>, name: &str| {
            field.is_some() || trailer.as_deref() == Some(name)
        };
        if wants(&expected.checksum_crc32, "x-amz-checksum-crc32") {
            hasher.crc32 = Some(Default::default());
        }
        if wants(&expected.checksum_crc32c, "x-amz-checksum-crc32c") {
            hasher.crc32c = Some(Default::default());
        }
        if wants(&expected.checksum_crc64nvme, "x-amz-checksum-crc64nvme") {
            hasher.crc64nvme = Some(Default::default());
        }
        if wants(&expected.checksum_sha1, "x-amz-checksum-sha1") {
            hasher.sha1 = Some(Default::default());
        }
        if wants(&expected.checksum_sha256, "x-amz-checksum-sha256") {
            hasher.sha256 = Some(Default::default());
        }
        if let Some(name) = &trailer {
            let given_too = [
                ("x-amz-checksum-crc32", &expected.checksum_crc32),
                ("x-amz-checksum-crc32c", &expected.checksum_crc32c),
                ("x-amz-checksum-crc64nvme", &expected.checksum_crc64nvme),
                ("x-amz-checksum-sha1", &expected.checksum_sha1),
                ("x-amz-checksum-sha256", &expected.checksum_sha256),
            ]
            .iter()
            .any(|(header, value)| header == name && value.is_some());
            if given_too {
                return Err(s3_error!(
                    InvalidRequest,
                    "{name} is given as a header and promised in a trailer: send it once"
                ));
            }
            let known = [
                "x-amz-checksum-crc32",
                "x-amz-checksum-crc32c",
                "x-amz-checksum-crc64nvme",
                "x-amz-checksum-sha1",
                "x-amz-checksum-sha256",
            ];
            if !known.contains(&name.as_str()) {
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-trailer names {name}, which is not a checksum S3 defines"
                ));
            }
        }
        let md5 = (md5 || content_md5.is_some()).then(|| (s3s::crypto::Md5::new(), content_md5));
        Ok(BodyCheck {
            md5,
            hasher,
            expected,
            trailer,
            computing: None,
        })
    }

    /// The checksums its sender gave in headers (one promised in a trailer is known only at
    /// the body's end, in what `finish` verified).
    pub(super) fn announced(&self) -> &Checksum {
        &self.expected
    }

    /// The algorithm (as S3 names it) of the checksum promised in a trailer or computed to be
    /// kept, if one is: its value is known once the body has passed.
    pub(super) fn promised(&self) -> Option<String> {
        if let Some(algorithm) = &self.computing {
            return Some(algorithm.clone());
        }
        let name = self.trailer.as_deref()?.strip_prefix("x-amz-checksum-")?;
        let algorithm = name.to_ascii_uppercase();
        hydrant_engine::CHECKSUM_ALGORITHMS
            .contains(&algorithm.as_str())
            .then_some(algorithm)
    }

    fn update(&mut self, data: &[u8]) {
        use s3s::crypto::Checksum as _;
        if let Some((md5, _)) = &mut self.md5 {
            md5.update(data);
        }
        self.hasher.update(data);
    }

    /// Compare, once the body (and its trailer) has arrived; the checksums the object was
    /// stored with.
    pub(super) fn finish(mut self, trailers: &Trailers) -> S3Result<Verified> {
        use s3s::crypto::Checksum as _;
        let mut md5_digest = None;
        if let Some((md5, wanted)) = self.md5.take() {
            let digest: [u8; 16] = md5.finalize();
            if let Some(wanted) = wanted {
                if base64_simd::STANDARD.encode_to_string(digest) != wanted {
                    return Err(s3_error!(
                        BadDigest,
                        "the Content-MD5 you sent does not match the body"
                    ));
                }
            }
            md5_digest = Some(digest);
        }
        if let Some(name) = &self.trailer {
            let value = trailers.value(name).ok_or_else(|| {
                s3_error!(
                    IncompleteBody,
                    "the body ended without the trailer {name} it promised"
                )
            })?;
            let slot = match name.as_str() {
                "x-amz-checksum-crc32" => &mut self.expected.checksum_crc32,
                "x-amz-checksum-crc32c" => &mut self.expected.checksum_crc32c,
                "x-amz-checksum-crc64nvme" => &mut self.expected.checksum_crc64nvme,
                "x-amz-checksum-sha1" => &mut self.expected.checksum_sha1,
                _ => &mut self.expected.checksum_sha256,
            };
            *slot = Some(value);
        }
        let got = self.hasher.finalize();
        let pairs = [
            ("CRC32", &self.expected.checksum_crc32, &got.checksum_crc32),
            (
                "CRC32C",
                &self.expected.checksum_crc32c,
                &got.checksum_crc32c,
            ),
            (
                "CRC64NVME",
                &self.expected.checksum_crc64nvme,
                &got.checksum_crc64nvme,
            ),
            ("SHA1", &self.expected.checksum_sha1, &got.checksum_sha1),
            (
                "SHA256",
                &self.expected.checksum_sha256,
                &got.checksum_sha256,
            ),
        ];
        for (algorithm, wanted, computed) in pairs {
            if let Some(wanted) = wanted {
                if Some(wanted) != computed.as_ref() {
                    return Err(s3_error!(
                        BadDigest,
                        "the {algorithm} checksum you sent does not match the body"
                    ));
                }
            }
        }
        Ok(Verified {
            sums: got,
            md5: md5_digest,
        })
    }
}

/// What a body's check found: its checksums, and its MD5 when it was computed.
#[derive(Default)]
pub(super) struct Verified {
    pub sums: Checksum,
    pub md5: Option<[u8; 16]>,
}

/// A body's bytes as they arrive, in pieces of at most `want` bytes (a piece is split when it
/// crosses a chunk's end). A body that sends nothing for `S3_BODY_IDLE_TIMEOUT` ends the
/// request: a stalled sender must not hold its connection, its memory and its share of the
/// dirty budget for ever.
pub(super) struct Pieces<S> {
    stream: S,
    left: Option<Bytes>,
}

impl<S> Pieces<S>
where
    S: futures::Stream<Item = Result<Bytes, s3s::StdError>> + Unpin,
{
    pub(super) fn new(stream: S) -> Pieces<S> {
        Pieces { stream, left: None }
    }

    /// The next piece of the body (`None` at its end), or RequestTimeout or IncompleteBody.
    async fn next_piece(&mut self) -> S3Result<Option<Bytes>> {
        match tokio::time::timeout(super::S3_BODY_IDLE_TIMEOUT, self.stream.next()).await {
            Err(_) => Err(s3_error!(
                RequestTimeout,
                "the body sent nothing for {} s",
                super::S3_BODY_IDLE_TIMEOUT.as_secs()
            )),
            Ok(Some(Ok(piece))) => Ok(Some(piece)),
            Ok(Some(Err(error))) => Err(s3_error!(
                IncompleteBody,
                "the body could not be read: {error}"
            )),
            Ok(None) => Ok(None),
        }
    }
}

impl<S> Pieces<S>
where
    S: futures::Stream<Item = Result<Bytes, s3s::StdError>> + Unpin,
{
    /// Fill `into` up to `want` bytes; fewer only when the body ends.
    pub(super) async fn fill(
        &mut self,
        into: &mut impl Room,
        want: usize,
        check: &mut BodyCheck,
    ) -> S3Result<()> {
        while into.len() < want {
            let mut piece = match self.left.take() {
                Some(piece) => piece,
                None => match self.next_piece().await? {
                    Some(piece) => piece,
                    None => return Ok(()),
                },
            };
            let room = want - into.len();
            if piece.len() > room {
                self.left = Some(piece.split_off(room));
            }
            check.update(&piece);
            into.extend_from_slice(&piece);
        }
        Ok(())
    }

    /// Whether bytes remain beyond those asked for.
    pub(super) async fn has_more(&mut self) -> S3Result<bool> {
        loop {
            if self.left.as_ref().is_some_and(|left| !left.is_empty()) {
                return Ok(true);
            }
            match self.next_piece().await? {
                Some(piece) => self.left = Some(piece),
                None => return Ok(false),
            }
        }
    }
}

/// What `Pieces::fill` appends to: memory of the caller's own, or a streamed chunk's.
pub(super) trait Room {
    fn len(&self) -> usize;
    fn extend_from_slice(&mut self, bytes: &[u8]);
}

impl Room for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes)
    }
}

impl Room for hydrant_engine::buf::ChunkData {
    fn len(&self) -> usize {
        hydrant_engine::buf::ChunkData::len(self)
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        hydrant_engine::buf::ChunkData::extend_from_slice(self, bytes)
    }
}

impl BodyCheck {
    /// This check, computing the body's MD5 too (the ETag of an object stored from it).
    pub(super) fn with_md5(mut self) -> BodyCheck {
        use s3s::crypto::Checksum as _;
        if self.md5.is_none() {
            self.md5 = Some((s3s::crypto::Md5::new(), None));
        }
        self
    }

    /// A check already made, carrying the checksums it verified.
    pub(super) fn empty(sums: Checksum) -> BodyCheck {
        BodyCheck {
            md5: None,
            hasher: Default::default(),
            expected: sums,
            trailer: None,
            computing: None,
        }
    }

    /// A check of a body whose `algorithm` checksum (one S3 defines) is computed as it passes,
    /// to be kept with it, and compared with `expected` where that gives one.
    pub(super) fn computing(algorithm: &str, expected: Checksum) -> BodyCheck {
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        match algorithm {
            "CRC32" => hasher.crc32 = Some(Default::default()),
            "CRC32C" => hasher.crc32c = Some(Default::default()),
            "CRC64NVME" => hasher.crc64nvme = Some(Default::default()),
            "SHA1" => hasher.sha1 = Some(Default::default()),
            _ => hasher.sha256 = Some(Default::default()),
        }
        BodyCheck {
            md5: None,
            hasher,
            expected,
            trailer: None,
            computing: Some(algorithm.to_string()),
        }
    }
}

/// The size a PUT announces: the decoded length of an `aws-chunked` body, else its
/// Content-Length.
pub(super) fn announced_bytes(
    headers: &hyper::HeaderMap,
    content_length: Option<i64>,
) -> S3Result<u64> {
    let decoded = headers
        .get("x-amz-decoded-content-length")
        .and_then(|value| value.to_str().ok())
        .map(|value| value.parse::<u64>());
    match (decoded, content_length) {
        (Some(Ok(bytes)), _) => Ok(bytes),
        (Some(Err(_)), _) => Err(s3_error!(
            InvalidArgument,
            "x-amz-decoded-content-length is not a number"
        )),
        (None, Some(bytes)) if bytes >= 0 => Ok(bytes as u64),
        _ => Err(s3_error!(
            MissingContentLength,
            "a PUT says its length (Content-Length)"
        )),
    }
}

/// Where a body's trailer is read once the body has ended: s3s's (bodies it decoded, of
/// requests signed with a key) or ours (unsigned `aws-chunked` bodies, see `chunked`).
pub(super) enum Trailers {
    None,
    S3s(s3s::TrailingHeaders),
    Decoded(super::chunked::DecodedTrailer),
}

impl Trailers {
    /// The value of trailer header `name`, once the body has ended.
    fn value(&self, name: &str) -> Option<String> {
        let text = |headers: &hyper::HeaderMap| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string)
        };
        match self {
            Trailers::None => None,
            Trailers::S3s(trailers) => trailers.read(text).flatten(),
            Trailers::Decoded(trailer) => trailer
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .as_ref()
                .and_then(text),
        }
    }
}

/// A request's body as a stream of its data (none: an empty one), and where its trailer will
/// be: an unsigned `aws-chunked` body that s3s left encoded is decoded here; a signed one that
/// no key verified is refused (storing it would store its framing).
pub(super) fn request_body(
    headers: &hyper::HeaderMap,
    body: Option<StreamingBlob>,
    trailers: Option<s3s::TrailingHeaders>,
) -> S3Result<(
    futures::stream::BoxStream<'static, Result<Bytes, s3s::StdError>>,
    Trailers,
)> {
    let pieces = body
        .map(|body| body.boxed())
        .unwrap_or_else(|| futures::stream::empty().boxed());
    if let Some(trailers) = trailers {
        return Ok((pieces, Trailers::S3s(trailers)));
    }
    let streaming = headers
        .get("x-amz-content-sha256")
        .and_then(|value| value.to_str().ok())
        .filter(|value| value.starts_with("STREAMING-"));
    match streaming {
        None => Ok((pieces, Trailers::None)),
        Some("STREAMING-UNSIGNED-PAYLOAD-TRAILER") => {
            let (data, trailer) = super::chunked::decode(pieces);
            Ok((data, Trailers::Decoded(trailer)))
        }
        Some(_) => Err(s3_error!(
            NotImplemented,
            "signed aws-chunked bodies are decoded for requests signed with a key of --s3-credentials; send this one unsigned (STREAMING-UNSIGNED-PAYLOAD-TRAILER or a plain body), or sign it with a key"
        )),
    }
}

/// The checksums a request's headers gave.
pub(super) fn checksum_of(
    crc32: &Option<String>,
    crc32c: &Option<String>,
    crc64nvme: &Option<String>,
    sha1: &Option<String>,
    sha256: &Option<String>,
) -> Checksum {
    Checksum {
        checksum_crc32: crc32.clone(),
        checksum_crc32c: crc32c.clone(),
        checksum_crc64nvme: crc64nvme.clone(),
        checksum_sha1: sha1.clone(),
        checksum_sha256: sha256.clone(),
        ..Default::default()
    }
}
