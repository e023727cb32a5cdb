//! An object's attributes as S3 speaks of them: the headers S3 keeps with an object
//! (Content-Type, Content-Encoding, Content-Disposition, Content-Language, Cache-Control,
//! Expires) and user metadata (`x-amz-meta-*`), taken from a PUT, a CreateMultipartUpload or a
//! copy that replaces them, and answered by GET and HEAD; and the whole object's checksum a PUT
//! sent (verified before the version is installed), answered to a GET or HEAD of the whole
//! object that asks for it (`x-amz-checksum-mode: ENABLED`). The engine keeps them with the
//! version (see `hydrant_engine::Attributes`).

use hydrant_engine::Attributes;
use s3s::dto::{Checksum, ChecksumMode, ChecksumType, Metadata, Timestamp, TimestampFormat};
use s3s::{s3_error, S3Result};

/// The attributes named by a request's fields (every request that gives them has fields of
/// these names): `given!(input)`.
macro_rules! given {
    ($input:expr) => {
        $crate::s3::attributes::Given {
            content_type: $input.content_type.as_deref(),
            content_encoding: $input.content_encoding.as_deref(),
            content_disposition: $input.content_disposition.as_deref(),
            content_language: $input.content_language.as_deref(),
            cache_control: $input.cache_control.as_deref(),
            expires: $input.expires.as_ref(),
            metadata: $input.metadata.as_ref(),
        }
        .attributes()
    };
}
pub(super) use given;

/// The Content-Type S3 answers for an object stored without one.
pub(crate) const CONTENT_TYPE_DEFAULT: &str = "binary/octet-stream";

/// Set a GET's or HEAD's answer fields from `attributes`: `answer!(output, attributes)`.
macro_rules! answer {
    ($output:expr, $attributes:expr) => {{
        let attributes: hydrant_engine::Attributes = $attributes;
        $output.expires = $crate::s3::attributes::expires_of(&attributes);
        $output.metadata = $crate::s3::attributes::metadata_of(&attributes);
        $output.content_type = Some(
            attributes
                .content_type
                .unwrap_or_else(|| $crate::s3::attributes::CONTENT_TYPE_DEFAULT.to_string()),
        );
        $output.content_encoding = attributes.content_encoding;
        $output.content_disposition = attributes.content_disposition;
        $output.content_language = attributes.content_language;
        $output.cache_control = attributes.cache_control;
    }};
}
pub(super) use answer;

/// Set a GET's or HEAD's checksum fields from `attributes` when `asked` (the request's
/// `x-amz-checksum-mode: ENABLED`, for the whole object): `answer_checksum!(output, attributes,
/// asked)`. Before `answer!`, which takes the attributes.
macro_rules! answer_checksum {
    ($output:expr, $attributes:expr, $asked:expr) => {{
        if $asked {
            if let Some((algorithm, value)) = &$attributes.checksum {
                let field = match algorithm.as_str() {
                    "CRC32" => Some(&mut $output.checksum_crc32),
                    "CRC32C" => Some(&mut $output.checksum_crc32c),
                    "CRC64NVME" => Some(&mut $output.checksum_crc64nvme),
                    "SHA1" => Some(&mut $output.checksum_sha1),
                    "SHA256" => Some(&mut $output.checksum_sha256),
                    _ => None,
                };
                if let Some(field) = field {
                    *field = Some(value.clone());
                    $output.checksum_type = Some($crate::s3::attributes::checksum_type_of(value));
                }
            }
        }
    }};
}
pub(super) use answer_checksum;

/// The kind of a kept checksum: of an assembled upload's parts' checksums when it ends in `-`
/// and their count, else of the whole object's bytes.
pub(crate) fn checksum_type_of(value: &str) -> ChecksumType {
    if value.contains('-') {
        ChecksumType::from_static(ChecksumType::COMPOSITE)
    } else {
        ChecksumType::from_static(ChecksumType::FULL_OBJECT)
    }
}

/// Whether a GET or HEAD asks for the object's checksum.
pub(crate) fn checksum_asked(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|mode| mode.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// The whole object's checksum among `sums` (S3 takes one per PUT; the first given).
pub(crate) fn checksum_among(sums: &Checksum) -> Option<(String, String)> {
    [
        ("CRC32", &sums.checksum_crc32),
        ("CRC32C", &sums.checksum_crc32c),
        ("CRC64NVME", &sums.checksum_crc64nvme),
        ("SHA1", &sums.checksum_sha1),
        ("SHA256", &sums.checksum_sha256),
    ]
    .into_iter()
    .find_map(|(algorithm, value)| Some((algorithm.to_string(), value.clone()?)))
}

/// `attributes` with `checksum` where they fit together (`fits`: the room the version's first
/// chunk header has beside its key): the headers and metadata the writer gave come first, and an
/// object whose attributes fill the room is kept without its checksum.
pub(crate) fn with_checksum(
    attributes: Attributes,
    checksum: Option<(String, String)>,
    fits: impl Fn(&Attributes) -> bool,
) -> Attributes {
    let kept = Attributes {
        checksum,
        ..attributes.clone()
    };
    if kept.checksum.is_none() || fits(&kept) {
        kept
    } else {
        Attributes {
            checksum: None,
            ..attributes
        }
    }
}

pub(crate) struct Given<'a> {
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub content_disposition: Option<&'a str>,
    pub content_language: Option<&'a str>,
    pub cache_control: Option<&'a str>,
    pub expires: Option<&'a Timestamp>,
    pub metadata: Option<&'a Metadata>,
}

impl Given<'_> {
    /// The attributes to keep; MetadataTooLarge beyond what the engine keeps (user metadata
    /// over 2 KB, as S3 counts it, or all of them over `ATTRIBUTES_BYTES_MAX`).
    pub(crate) fn attributes(&self) -> S3Result<Attributes> {
        let owned = |value: Option<&str>| value.map(str::to_string);
        let mut metadata: Vec<(String, String)> = self
            .metadata
            .into_iter()
            .flatten()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
            .collect();
        metadata.sort();
        let attributes = Attributes {
            content_type: owned(self.content_type),
            content_encoding: stored_encoding(self.content_encoding),
            content_disposition: owned(self.content_disposition),
            content_language: owned(self.content_language),
            cache_control: owned(self.cache_control),
            expires: self.expires.map(http_date),
            metadata,
            checksum: None,
        };
        attributes
            .encode()
            .map_err(|error| s3_error!(MetadataTooLarge, "{error}"))?;
        Ok(attributes)
    }
}

/// The Content-Encoding S3 keeps: the one sent, without `aws-chunked` (which says how this
/// request's body was framed, not what the object is).
fn stored_encoding(sent: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = sent?
        .split(',')
        .map(str::trim)
        .filter(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!kept.is_empty()).then(|| kept.join(","))
}

fn http_date(timestamp: &Timestamp) -> String {
    let mut text = Vec::new();
    match timestamp.format(TimestampFormat::HttpDate, &mut text) {
        Ok(()) => String::from_utf8(text).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

pub(crate) fn expires_of(attributes: &Attributes) -> Option<Timestamp> {
    let text = attributes.expires.as_deref()?;
    Timestamp::parse(TimestampFormat::HttpDate, text).ok()
}

pub(crate) fn metadata_of(attributes: &Attributes) -> Option<Metadata> {
    (!attributes.metadata.is_empty()).then(|| attributes.metadata.iter().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_chunked_is_not_kept_as_the_objects_encoding() {
        assert_eq!(stored_encoding(Some("aws-chunked")), None);
        assert_eq!(
            stored_encoding(Some("aws-chunked, gzip")),
            Some("gzip".into())
        );
        assert_eq!(stored_encoding(Some("gzip")), Some("gzip".into()));
        assert_eq!(stored_encoding(None), None);
    }

    #[test]
    fn metadata_names_are_lowercase_and_sorted_and_too_much_is_refused() {
        let metadata: Metadata = [("Zeta", "1"), ("alpha", "2")]
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let given = Given {
            content_type: Some("text/csv"),
            content_encoding: None,
            content_disposition: None,
            content_language: None,
            cache_control: None,
            expires: None,
            metadata: Some(&metadata),
        };
        let attributes = given.attributes().unwrap();
        assert_eq!(
            attributes.metadata,
            [("alpha".into(), "2".into()), ("zeta".into(), "1".into())]
        );
        let big: Metadata = [("k".to_string(), "v".repeat(2048))].into_iter().collect();
        let error = Given {
            metadata: Some(&big),
            ..given
        }
        .attributes()
        .unwrap_err();
        assert_eq!(*error.code(), s3s::S3ErrorCode::MetadataTooLarge);
    }

    #[test]
    fn a_checksum_is_kept_where_it_fits() {
        let sums = Checksum {
            checksum_sha256: Some("x".repeat(44)),
            ..Default::default()
        };
        let fits = |attributes: &Attributes| attributes.encode().is_ok();
        let kept = with_checksum(Attributes::default(), checksum_among(&sums), fits);
        assert_eq!(kept.checksum, Some(("SHA256".into(), "x".repeat(44))));
        assert_eq!(checksum_among(&Checksum::default()), None);
        // Headers that fill the room: kept as they are, without the checksum.
        let full = Attributes {
            content_type: Some("t".repeat(hydrant_engine::ATTRIBUTES_BYTES_MAX - 4)),
            ..Default::default()
        };
        assert!(full.encode().is_ok());
        assert_eq!(
            with_checksum(full.clone(), checksum_among(&sums), fits),
            full
        );
        // One of another version goes too.
        let other = Attributes {
            checksum: Some(("CRC32".into(), "AAAAAA==".into())),
            ..full.clone()
        };
        assert_eq!(with_checksum(other, checksum_among(&sums), fits), full);
    }
}
