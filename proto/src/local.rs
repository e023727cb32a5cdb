//! The same-host path: messages over a Unix domain socket between a client and a server on one
//! machine. The object bytes never cross the socket: the client asks for a shared memory region
//! (a sealed memfd the server passes with SCM_RIGHTS), names a place in it in each read, and gets
//! back only a small completion. Layout in docs/protocol.md, "Same-host path".
//!
//! ```text
//! offset size field
//!      0    4 body_len     bytes after this 16-byte header, at most LOCAL_BODY_BYTES_MAX
//!      4    1 opcode       LocalOpcode
//!      5    1 status       0 in requests; a Status in answers
//!      6    2 reserved     0
//!      8    8 request_id   echoed in the answer
//! ```

use crate::codec::{Reader, Writer};
use crate::ProtoError;

pub const LOCAL_HEADER_BYTES: usize = 16;
/// The most bytes of one message's body (a batch of reads with long keys fits).
pub const LOCAL_BODY_BYTES_MAX: u32 = 4 << 20;
/// Items of one READ.
pub const LOCAL_READ_ITEMS_MAX: u32 = 1024;
/// One region, and all the regions of one connection together.
pub const LOCAL_REGION_BYTES_MAX: u64 = 16 << 30;
/// Regions one connection may hold at once.
pub const LOCAL_REGIONS_PER_CONNECTION_MAX: u32 = 64;
/// `range_end` meaning "to the end of the object".
pub const LOCAL_RANGE_TO_END: u64 = u64::MAX;
/// Pieces of one WRITE_MEMORY.
pub const LOCAL_WRITE_PARTS_MAX: u32 = 65536;
/// ALLOCATE answer flag: the region is backed by huge pages.
pub const LOCAL_REGION_FLAG_HUGE_PAGES: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LocalOpcode {
    /// Body: u64 bytes. Answer: u32 region, u32 flags, u64 bytes, and the memfd (SCM_RIGHTS).
    Allocate = 1,
    /// Body: `LocalRead`. Answer: `LocalReadAnswer`.
    Read = 2,
    /// Body: u32 region. Answer: empty.
    Free = 3,
    /// Body: `LocalWrite`. Answer: `LocalWriteAnswer`.
    Write = 4,
    /// Body: `LocalWriteMemory`. Answer: `LocalWriteAnswer`.
    WriteMemory = 5,
    /// Body: `local_ring::RingOpen`. Answer: `local_ring::RingInfo`, and the ring file and
    /// its two doorbells (SCM_RIGHTS).
    RingOpen = 6,
}

impl LocalOpcode {
    pub fn from_u8(value: u8) -> Result<LocalOpcode, ProtoError> {
        match value {
            1 => Ok(LocalOpcode::Allocate),
            2 => Ok(LocalOpcode::Read),
            3 => Ok(LocalOpcode::Free),
            4 => Ok(LocalOpcode::Write),
            5 => Ok(LocalOpcode::WriteMemory),
            6 => Ok(LocalOpcode::RingOpen),
            other => Err(ProtoError::UnknownOpcode(other)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalHeader {
    pub body_len: u32,
    pub opcode: u8,
    pub status: u8,
    pub request_id: u64,
}

impl LocalHeader {
    pub fn encode(&self) -> [u8; LOCAL_HEADER_BYTES] {
        let mut bytes = [0u8; LOCAL_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[4] = self.opcode;
        bytes[5] = self.status;
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes
    }

    /// Checks the length bound and the reserved bytes before the body is read.
    pub fn decode(bytes: &[u8; LOCAL_HEADER_BYTES]) -> Result<LocalHeader, ProtoError> {
        let body_len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if body_len > LOCAL_BODY_BYTES_MAX {
            return Err(ProtoError::ExtensionTooLong {
                bytes: body_len,
                max: LOCAL_BODY_BYTES_MAX,
            });
        }
        if bytes[6] != 0 || bytes[7] != 0 {
            return Err(ProtoError::ReservedNotZero);
        }
        Ok(LocalHeader {
            body_len,
            opcode: bytes[4],
            status: bytes[5],
            request_id: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
        })
    }
}

/// A whole message: header then body.
pub fn local_message(opcode: LocalOpcode, status: u8, request_id: u64, body: &[u8]) -> Vec<u8> {
    assert!(body.len() <= LOCAL_BODY_BYTES_MAX as usize);
    let header = LocalHeader {
        body_len: body.len() as u32,
        opcode: opcode as u8,
        status,
        request_id,
    };
    let mut message = Vec::with_capacity(LOCAL_HEADER_BYTES + body.len());
    message.extend_from_slice(&header.encode());
    message.extend_from_slice(body);
    message
}

/// One item of a READ: copy `bucket/key` (bytes `range_start..range_end` of it) into the
/// region at `offset`, using at most `length` bytes there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReadItem {
    pub offset: u64,
    pub length: u64,
    pub range_start: u64,
    /// Exclusive; `LOCAL_RANGE_TO_END` for the rest of the object.
    pub range_end: u64,
    pub bucket: String,
    pub key: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalRead {
    pub region: u32,
    pub items: Vec<LocalReadItem>,
}

impl LocalRead {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.region);
        writer.u32(self.items.len() as u32);
        for item in &self.items {
            writer.u64(item.offset);
            writer.u64(item.length);
            writer.u64(item.range_start);
            writer.u64(item.range_end);
            writer.bytes16(item.bucket.as_bytes());
            writer.bytes16(item.key.as_bytes());
        }
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalRead, ProtoError> {
        let mut reader = Reader::new(bytes);
        let region = reader.u32()?;
        let count = reader.u32()?;
        if count > LOCAL_READ_ITEMS_MAX {
            return Err(ProtoError::Malformed("too many items in one READ"));
        }
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(LocalReadItem {
                offset: reader.u64()?,
                length: reader.u64()?,
                range_start: reader.u64()?,
                range_end: reader.u64()?,
                bucket: reader.text16(255, "bucket")?.to_string(),
                key: reader.text16(4096, "key")?.to_string(),
            });
        }
        reader.finish()?;
        Ok(LocalRead { region, items })
    }
}

/// How one item of a READ went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalItemResult {
    pub status: u8,
    /// Size of the whole object (0 when not found).
    pub object_bytes: u64,
    /// Offset in the object of the first byte written.
    pub range_start: u64,
    /// Bytes written into the region at the item's offset.
    pub written: u64,
    /// Why, when `status` is not OK.
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReadAnswer {
    pub items: Vec<LocalItemResult>,
}

impl LocalReadAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.items.len() as u32);
        for item in &self.items {
            writer.u8(item.status);
            writer.u64(item.object_bytes);
            writer.u64(item.range_start);
            writer.u64(item.written);
            let message = &item.message.as_bytes()[..item.message.len().min(1024)];
            writer.bytes16(message);
        }
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalReadAnswer, ProtoError> {
        let mut reader = Reader::new(bytes);
        let count = reader.u32()?;
        if count > LOCAL_READ_ITEMS_MAX {
            return Err(ProtoError::Malformed("too many items in one READ answer"));
        }
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(LocalItemResult {
                status: reader.u8()?,
                object_bytes: reader.u64()?,
                range_start: reader.u64()?,
                written: reader.u64()?,
                message: String::from_utf8_lossy(reader.bytes16()?).into_owned(),
            });
        }
        reader.finish()?;
        Ok(LocalReadAnswer { items })
    }
}

/// What a WRITE requires of its key before it is written (checked on the key's shard with no
/// other write of the key in between).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalCondition {
    /// Nothing: an ordinary write.
    None,
    /// No object under the key, here or at its origin (S3's `If-None-Match: *`).
    Absent,
    /// The version stored here is this one (its seq, as a WRITE or GET answered it).
    Version(u64),
}

/// WRITE: store the `length` bytes at `offset` of the region as `bucket/key`, by the bucket's
/// write mode. The client leaves those bytes alone until the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalWrite {
    pub region: u32,
    pub offset: u64,
    pub length: u64,
    pub condition: LocalCondition,
    pub bucket: String,
    pub key: String,
}

impl LocalCondition {
    fn encode(&self, writer: &mut Writer) {
        let (kind, version) = match *self {
            LocalCondition::None => (0, 0),
            LocalCondition::Absent => (1, 0),
            LocalCondition::Version(seq) => (2, seq),
        };
        writer.u8(kind);
        writer.u64(version);
    }

    fn decode(reader: &mut Reader<'_>) -> Result<LocalCondition, ProtoError> {
        let kind = reader.u8()?;
        let version = reader.u64()?;
        match (kind, version) {
            (0, 0) => Ok(LocalCondition::None),
            (1, 0) => Ok(LocalCondition::Absent),
            (2, seq) => Ok(LocalCondition::Version(seq)),
            _ => Err(ProtoError::Malformed("an unknown WRITE condition")),
        }
    }
}

impl LocalWrite {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.region);
        writer.u64(self.offset);
        writer.u64(self.length);
        self.condition.encode(&mut writer);
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.key.as_bytes());
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalWrite, ProtoError> {
        let mut reader = Reader::new(bytes);
        let region = reader.u32()?;
        let offset = reader.u64()?;
        let length = reader.u64()?;
        let condition = LocalCondition::decode(&mut reader)?;
        let bucket = reader.text16(255, "bucket")?.to_string();
        let key = reader.text16(4096, "key")?.to_string();
        reader.finish()?;
        Ok(LocalWrite {
            region,
            offset,
            length,
            condition,
            bucket,
            key,
        })
    }
}

/// WRITE_MEMORY: store the concatenation of `parts`, each (address, length) in the writer's
/// own memory, as `bucket/key`, by the bucket's write mode. The server reads those bytes from
/// the writer's process (the one that opened the connection, by its credentials) with
/// `process_vm_readv`, so they need no shared region; the writer leaves them alone until the
/// answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalWriteMemory {
    pub parts: Vec<(u64, u64)>,
    pub condition: LocalCondition,
    pub bucket: String,
    pub key: String,
}

impl LocalWriteMemory {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.parts.len() as u32);
        for &(address, length) in &self.parts {
            writer.u64(address);
            writer.u64(length);
        }
        self.condition.encode(&mut writer);
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.key.as_bytes());
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalWriteMemory, ProtoError> {
        let mut reader = Reader::new(bytes);
        let count = reader.u32()?;
        if count > LOCAL_WRITE_PARTS_MAX {
            return Err(ProtoError::Malformed("a WRITE_MEMORY of too many parts"));
        }
        let mut parts = Vec::with_capacity(count as usize);
        for _ in 0..count {
            parts.push((reader.u64()?, reader.u64()?));
        }
        let condition = LocalCondition::decode(&mut reader)?;
        let bucket = reader.text16(255, "bucket")?.to_string();
        let key = reader.text16(4096, "key")?.to_string();
        reader.finish()?;
        Ok(LocalWriteMemory {
            parts,
            condition,
            bucket,
            key,
        })
    }
}

/// The answer to a WRITE that stored its object: its version and whether it still has to be
/// written back to the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalWriteAnswer {
    pub seq: u64,
    pub bytes: u64,
    pub dirty: bool,
}

impl LocalWriteAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u64(self.seq);
        writer.u64(self.bytes);
        writer.u8(u8::from(self.dirty));
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalWriteAnswer, ProtoError> {
        let mut reader = Reader::new(bytes);
        let answer = LocalWriteAnswer {
            seq: reader.u64()?,
            bytes: reader.u64()?,
            dirty: match reader.u8()? {
                0 => false,
                1 => true,
                _ => {
                    return Err(ProtoError::Malformed(
                        "a WRITE answer's dirty flag is 0 or 1",
                    ))
                }
            },
        };
        reader.finish()?;
        Ok(answer)
    }
}

/// The answer to ALLOCATE (the fd travels beside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRegionInfo {
    pub region: u32,
    pub flags: u32,
    pub bytes: u64,
}

impl LocalRegionInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.region);
        writer.u32(self.flags);
        writer.u64(self.bytes);
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LocalRegionInfo, ProtoError> {
        let mut reader = Reader::new(bytes);
        let info = LocalRegionInfo {
            region: reader.u32()?,
            flags: reader.u32()?,
            bytes: reader.u64()?,
        };
        reader.finish()?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let read = LocalRead {
            region: 3,
            items: vec![LocalReadItem {
                offset: 4096,
                length: 1 << 20,
                range_start: 7,
                range_end: LOCAL_RANGE_TO_END,
                bucket: "b".into(),
                key: "k/1".into(),
            }],
        };
        assert_eq!(LocalRead::decode(&read.encode()).unwrap(), read);
        let answer = LocalReadAnswer {
            items: vec![LocalItemResult {
                status: 0x11,
                object_bytes: 0,
                range_start: 0,
                written: 0,
                message: "not stored".into(),
            }],
        };
        assert_eq!(LocalReadAnswer::decode(&answer.encode()).unwrap(), answer);
        let header = LocalHeader {
            body_len: 12,
            opcode: 1,
            status: 0,
            request_id: 9,
        };
        assert_eq!(LocalHeader::decode(&header.encode()).unwrap(), header);
        let mut long = header.encode();
        long[0..4].copy_from_slice(&(LOCAL_BODY_BYTES_MAX + 1).to_le_bytes());
        assert!(LocalHeader::decode(&long).is_err());
    }
}
