//! The key of an object: a bucket and a key in one allocation, validated by the one grammar of
//! names both sides check (`hydrant_proto::name`).

use hydrant_proto::name;

use crate::format::{BUCKET_BYTES_MAX, KEY_BYTES_MAX};
use crate::{Error, ErrorKind, Result};

/// The bucket of staged objects (see `ObjectKey::staged`): a name the bucket grammar refuses
/// (it must start with a letter or digit), so no client of any protocol can read, write or
/// route it, while the device format's looser rule for stored names keeps it across restarts.
pub const STAGED_BUCKET: &str = "_staged";

/// A bucket and key, stored as `bucket 0x00 key` so that byte order sorts by bucket, then key,
/// and a prefix of a key is a prefix of the stored bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(Box<[u8]>);

impl ObjectKey {
    /// Validate and join, by the one grammar of names (`hydrant_proto::name`: no dot or empty
    /// segments, no NUL, S3-like bucket names).
    pub fn new(bucket: &str, key: &str) -> Result<ObjectKey> {
        name::check_bucket(bucket).map_err(invalid_name)?;
        name::check_key(key).map_err(invalid_name)?;
        Ok(Self::join(bucket, key))
    }

    /// A key of the engine's staging area: objects that no client can name (their bucket,
    /// `STAGED_BUCKET`, breaks the bucket grammar), kept on NVMe only, pinned like dirty data
    /// until deleted, and never uploaded to an origin. A door that assembles objects from
    /// pieces (S3's multipart uploads) keeps the pieces here. `key` follows the key grammar.
    pub fn staged(key: &str) -> Result<ObjectKey> {
        name::check_key(key).map_err(invalid_name)?;
        Ok(Self::join(STAGED_BUCKET, key))
    }

    /// A prefix of staged keys (possibly empty), for listing.
    pub fn staged_prefix(prefix: &str) -> Result<ObjectKey> {
        name::check_prefix(prefix).map_err(invalid_name)?;
        Ok(Self::join(STAGED_BUCKET, prefix))
    }

    /// Whether this is a staged key (see `staged`).
    pub fn is_staged(&self) -> bool {
        self.bucket_bytes() == STAGED_BUCKET.as_bytes()
    }

    /// A bucket and a prefix of keys (possibly empty), for listing.
    pub fn prefix(bucket: &str, prefix: &str) -> Result<ObjectKey> {
        name::check_bucket(bucket).map_err(invalid_name)?;
        name::check_prefix(prefix).map_err(invalid_name)?;
        Ok(Self::join(bucket, prefix))
    }

    fn join(bucket: &str, key: &str) -> ObjectKey {
        let mut bytes = Vec::with_capacity(bucket.len() + 1 + key.len());
        bytes.extend_from_slice(bucket.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(key.as_bytes());
        ObjectKey(bytes.into_boxed_slice())
    }

    /// From the bytes of an entry header (already bounded by the format): a client's key, or
    /// one of the engine's own chunk keys (see `origin_chunk`).
    pub(crate) fn from_parts(bucket: &[u8], key: &[u8]) -> Option<ObjectKey> {
        let bucket = std::str::from_utf8(bucket).ok()?;
        let key = std::str::from_utf8(key).ok()?;
        let parent = key.split_once('\0').map_or(key, |(parent, _)| parent);
        acceptable_on_device(bucket, parent).then(|| Self::join(bucket, key))
    }

    /// Whether `from_parts` would accept these bytes (without making a key of them).
    pub(crate) fn parts_acceptable(bucket: &[u8], key: &[u8]) -> bool {
        let (Ok(bucket), Ok(key)) = (std::str::from_utf8(bucket), std::str::from_utf8(key)) else {
            return false;
        };
        let parent = key.split_once('\0').map_or(key, |(parent, _)| parent);
        acceptable_on_device(bucket, parent)
    }

    /// The key under which chunk `chunk` of version `version_tag` of a large origin object is
    /// cached: `key NUL version NUL chunk`. Clients cannot name it (their keys have no NUL), and
    /// a new version at the origin gets new chunk keys, so stale chunks are never read. `None`
    /// when the key is too long to carry the suffix.
    pub fn origin_chunk(&self, version_tag: u64, chunk: u64) -> Option<ObjectKey> {
        let suffix = format!("\0{version_tag:016x}\0{chunk}");
        if self.key_bytes().len() + suffix.len() > KEY_BYTES_MAX {
            return None;
        }
        let mut bytes = Vec::with_capacity(self.0.len() + suffix.len());
        bytes.extend_from_slice(&self.0);
        bytes.extend_from_slice(suffix.as_bytes());
        Some(ObjectKey(bytes.into_boxed_slice()))
    }

    /// Whether this is one of the engine's chunk keys rather than a client's object.
    pub fn is_origin_chunk(&self) -> bool {
        is_origin_chunk_joined(&self.0)
    }

    /// A copy of a joined key the index holds.
    pub(crate) fn from_joined(joined: &[u8]) -> ObjectKey {
        ObjectKey(Box::from(joined))
    }

    fn split(&self) -> (&[u8], &[u8]) {
        split_joined(&self.0)
    }

    pub fn bucket(&self) -> &str {
        std::str::from_utf8(self.split().0).expect("validated UTF-8")
    }

    pub fn key(&self) -> &str {
        std::str::from_utf8(self.split().1).expect("validated UTF-8")
    }

    pub fn bucket_bytes(&self) -> &[u8] {
        self.split().0
    }

    pub fn key_bytes(&self) -> &[u8] {
        self.split().1
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The joined bytes, given up (the index keeps them shared between its two views).
    pub(crate) fn into_joined(self) -> Box<[u8]> {
        self.0
    }
}

/// `ObjectKey::is_origin_chunk` of a joined key the index holds.
pub(crate) fn is_origin_chunk_joined(joined: &[u8]) -> bool {
    split_joined(joined).1.contains(&0)
}

/// (bucket, key) of a joined key.
pub(crate) fn split_joined(joined: &[u8]) -> (&[u8], &[u8]) {
    let zero = joined
        .iter()
        .position(|&byte| byte == 0)
        .expect("joined key has a separator");
    (&joined[..zero], &joined[zero + 1..])
}

fn invalid_name(error: name::NameError) -> Error {
    Error::new(ErrorKind::InvalidKey, error.to_string())
}

/// Names as an older store may hold them (before the grammar of `hydrant_proto::name`): a
/// bucket of `a-z 0-9 . - _` and a key without NUL, each within the format's bounds. Recovery
/// keeps such objects (nothing written is dropped); clients cannot name them and origins
/// refuse to route them (see `Origins::route` and `Route::path`).
fn acceptable_on_device(bucket: &str, key: &str) -> bool {
    let bucket_ok = !bucket.is_empty()
        && bucket.len() <= BUCKET_BYTES_MAX
        && bucket.bytes().all(|byte| {
            byte.is_ascii_lowercase() || byte.is_ascii_digit() || b".-_".contains(&byte)
        });
    bucket_ok && !key.is_empty() && key.len() <= KEY_BYTES_MAX && !key.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert_eq!(
            ObjectKey::new("b", "").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("b", &"k".repeat(1025)).unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("Bad", "k").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert_eq!(
            ObjectKey::new("", "k").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        let staged = ObjectKey::staged("parts/1").unwrap();
        assert!(staged.is_staged());
        assert!(!ObjectKey::new("data-1", "parts/1").unwrap().is_staged());
        assert!(ObjectKey::new(STAGED_BUCKET, "parts/1").is_err());
        assert_eq!(
            ObjectKey::from_parts(STAGED_BUCKET.as_bytes(), b"parts/1"),
            Some(staged)
        );
        assert!(ObjectKey::staged("parts/../x").is_err());
        let key = ObjectKey::new("data-1", &"k".repeat(1024)).unwrap();
        assert_eq!(key.bucket(), "data-1");
        assert_eq!(key.key().len(), 1024);
    }
}
