//! PREFETCH, FLUSH and UPLOADS: the operations on what a node holds for its origins.

use crate::codec::{Reader, Writer};
use crate::ProtoError;

use super::*;

/// Most keys one PREFETCH names.
pub const PREFETCH_KEYS_MAX: usize = 10_000;

/// PREFETCH: read `keys` of a bucket (or, when there are none, every key under `prefix`)
/// through from the origin into the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefetchRequest {
    pub bucket: String,
    pub prefix: String,
    pub keys: Vec<String>,
}

impl Message for PrefetchRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.prefix.as_bytes());
        writer.u32(self.keys.len() as u32);
        for key in &self.keys {
            writer.bytes16(key.as_bytes());
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, name::check_bucket)?;
        let prefix = read_name(reader, name::check_prefix)?.to_string();
        let count = reader.u32()? as usize;
        if count > PREFETCH_KEYS_MAX {
            return Err(ProtoError::Malformed(
                "more than 10,000 keys in one PREFETCH",
            ));
        }
        let mut keys = Vec::with_capacity(count.min(reader.remaining() / 2));
        for _ in 0..count {
            keys.push(read_name(reader, name::check_key)?.to_string());
        }
        Ok(PrefetchRequest {
            bucket: bucket.to_string(),
            prefix,
            keys,
        })
    }
}

/// What a PREFETCH warmed: objects found and their bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchResult {
    pub objects: u64,
    pub bytes: u64,
}

impl Message for PrefetchResult {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u64(self.objects);
        writer.u64(self.bytes);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(PrefetchResult {
            objects: reader.u64()?,
            bytes: reader.u64()?,
        })
    }
}

/// FLUSH: wait until everything written to `bucket` under `prefix` (every bucket when `bucket`
/// is `None`) is durable at the origin, at most `timeout_ms` (then TIMEOUT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushRequest {
    pub bucket: Option<String>,
    pub prefix: String,
    pub timeout_ms: u32,
}

impl Message for FlushRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_deref().unwrap_or_default().as_bytes());
        writer.bytes16(self.prefix.as_bytes());
        writer.u32(self.timeout_ms);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        // An empty bucket: every bucket.
        let bucket = read_name(reader, |bucket| match bucket {
            "" => Ok(()),
            bucket => name::check_bucket(bucket),
        })?;
        let bucket = (!bucket.is_empty()).then(|| bucket.to_string());
        let prefix = read_name(reader, name::check_prefix)?.to_string();
        if bucket.is_none() && !prefix.is_empty() {
            return Err(ProtoError::Malformed("a FLUSH prefix needs a bucket"));
        }
        Ok(FlushRequest {
            bucket,
            prefix,
            timeout_ms: reader.u32()?,
        })
    }
}

/// Refused writes an UPLOADS answer lists at most.
pub const UPLOADS_LISTED_MAX: u32 = 10_000;

/// UPLOADS: the writes under `bucket`/`prefix` (every bucket when `bucket` is `None`) that the
/// origin refused for good, at most `limit` of them; with `retry`, queued for upload again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadsRequest {
    pub bucket: Option<String>,
    pub prefix: String,
    pub retry: bool,
    pub limit: u32,
}

impl Message for UploadsRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_deref().unwrap_or_default().as_bytes());
        writer.bytes16(self.prefix.as_bytes());
        writer.u8(u8::from(self.retry));
        writer.u32(self.limit);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, |bucket| match bucket {
            "" => Ok(()),
            bucket => name::check_bucket(bucket),
        })?;
        let bucket = (!bucket.is_empty()).then(|| bucket.to_string());
        let prefix = read_name(reader, name::check_prefix)?.to_string();
        if bucket.is_none() && !prefix.is_empty() {
            return Err(ProtoError::Malformed("an UPLOADS prefix needs a bucket"));
        }
        let retry = match reader.u8()? {
            0 => false,
            1 => true,
            _ => return Err(ProtoError::Malformed("retry is neither 0 nor 1")),
        };
        let limit = reader.u32()?.min(UPLOADS_LISTED_MAX);
        Ok(UploadsRequest {
            bucket,
            prefix,
            retry,
            limit,
        })
    }
}

/// One refused write: its name, version, size and the origin's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedUpload {
    pub bucket: String,
    pub key: String,
    pub seq: u64,
    pub object_bytes: u64,
    pub reason: String,
}

/// UPLOADS' answer (its payload): how many writes are refused in all, and up to the limit of
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadsAnswer {
    pub total: u64,
    pub refused: Vec<RefusedUpload>,
}

impl Message for UploadsAnswer {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u64(self.total);
        writer.u32(self.refused.len() as u32);
        for refused in &self.refused {
            writer.bytes16(refused.bucket.as_bytes());
            writer.bytes16(refused.key.as_bytes());
            writer.u64(refused.seq);
            writer.u64(refused.object_bytes);
            let reason = &refused.reason.as_bytes()[..refused.reason.len().min(1024)];
            writer.bytes16(reason);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let total = reader.u64()?;
        let count = reader.u32()?;
        if count > UPLOADS_LISTED_MAX {
            return Err(ProtoError::Malformed(
                "more refused writes than an answer lists",
            ));
        }
        let mut refused = Vec::with_capacity((count as usize).min(reader.remaining() / 22));
        for _ in 0..count {
            refused.push(RefusedUpload {
                bucket: reader.text16(BUCKET_BYTES_MAX, "bucket")?.to_string(),
                key: reader.text16(KEY_BYTES_MAX, "key")?.to_string(),
                seq: reader.u64()?,
                object_bytes: reader.u64()?,
                reason: String::from_utf8_lossy(reader.bytes16()?).into_owned(),
            });
        }
        Ok(UploadsAnswer { total, refused })
    }
}
