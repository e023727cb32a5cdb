//! The origin requests themselves: `object_store` calls that run on the origin pool, with their
//! errors turned into the engine's kinds (a missing object is an answer, not an error; anything
//! else the origin says is ORIGIN_UNAVAILABLE, which readers may retry). `open` makes a store of
//! an origin URL, `read` fetches, heads and lists, `write` puts, uploads in parts and deletes, and
//! `errors` says what an origin's failure means.

use std::sync::Arc;

use bytes::Bytes;

mod errors;
mod open;
mod read;
mod signed;
mod write;

pub(crate) use errors::check_nameable;
pub(super) use open::open_store;
pub(crate) use read::{fetch, head, list};
pub(crate) use signed::SignedPuts;
pub(crate) use write::{
    abort_upload, complete_upload, create_upload, delete, finish_multipart, origin_attributes, put,
    put_part, start_multipart, upload_part, Completion, PartAnswer,
};

/// What the origin says an object is: its size and ETag, and when it was written there.
#[derive(Clone, Debug)]
pub struct OriginVersion {
    pub bytes: u64,
    pub etag: Option<String>,
    /// Milliseconds since the Unix epoch; 0 where the answer did not say (a write's).
    pub modified_ms: u64,
    /// What the origin keeps of the object beside its bytes (its Content-Type, user
    /// metadata...), as far as the answer said: a GET's and a HEAD's say, a listing's do not.
    pub attributes: Arc<crate::Attributes>,
}

/// Versions are the same by size and ETag; the time is what an answer said of the version,
/// not part of what it is (a write's answer does not say it, a HEAD's does).
impl PartialEq for OriginVersion {
    fn eq(&self, other: &OriginVersion) -> bool {
        self.bytes == other.bytes && self.etag == other.etag
    }
}

impl Eq for OriginVersion {}

impl OriginVersion {
    /// What a copy of this version says of itself: the origin's time (or now, where it is
    /// not known) and its ETag where that is an MD5 tag (S3's are).
    pub fn stamp(&self) -> crate::Stamp {
        crate::Stamp {
            modified_ms: if self.modified_ms != 0 {
                self.modified_ms
            } else {
                crate::stamp::now_ms()
            },
            md5: self.etag.as_deref().and_then(crate::Md5Tag::parse),
        }
    }
}

/// The answer to a read from the origin.
pub(crate) enum Fetch {
    /// `data` holds the object's bytes from offset `start`.
    Data {
        version: OriginVersion,
        start: u64,
        data: Bytes,
    },
    /// The conditional GET found the cached ETag current.
    NotModified,
    /// The object changed since the ETag the read was pinned to.
    Changed,
    NotFound,
}

impl Fetch {
    /// The bytes it holds.
    pub(crate) fn data_bytes(&self) -> u64 {
        match self {
            Fetch::Data { data, .. } => data.len() as u64,
            _ => 0,
        }
    }
}

/// How a read is tied to a version.
pub(crate) enum Condition {
    None,
    /// Only if the object is still this ETag (reads of further chunks of one version).
    IfMatch(String),
    /// Only if the object is no longer this ETag (revalidation).
    IfNoneMatch(String),
}
