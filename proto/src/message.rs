//! The extensions of each operation. Every `decode` reads exactly its input (trailing bytes are
//! an error) and checks names and numbers against the protocol's bounds.

use crate::codec::{Reader, Writer};
use crate::name::{self, NameError};
use crate::{Limits, ProtoError};

pub use crate::name::{BUCKET_BYTES_MAX, KEY_BYTES_MAX};
pub const NONCE_BYTES: usize = 16;
pub const PROOF_BYTES: usize = 32;

/// An extension's encoding.
pub trait Message: Sized {
    fn encode_into(&self, writer: &mut Writer);
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError>;

    fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        self.encode_into(&mut writer);
        writer.finish()
    }

    fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(bytes);
        let message = Self::decode_from(&mut reader)?;
        reader.finish()?;
        Ok(message)
    }
}

/// HELLO from the client: the versions it speaks, its limits, a nonce, and (on the second HELLO
/// when the server asked for it) the proof: HMAC-SHA256(token, server_nonce ‖ client_nonce).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloRequest {
    pub version_min: u8,
    pub version_max: u8,
    pub limits: Limits,
    pub client_nonce: [u8; NONCE_BYTES],
    pub proof: Option<[u8; PROOF_BYTES]>,
}

impl Message for HelloRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u8(self.version_min);
        writer.u8(self.version_max);
        self.limits.encode(writer);
        writer.fixed(&self.client_nonce);
        match &self.proof {
            Some(proof) => {
                writer.u8(1);
                writer.fixed(proof);
            }
            None => writer.u8(0),
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let version_min = reader.u8()?;
        let version_max = reader.u8()?;
        if version_min > version_max {
            return Err(ProtoError::Malformed("version range is empty"));
        }
        let limits = Limits::decode(reader)?;
        let client_nonce = reader.fixed()?;
        let proof = match reader.u8()? {
            0 => None,
            1 => Some(reader.fixed()?),
            _ => return Err(ProtoError::Malformed("proof marker is neither 0 nor 1")),
        };
        Ok(HelloRequest {
            version_min,
            version_max,
            limits,
            client_nonce,
            proof,
        })
    }
}

/// HELLO's answer: the version and limits in force, the server's nonce, whether a proof is
/// needed, and the shard map a shard-aware client routes by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloResponse {
    pub version: u8,
    pub limits: Limits,
    pub server_nonce: [u8; NONCE_BYTES],
    pub auth_required: bool,
    pub shard_count: u16,
    /// 1 = CRC32C(bucket ‖ 0x00 ‖ key) mod shard_count.
    pub placement_hash: u32,
    /// The shard-aware path: for each shard in order, a TCP port on the address the client
    /// connected to whose connections that shard serves itself (requests for its keys skip the
    /// hop between shards). Empty when the server offers none; else `shard_count` ports.
    pub shard_ports: Vec<u16>,
}

impl Message for HelloResponse {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u8(self.version);
        self.limits.encode(writer);
        writer.fixed(&self.server_nonce);
        writer.u8(u8::from(self.auth_required));
        writer.u16(self.shard_count);
        writer.u32(self.placement_hash);
        writer.u16(self.shard_ports.len() as u16);
        for port in &self.shard_ports {
            writer.u16(*port);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let version = reader.u8()?;
        let limits = Limits::decode(reader)?;
        let server_nonce = reader.fixed()?;
        let auth_required = match reader.u8()? {
            0 => false,
            1 => true,
            _ => return Err(ProtoError::Malformed("auth flag is neither 0 nor 1")),
        };
        let shard_count = reader.u16()?;
        if shard_count == 0 {
            return Err(ProtoError::Malformed("no shards"));
        }
        let placement_hash = reader.u32()?;
        // A server without the shard-aware path may end here.
        let ports = if reader.remaining() == 0 {
            0
        } else {
            reader.u16()?
        };
        if ports != 0 && ports != shard_count {
            return Err(ProtoError::Malformed(
                "shard ports are neither none nor one per shard",
            ));
        }
        let shard_ports = (0..ports)
            .map(|_| reader.u16())
            .collect::<Result<Vec<u16>, ProtoError>>()?;
        if shard_ports.contains(&0) {
            return Err(ProtoError::Malformed("a shard port is 0"));
        }
        // HELLO's answer is the one extension that grows: later servers append fields, which
        // this client does not know and passes over.
        reader.skip_rest();
        Ok(HelloResponse {
            version,
            limits,
            server_nonce,
            auth_required,
            shard_count,
            placement_hash,
            shard_ports,
        })
    }
}

/// A bucket and a key, each following the grammar of `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectName {
    pub bucket: String,
    pub key: String,
}

/// A name field (u16 length, then UTF-8), checked by `check` (see `name`): a name that breaks
/// the grammar is `InvalidName` (INVALID_KEY to the peer), whatever rule it breaks.
fn read_name<'a>(
    reader: &mut Reader<'a>,
    check: fn(&str) -> Result<(), NameError>,
) -> Result<&'a str, ProtoError> {
    let text = std::str::from_utf8(reader.bytes16()?)
        .map_err(|_| ProtoError::InvalidName(NameError::NotUtf8))?;
    check(text).map_err(ProtoError::InvalidName)?;
    Ok(text)
}

impl ObjectName {
    pub fn as_ref(&self) -> ObjectNameRef<'_> {
        ObjectNameRef {
            bucket: &self.bucket,
            key: &self.key,
        }
    }
}

impl Message for ObjectName {
    fn encode_into(&self, writer: &mut Writer) {
        self.as_ref().encode_into(writer);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        ObjectNameRef::decode_from(reader).map(ObjectNameRef::to_owned)
    }
}

/// An `ObjectName` read where it lies in an extension, checked alike, without copying it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectNameRef<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
}

impl<'a> ObjectNameRef<'a> {
    pub fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.key.as_bytes());
    }

    pub fn decode_from(reader: &mut Reader<'a>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, name::check_bucket)?;
        let key = read_name(reader, name::check_key)?;
        Ok(ObjectNameRef { bucket, key })
    }

    pub fn to_owned(self) -> ObjectName {
        ObjectName {
            bucket: self.bucket.to_string(),
            key: self.key.to_string(),
        }
    }
}

/// GET: a whole object, or bytes `range_start` up to `range_end` (exclusive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetRequest {
    pub name: ObjectName,
    pub range_start: u64,
    pub range_end: Option<u64>,
}

impl Message for GetRequest {
    fn encode_into(&self, writer: &mut Writer) {
        GetRequestRef {
            name: self.name.as_ref(),
            range_start: self.range_start,
            range_end: self.range_end,
        }
        .encode_into(writer);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        GetRequestRef::decode_from(reader).map(GetRequestRef::to_owned)
    }
}

/// A `GetRequest` read where it lies, its name borrowed: what a server answering from memory
/// decodes without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetRequestRef<'a> {
    pub name: ObjectNameRef<'a>,
    pub range_start: u64,
    pub range_end: Option<u64>,
}

impl<'a> GetRequestRef<'a> {
    pub fn encode_into(&self, writer: &mut Writer) {
        self.name.encode_into(writer);
        writer.u64(self.range_start);
        writer.u64(self.range_end.unwrap_or(u64::MAX));
    }

    pub fn to_owned(self) -> GetRequest {
        GetRequest {
            name: self.name.to_owned(),
            range_start: self.range_start,
            range_end: self.range_end,
        }
    }

    /// The encoding, as `Message::encode` gives it.
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        self.encode_into(&mut writer);
        writer.finish()
    }

    /// Decode exactly `bytes`, as `Message::decode` does.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(bytes);
        let request = GetRequestRef::decode_from(&mut reader)?;
        reader.finish()?;
        Ok(request)
    }

    fn decode_from(reader: &mut Reader<'a>) -> Result<Self, ProtoError> {
        let name = ObjectNameRef::decode_from(reader)?;
        let range_start = reader.u64()?;
        let range_end = match reader.u64()? {
            u64::MAX => None,
            end if end < range_start => {
                return Err(ProtoError::Malformed("range ends before it starts"))
            }
            end => Some(end),
        };
        Ok(GetRequestRef {
            name,
            range_start,
            range_end,
        })
    }
}

/// GET's answer (the payload carries the bytes): the object's size and version, and where in it
/// the payload starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub object_bytes: u64,
    pub seq: u64,
    pub dirty: bool,
    pub range_start: u64,
}

/// Bytes of an encoded `ObjectInfo`.
pub const OBJECT_INFO_BYTES: usize = 25;

impl ObjectInfo {
    /// The encoding, without allocating (what `encode` returns in a vector).
    pub fn to_bytes(&self) -> [u8; OBJECT_INFO_BYTES] {
        let mut bytes = [0u8; OBJECT_INFO_BYTES];
        bytes[..8].copy_from_slice(&self.object_bytes.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.seq.to_le_bytes());
        bytes[16] = u8::from(self.dirty);
        bytes[17..].copy_from_slice(&self.range_start.to_le_bytes());
        bytes
    }
}

impl Message for ObjectInfo {
    fn encode_into(&self, writer: &mut Writer) {
        writer.fixed(&self.to_bytes());
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let object_bytes = reader.u64()?;
        let seq = reader.u64()?;
        let dirty = match reader.u8()? {
            0 => false,
            1 => true,
            _ => return Err(ProtoError::Malformed("dirty flag is neither 0 nor 1")),
        };
        let range_start = reader.u64()?;
        if range_start > object_bytes {
            return Err(ProtoError::Malformed("range starts past the object"));
        }
        Ok(ObjectInfo {
            object_bytes,
            seq,
            dirty,
            range_start,
        })
    }
}

/// PUT: the object's total size; its bytes follow as the payload of this frame and of the
/// frames flagged MORE after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutRequest {
    pub name: ObjectName,
    pub object_bytes: u64,
}

impl Message for PutRequest {
    fn encode_into(&self, writer: &mut Writer) {
        self.name.encode_into(writer);
        writer.u64(self.object_bytes);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(PutRequest {
            name: ObjectName::decode_from(reader)?,
            object_bytes: reader.u64()?,
        })
    }
}

/// LIST: up to `limit` keys of a bucket starting with `prefix`, after `start_after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRequest {
    pub bucket: String,
    pub prefix: String,
    pub start_after: Option<String>,
    pub limit: u32,
}

impl Message for ListRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.prefix.as_bytes());
        match &self.start_after {
            Some(after) => {
                writer.u8(1);
                writer.bytes16(after.as_bytes());
            }
            None => writer.u8(0),
        }
        writer.u32(self.limit);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, name::check_bucket)?;
        let prefix = read_name(reader, name::check_prefix)?.to_string();
        let start_after = match reader.u8()? {
            0 => None,
            1 => Some(read_name(reader, name::check_prefix)?.to_string()),
            _ => {
                return Err(ProtoError::Malformed(
                    "start_after marker is neither 0 nor 1",
                ))
            }
        };
        let limit = reader.u32()?;
        if limit == 0 {
            return Err(ProtoError::Malformed("a list of at most 0 keys"));
        }
        Ok(ListRequest {
            bucket: bucket.to_string(),
            prefix,
            start_after,
            limit,
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ObjectName {
        ObjectName {
            bucket: "datasets".into(),
            key: "train/shard-0001.tar".into(),
        }
    }

    #[test]
    fn every_message_round_trips() {
        let hello = HelloRequest {
            version_min: 1,
            version_max: 1,
            limits: Limits::default(),
            client_nonce: [7; NONCE_BYTES],
            proof: Some([9; PROOF_BYTES]),
        };
        assert_eq!(HelloRequest::decode(&hello.encode()), Ok(hello));
        let prefetch = PrefetchRequest {
            bucket: "datasets".into(),
            prefix: "train/".into(),
            keys: vec!["a".into(), "b/c".into()],
        };
        assert_eq!(PrefetchRequest::decode(&prefetch.encode()), Ok(prefetch));
        let warmed = PrefetchResult {
            objects: 3,
            bytes: 1 << 40,
        };
        assert_eq!(PrefetchResult::decode(&warmed.encode()), Ok(warmed));
        let uploads = UploadsRequest {
            bucket: Some("ckpt".into()),
            prefix: "step-9/".into(),
            retry: true,
            limit: 100,
        };
        assert_eq!(UploadsRequest::decode(&uploads.encode()), Ok(uploads));
        let refused = UploadsAnswer {
            total: 7,
            refused: vec![RefusedUpload {
                bucket: "ckpt".into(),
                key: "x/y".into(),
                seq: 12,
                object_bytes: 4096,
                reason: "origin refused".into(),
            }],
        };
        assert_eq!(UploadsAnswer::decode(&refused.encode()), Ok(refused));
        for bucket in [None, Some("ckpt".to_string())] {
            let flush = FlushRequest {
                prefix: if bucket.is_some() {
                    "step-9/".into()
                } else {
                    String::new()
                },
                bucket,
                timeout_ms: 60_000,
            };
            assert_eq!(FlushRequest::decode(&flush.encode()), Ok(flush));
        }
        let prefix_without_bucket = FlushRequest {
            bucket: None,
            prefix: "x".into(),
            timeout_ms: 1,
        };
        assert!(FlushRequest::decode(&prefix_without_bucket.encode()).is_err());
        let answer = HelloResponse {
            version: 1,
            limits: Limits::default(),
            server_nonce: [3; NONCE_BYTES],
            auth_required: true,
            shard_count: 2,
            placement_hash: 1,
            shard_ports: vec![7701, 7702],
        };
        assert_eq!(HelloResponse::decode(&answer.encode()), Ok(answer.clone()));
        // A later server's answer with fields appended: the known ones decode, the rest is
        // passed over; an answer that ends after the placement hash offers no shard ports.
        let mut grown = answer.encode();
        grown.extend_from_slice(&[9, 9, 9, 9, 9]);
        assert_eq!(HelloResponse::decode(&grown), Ok(answer.clone()));
        let mut older = answer.encode();
        older.truncate(older.len() - 6);
        assert_eq!(
            HelloResponse::decode(&older).map(|hello| hello.shard_ports),
            Ok(Vec::new())
        );
        let none = HelloResponse {
            shard_ports: Vec::new(),
            ..answer.clone()
        };
        assert_eq!(HelloResponse::decode(&none.encode()), Ok(none));
        let wrong_count = HelloResponse {
            shard_ports: vec![7701],
            ..answer.clone()
        };
        assert!(HelloResponse::decode(&wrong_count.encode()).is_err());
        let port_zero = HelloResponse {
            shard_ports: vec![7701, 0],
            ..answer
        };
        assert!(HelloResponse::decode(&port_zero.encode()).is_err());
        let get = GetRequest {
            name: name(),
            range_start: 10,
            range_end: Some(20),
        };
        assert_eq!(GetRequest::decode(&get.encode()), Ok(get.clone()));
        let whole = GetRequest {
            name: name(),
            range_start: 0,
            range_end: None,
        };
        let get_bytes = get.encode();
        let borrowed = GetRequestRef::decode(&get_bytes).expect("decodes");
        assert_eq!(
            (
                borrowed.name.to_owned(),
                borrowed.range_start,
                borrowed.range_end
            ),
            (get.name.clone(), 10, Some(20))
        );
        assert_eq!(GetRequest::decode(&borrowed.encode()), Ok(get.clone()));
        assert_eq!(GetRequest::decode(&whole.encode()), Ok(whole));
        let info = ObjectInfo {
            object_bytes: 100,
            seq: 5,
            dirty: true,
            range_start: 10,
        };
        assert_eq!(ObjectInfo::decode(&info.encode()), Ok(info));
        assert_eq!(info.encode().len(), OBJECT_INFO_BYTES);
        assert_eq!(
            ObjectInfo::decode(&info.to_bytes()),
            Ok(info),
            "to_bytes is the encoding"
        );
        let put = PutRequest {
            name: name(),
            object_bytes: 1 << 40,
        };
        assert_eq!(PutRequest::decode(&put.encode()), Ok(put));
        let list = ListRequest {
            bucket: "datasets".into(),
            prefix: "train/".into(),
            start_after: Some("train/a".into()),
            limit: 100,
        };
        assert_eq!(ListRequest::decode(&list.encode()), Ok(list));
    }

    #[test]
    fn bad_contents_are_refused() {
        let mut bad_bucket = Writer::new();
        bad_bucket.bytes16(b"Data");
        bad_bucket.bytes16(b"key");
        assert!(ObjectName::decode(&bad_bucket.finish()).is_err());
        let long_key = ObjectName {
            bucket: "b".into(),
            key: "k".repeat(1025),
        };
        assert!(ObjectName::decode(&long_key.encode()).is_err());
        let empty_key = ObjectName {
            bucket: "b".into(),
            key: String::new(),
        };
        assert!(ObjectName::decode(&empty_key.encode()).is_err());
        let mut trailing = name().encode();
        trailing.push(0);
        assert_eq!(
            ObjectName::decode(&trailing),
            Err(ProtoError::Malformed("trailing bytes after the extension"))
        );
        let backwards = GetRequest {
            name: name(),
            range_start: 20,
            range_end: Some(10),
        };
        assert!(GetRequest::decode(&backwards.encode()).is_err());
        assert!(GetRequestRef::decode(&backwards.encode()).is_err());
        let mut trailing_get = GetRequest {
            name: name(),
            range_start: 0,
            range_end: None,
        }
        .encode();
        trailing_get.push(0);
        assert!(GetRequestRef::decode(&trailing_get).is_err());
        let small_limits = Limits {
            extension_bytes_max: 10,
            ..Limits::default()
        };
        let hello = HelloRequest {
            version_min: 1,
            version_max: 1,
            limits: small_limits,
            client_nonce: [0; 16],
            proof: None,
        };
        assert!(
            HelloRequest::decode(&hello.encode()).is_err(),
            "limits below the floor are refused"
        );
        let encoded = name().encode();
        for cut in 0..encoded.len() {
            assert!(ObjectName::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
    }
}

/// One object in a LIST answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    pub key: String,
    pub object_bytes: u64,
    pub seq: u64,
    pub dirty: bool,
}

/// LIST's answer, carried as the payload: a count, then each entry's key (str16), size, version
/// and dirty flag, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntries {
    pub entries: Vec<ListEntry>,
}

/// The most entries one LIST answer holds.
pub const LIST_ENTRIES_MAX: usize = 10_000;

impl Message for ListEntries {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.entries.len() as u32);
        for entry in &self.entries {
            writer.bytes16(entry.key.as_bytes());
            writer.u64(entry.object_bytes);
            writer.u64(entry.seq);
            writer.u8(u8::from(entry.dirty));
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = reader.u32()? as usize;
        if count > LIST_ENTRIES_MAX {
            return Err(ProtoError::Malformed("more list entries than a page holds"));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let key = reader
                .text16(KEY_BYTES_MAX, "key longer than 1024 bytes")?
                .to_string();
            let object_bytes = reader.u64()?;
            let seq = reader.u64()?;
            let dirty = reader.u8()? != 0;
            entries.push(ListEntry {
                key,
                object_bytes,
                seq,
                dirty,
            });
        }
        Ok(ListEntries { entries })
    }
}

#[cfg(test)]
mod list_tests {
    use super::*;

    #[test]
    fn list_entries_round_trip_and_are_bounded() {
        let page = ListEntries {
            entries: vec![
                ListEntry {
                    key: "a/1".into(),
                    object_bytes: 10,
                    seq: 1,
                    dirty: false,
                },
                ListEntry {
                    key: "a/2".into(),
                    object_bytes: 0,
                    seq: 9,
                    dirty: true,
                },
            ],
        };
        assert_eq!(ListEntries::decode(&page.encode()), Ok(page));
        let mut too_many = Writer::new();
        too_many.u32(LIST_ENTRIES_MAX as u32 + 1);
        assert!(ListEntries::decode(&too_many.finish()).is_err());
    }
}

/// BATCH_GET: many GETs in one request. Each item is answered by a frame of its own (with the
/// batch's request id, a BatchItem extension and the item's status), as it completes or, with
/// the IN_ORDER flag, in request order. Every answer but the last carries the MORE flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchGetRequest {
    pub items: Vec<GetRequest>,
}

impl Message for BatchGetRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.items.len() as u32);
        for item in &self.items {
            item.encode_into(writer);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = reader.u32()? as usize;
        if count == 0 {
            return Err(ProtoError::Malformed("an empty batch"));
        }
        // Each item takes at least 21 bytes, so the extension's own length bounds the count
        // before anything is allocated for it.
        let mut items = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            items.push(GetRequest::decode_from(reader)?);
        }
        Ok(BatchGetRequest { items })
    }
}

/// The extension of one BATCH_GET answer: which item, and (when its status is OK) the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchItem {
    pub item: u32,
    pub info: Option<ObjectInfo>,
}

impl Message for BatchItem {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.item);
        if let Some(info) = &self.info {
            info.encode_into(writer);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let item = reader.u32()?;
        let info = if reader.remaining() > 0 {
            Some(ObjectInfo::decode_from(reader)?)
        } else {
            None
        };
        Ok(BatchItem { item, info })
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn batches_round_trip() {
        let item = GetRequest {
            name: ObjectName {
                bucket: "b".into(),
                key: "k".into(),
            },
            range_start: 0,
            range_end: None,
        };
        let batch = BatchGetRequest {
            items: vec![item.clone(), item],
        };
        assert_eq!(BatchGetRequest::decode(&batch.encode()), Ok(batch));
        let answer = BatchItem {
            item: 3,
            info: Some(ObjectInfo {
                object_bytes: 5,
                seq: 1,
                dirty: false,
                range_start: 0,
            }),
        };
        assert_eq!(BatchItem::decode(&answer.encode()), Ok(answer));
        let failed = BatchItem {
            item: 4,
            info: None,
        };
        assert_eq!(BatchItem::decode(&failed.encode()), Ok(failed));
        let mut lying = Writer::new();
        lying.u32(1_000_000);
        assert!(
            BatchGetRequest::decode(&lying.finish()).is_err(),
            "a count the bytes cannot hold"
        );
    }
}
