//! Who may do what through the S3 endpoint.
//!
//! With `--s3-credentials FILE` every request must be signed (SigV4, header or presigned URL;
//! s3s checks the signature and the clock skew) with a key of the file, and may touch only the
//! buckets that key may read or write. Without it, requests are anonymous and served only from
//! loopback, as the native protocol serves clients without a token.
//!
//! The file (TOML):
//!
//! ```toml
//! [[key]]
//! access_key_id = "trainer"
//! secret_access_key = "a secret of 16 bytes or more"
//! read = ["datasets", "checkpoints"]   # "*": every bucket
//! write = ["checkpoints"]
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{s3_error, S3Result};

use super::{Peer, S3_COUNTERS};

/// Bytes of a secret access key at least.
const SECRET_BYTES_MIN: usize = 16;
/// Keys one file may hold at most.
const KEYS_MAX: usize = 10_000;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
}

/// What one key may touch.
#[derive(Debug)]
struct Grant {
    secret: SecretKey,
    read: Buckets,
    write: Buckets,
}

#[derive(Debug)]
enum Buckets {
    Every,
    Named(Vec<String>),
}

impl Buckets {
    fn of(names: Vec<String>) -> Buckets {
        if names.iter().any(|name| name == "*") {
            Buckets::Every
        } else {
            Buckets::Named(names)
        }
    }

    fn contains(&self, bucket: &str) -> bool {
        match self {
            Buckets::Every => true,
            Buckets::Named(names) => names.iter().any(|name| name == bucket),
        }
    }
}

/// The keys of a credentials file.
#[derive(Clone, Debug)]
pub struct Credentials {
    keys: Arc<HashMap<String, Grant>>,
}

impl Credentials {
    pub fn load(path: &Path) -> Result<Credentials, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        Credentials::parse(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Credentials, String> {
        let file: KeyFile = toml::from_str(text).map_err(|error| error.to_string())?;
        if file.key.is_empty() {
            return Err("no [[key]] in the file".to_string());
        }
        if file.key.len() > KEYS_MAX {
            return Err(format!("at most {KEYS_MAX} keys, not {}", file.key.len()));
        }
        let mut keys = HashMap::new();
        for entry in file.key {
            if entry.access_key_id.is_empty() {
                return Err("an access_key_id is empty".to_string());
            }
            if entry.secret_access_key.len() < SECRET_BYTES_MIN {
                return Err(format!(
                    "the secret of {} is shorter than {SECRET_BYTES_MIN} bytes",
                    entry.access_key_id
                ));
            }
            let grant = Grant {
                secret: SecretKey::from(entry.secret_access_key),
                read: Buckets::of(entry.read),
                write: Buckets::of(entry.write),
            };
            if keys.insert(entry.access_key_id.clone(), grant).is_some() {
                return Err(format!("{} is there twice", entry.access_key_id));
            }
        }
        Ok(Credentials {
            keys: Arc::new(keys),
        })
    }

    /// No keys: every signature is refused (the endpoint serves anonymous loopback requests).
    pub(crate) fn none() -> Credentials {
        Credentials {
            keys: Arc::new(HashMap::new()),
        }
    }

    /// Whether `access_key` may read (or, with `write`, write) `bucket`.
    pub(crate) fn allows(&self, access_key: &str, bucket: &str, write: bool) -> bool {
        self.keys.get(access_key).is_some_and(|grant| {
            if write {
                grant.write.contains(bucket)
            } else {
                grant.read.contains(bucket) || grant.write.contains(bucket)
            }
        })
    }
}

#[async_trait::async_trait]
impl S3Auth for Credentials {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.keys.get(access_key) {
            Some(grant) => Ok(grant.secret.clone()),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "the access key is not in this node's credentials file"
            )),
        }
    }
}

/// Whether a request's body is signed chunk by chunk (`aws-chunked` with signatures), which
/// only a key of the credentials file can decode.
pub(crate) fn chunk_signed(headers: &hyper::HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("STREAMING-AWS4"))
}

/// The check s3s makes of every request once its signature (if any) is verified; it also
/// counts the request by operation.
pub(crate) struct Access {
    pub credentials: Option<Credentials>,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        S3_COUNTERS.count(operation_name(cx.s3_op().name()));
        let Some(credentials) = &self.credentials else {
            let loopback = cx
                .extensions_mut()
                .get::<Peer>()
                .is_some_and(|peer| peer.0.ip().is_loopback());
            if loopback {
                return Ok(());
            }
            return Err(s3_error!(
                AccessDenied,
                "without --s3-credentials this node serves S3 requests from loopback only"
            ));
        };
        let Some(signed) = cx.credentials() else {
            return Err(s3_error!(AccessDenied, "a signature is required"));
        };
        let access_key = signed.access_key.clone();
        let write = !matches!(*cx.method(), hyper::Method::GET | hyper::Method::HEAD);
        let bucket = match cx.s3_path() {
            S3Path::Root => return Ok(()), // ListBuckets: answered with the key's buckets
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
        };
        if credentials.allows(&access_key, &bucket, write) {
            Ok(())
        } else {
            Err(s3_error!(
                AccessDenied,
                "{access_key} may not {} bucket {bucket}",
                if write { "write" } else { "read" }
            ))
        }
    }
}

/// The operations counted by name; any other is counted as `other`, so that the metrics have a
/// bounded set of labels.
const COUNTED_OPERATIONS: &[&str] = &[
    "ListBuckets",
    "HeadBucket",
    "CreateBucket",
    "DeleteBucket",
    "GetObject",
    "HeadObject",
    "PutObject",
    "DeleteObject",
    "DeleteObjects",
    "CopyObject",
    "ListObjects",
    "ListObjectsV2",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "ListParts",
    "ListMultipartUploads",
];

fn operation_name(name: &str) -> &'static str {
    COUNTED_OPERATIONS
        .iter()
        .find(|counted| **counted == name)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_what_it_may_write_and_nothing_else() {
        let credentials = Credentials::parse(
            r#"
            [[key]]
            access_key_id = "trainer"
            secret_access_key = "0123456789abcdef"
            read = ["datasets"]
            write = ["checkpoints"]
            "#,
        )
        .unwrap();
        assert!(credentials.allows("trainer", "datasets", false));
        assert!(!credentials.allows("trainer", "datasets", true));
        assert!(credentials.allows("trainer", "checkpoints", false));
        assert!(credentials.allows("trainer", "checkpoints", true));
        assert!(!credentials.allows("trainer", "other", false));
        assert!(!credentials.allows("someone", "datasets", false));
    }

    #[test]
    fn a_short_secret_or_a_repeated_key_is_refused() {
        let short = "[[key]]\naccess_key_id = \"a\"\nsecret_access_key = \"short\"\n";
        assert!(Credentials::parse(short).unwrap_err().contains("shorter"));
        let twice =
            "[[key]]\naccess_key_id = \"a\"\nsecret_access_key = \"0123456789abcdef\"\n".repeat(2);
        assert!(Credentials::parse(&twice).unwrap_err().contains("twice"));
        assert!(Credentials::parse("").unwrap_err().contains("no [[key]]"));
    }
}
