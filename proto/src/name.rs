//! The one grammar of bucket and key names, checked here before anything else sees a name (the
//! engine checks the same rules when it builds a key, and every origin route is built from names
//! that passed them).
//!
//! A cache bucket is one folder or prefix at its origin and a key is a `/`-separated path below
//! it, so a name must not be able to mean anything else on any origin: no `.` or `..` segment
//! (nor one that a URL parser would decode to them, such as `%2e%2e`), no empty segment (a
//! leading, trailing or doubled `/` would alias another key on an object store), no NUL (the
//! engine's separator).
//!
//! - bucket: 1–63 bytes of `a-z 0-9 . - _`, starting and ending with a letter or digit, with no
//!   two dots in a row (S3's bucket rules, plus `_` and names shorter than 3);
//! - key: 1–1024 bytes of UTF-8 without NUL, whose `/`-separated segments are all non-empty and
//!   none is a dot segment;
//! - prefix (LIST, PREFETCH, FLUSH, and LIST's `start_after`): 0–1024 bytes of UTF-8 without NUL
//!   whose complete segments (those followed by `/`) follow the key rules; the last, partial
//!   segment may be anything, since it only filters keys and never names a place.

use std::fmt;

/// Bytes of a bucket name at most.
pub const BUCKET_BYTES_MAX: usize = 63;
/// Bytes of a key (or a prefix) at most.
pub const KEY_BYTES_MAX: usize = 1024;

/// Why a name was refused; the message says which rule it broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameError {
    BucketLength(usize),
    BucketCharacter,
    BucketEdge,
    BucketDoubleDot,
    KeyEmpty,
    KeyLength(usize),
    Nul,
    NotUtf8,
    EmptySegment,
    DotSegment,
}

impl fmt::Display for NameError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::BucketLength(bytes) => write!(
                formatter,
                "a bucket name is 1-{BUCKET_BYTES_MAX} bytes; this one is {bytes}"
            ),
            NameError::BucketCharacter => {
                write!(
                    formatter,
                    "a bucket name is made of a-z, 0-9, '.', '-' and '_'"
                )
            }
            NameError::BucketEdge => write!(
                formatter,
                "a bucket name starts and ends with a letter or a digit"
            ),
            NameError::BucketDoubleDot => {
                write!(formatter, "a bucket name has no two dots in a row")
            }
            NameError::KeyEmpty => write!(formatter, "an object key cannot be empty"),
            NameError::KeyLength(bytes) => write!(
                formatter,
                "a key or prefix is at most {KEY_BYTES_MAX} bytes; this one is {bytes}"
            ),
            NameError::Nul => write!(formatter, "a name cannot contain a NUL byte"),
            NameError::NotUtf8 => write!(formatter, "a name is UTF-8"),
            NameError::EmptySegment => write!(
                formatter,
                "a key cannot start or end with '/' or contain '//'"
            ),
            NameError::DotSegment => write!(
                formatter,
                "a key cannot have a '.' or '..' segment (percent-encoded or not)"
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// Check a bucket name.
pub fn check_bucket(bucket: &str) -> Result<(), NameError> {
    let bytes = bucket.as_bytes();
    if bytes.is_empty() || bytes.len() > BUCKET_BYTES_MAX {
        return Err(NameError::BucketLength(bytes.len()));
    }
    let allowed =
        |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b".-_".contains(&byte);
    if !bytes.iter().all(|&byte| allowed(byte)) {
        return Err(NameError::BucketCharacter);
    }
    let edge = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit();
    if !edge(bytes[0]) || !edge(bytes[bytes.len() - 1]) {
        return Err(NameError::BucketEdge);
    }
    if bucket.contains("..") {
        return Err(NameError::BucketDoubleDot);
    }
    Ok(())
}

/// Check an object key.
pub fn check_key(key: &str) -> Result<(), NameError> {
    if key.is_empty() {
        return Err(NameError::KeyEmpty);
    }
    check_text(key)?;
    key.split('/').try_for_each(check_segment)
}

/// Check a prefix of keys (empty allowed): every complete segment as a key's.
pub fn check_prefix(prefix: &str) -> Result<(), NameError> {
    check_text(prefix)?;
    match prefix.rsplit_once('/') {
        Some((complete, _partial)) => complete.split('/').try_for_each(check_segment),
        None => Ok(()),
    }
}

fn check_text(text: &str) -> Result<(), NameError> {
    if text.len() > KEY_BYTES_MAX {
        return Err(NameError::KeyLength(text.len()));
    }
    if text.contains('\0') {
        return Err(NameError::Nul);
    }
    Ok(())
}

fn check_segment(segment: &str) -> Result<(), NameError> {
    if segment.is_empty() {
        return Err(NameError::EmptySegment);
    }
    if is_dot_segment(segment) {
        return Err(NameError::DotSegment);
    }
    Ok(())
}

/// `.` or `..`, also spelt with `%2e` (as URL parsers read it, in any case).
fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if rest.len() >= 3 && rest[0] == b'%' && rest[1] == b'2' && rest[2] | 0x20 == b'e' {
            rest = &rest[3..];
        } else {
            return false;
        }
        dots += 1;
        if dots > 2 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        for good in [
            "a",
            "data",
            "my-bucket.v2",
            "a_b",
            "0",
            "x".repeat(63).as_str(),
        ] {
            assert_eq!(check_bucket(good), Ok(()), "{good:?}");
        }
        let bad = [
            ("", NameError::BucketLength(0)),
            (".", NameError::BucketEdge),
            ("..", NameError::BucketEdge),
            (".a", NameError::BucketEdge),
            ("a-", NameError::BucketEdge),
            ("a..b", NameError::BucketDoubleDot),
            ("A", NameError::BucketCharacter),
            ("a/b", NameError::BucketCharacter),
            ("a%2e", NameError::BucketCharacter),
            ("a\0", NameError::BucketCharacter),
        ];
        for (name, error) in bad {
            assert_eq!(check_bucket(name), Err(error), "{name:?}");
        }
        assert_eq!(
            check_bucket(&"x".repeat(64)),
            Err(NameError::BucketLength(64))
        );
    }

    #[test]
    fn keys() {
        for good in [
            "a",
            "train/0001.tar",
            ".hidden",
            "a/...",
            "a/.b",
            "a/b..",
            "%2e%2e%2e",
            "%2ex",
            "100%",
            "a b/ü",
        ] {
            assert_eq!(check_key(good), Ok(()), "{good:?}");
        }
        let bad = [
            ("", NameError::KeyEmpty),
            (".", NameError::DotSegment),
            ("..", NameError::DotSegment),
            ("a/../../x", NameError::DotSegment),
            ("a/./x", NameError::DotSegment),
            ("%2e%2e/x", NameError::DotSegment),
            ("a/%2E%2e", NameError::DotSegment),
            ("a/.%2e/b", NameError::DotSegment),
            ("a/%2e", NameError::DotSegment),
            ("/a", NameError::EmptySegment),
            ("a/", NameError::EmptySegment),
            ("a//b", NameError::EmptySegment),
            ("a\0b", NameError::Nul),
        ];
        for (name, error) in bad {
            assert_eq!(check_key(name), Err(error), "{name:?}");
        }
        assert_eq!(check_key(&"k".repeat(1024)), Ok(()));
        assert_eq!(
            check_key(&"k".repeat(1025)),
            Err(NameError::KeyLength(1025))
        );
    }

    #[test]
    fn prefixes() {
        for good in ["", "a", "a/", "a/b", "a/.", "a/..", ".", "..", "train/00"] {
            assert_eq!(check_prefix(good), Ok(()), "{good:?}");
        }
        for bad in ["../", "a/../", "/", "//", "a//", "%2e%2e/x", "a\0"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
