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

mod batch;
mod list;
mod operations;
mod plan;
#[cfg(test)]
mod tests;

pub use batch::*;
pub use list::*;
pub use operations::*;
pub use plan::*;
