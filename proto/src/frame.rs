//! The frame header: 48 bytes, little-endian.
//!
//! ```text
//! offset size field
//!      0    4 magic "HYDP"
//!      4    1 version             1
//!      5    1 flags               bit 0 response, bit 1 more frames follow (streaming),
//!                                 bit 2 answer a batch in request order; other bits zero
//!      6    1 opcode
//!      7    1 status              0 in requests
//!      8    8 request_id          chosen by the client, echoed in every response frame
//!     16    4 extension_len       opcode-specific bytes after the header
//!     20    2 shard               the shard the client addressed (0xffff: any)
//!     22    2 reserved            0
//!     24    8 payload_len         raw bytes after the extension
//!     32    4 extension_crc32c    of the extension (0 when extension_len is 0)
//!     36    4 payload_crc32c      of the payload (0 when payload_len is 0)
//!     40    4 reserved            0
//!     44    4 header_crc32c       of bytes 0..44
//! ```

use crate::{Limits, Opcode, ProtoError};

pub const FRAME_HEADER_BYTES: usize = 48;
pub const PROTOCOL_MAGIC: [u8; 4] = *b"HYDP";
pub const PROTOCOL_VERSION: u8 = 1;
/// The shard field of a frame that may go to any shard.
pub const ANY_SHARD: u16 = 0xffff;

const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + 4;
const FLAGS_OFFSET: usize = VERSION_OFFSET + 1;
const OPCODE_OFFSET: usize = FLAGS_OFFSET + 1;
const STATUS_OFFSET: usize = OPCODE_OFFSET + 1;
const REQUEST_ID_OFFSET: usize = STATUS_OFFSET + 1;
const EXTENSION_LEN_OFFSET: usize = REQUEST_ID_OFFSET + 8;
const SHARD_OFFSET: usize = EXTENSION_LEN_OFFSET + 4;
const RESERVED_A_OFFSET: usize = SHARD_OFFSET + 2;
const PAYLOAD_LEN_OFFSET: usize = RESERVED_A_OFFSET + 2;
const EXTENSION_CRC_OFFSET: usize = PAYLOAD_LEN_OFFSET + 8;
const PAYLOAD_CRC_OFFSET: usize = EXTENSION_CRC_OFFSET + 4;
const RESERVED_B_OFFSET: usize = PAYLOAD_CRC_OFFSET + 4;
const HEADER_CRC_OFFSET: usize = RESERVED_B_OFFSET + 4;
const _: () = assert!(HEADER_CRC_OFFSET + 4 == FRAME_HEADER_BYTES);

/// Flag bits of a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameFlags(u8);

impl FrameFlags {
    pub const RESPONSE: FrameFlags = FrameFlags(1);
    /// More frames of this request or response follow (a streamed PUT or GET).
    pub const MORE: FrameFlags = FrameFlags(2);
    /// Answer a BATCH_GET's items in request order rather than as they complete.
    pub const IN_ORDER: FrameFlags = FrameFlags(4);
    const KNOWN: u8 = 7;

    pub const fn empty() -> FrameFlags {
        FrameFlags(0)
    }

    pub fn contains(self, other: FrameFlags) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, other: FrameFlags) -> FrameFlags {
        FrameFlags(self.0 | other.0)
    }

    pub fn bits(self) -> u8 {
        self.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub flags: FrameFlags,
    pub opcode: Opcode,
    /// The raw status byte: 0 in requests. Kept raw so that a client can classify codes it does
    /// not know (see `Status::class_of`).
    pub status: u8,
    pub request_id: u64,
    pub extension_len: u32,
    pub shard: u16,
    pub payload_len: u64,
    pub extension_crc: u32,
    pub payload_crc: u32,
}

impl FrameHeader {
    /// A header for `extension` and a payload of `payload_len` bytes whose CRC32C is
    /// `payload_crc` (the payload may be sent later, from a pinned buffer).
    pub fn new(
        opcode: Opcode,
        request_id: u64,
        extension: &[u8],
        payload_len: u64,
        payload_crc: u32,
    ) -> FrameHeader {
        FrameHeader {
            flags: FrameFlags::empty(),
            opcode,
            status: 0,
            request_id,
            extension_len: u32::try_from(extension.len()).expect("extension under 4 GiB"),
            shard: ANY_SHARD,
            payload_len,
            extension_crc: if extension.is_empty() {
                0
            } else {
                crate::crc::crc32c(extension)
            },
            payload_crc,
        }
    }

    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&PROTOCOL_MAGIC);
        bytes[VERSION_OFFSET] = PROTOCOL_VERSION;
        bytes[FLAGS_OFFSET] = self.flags.bits();
        bytes[OPCODE_OFFSET] = self.opcode as u8;
        bytes[STATUS_OFFSET] = self.status;
        bytes[REQUEST_ID_OFFSET..REQUEST_ID_OFFSET + 8]
            .copy_from_slice(&self.request_id.to_le_bytes());
        bytes[EXTENSION_LEN_OFFSET..EXTENSION_LEN_OFFSET + 4]
            .copy_from_slice(&self.extension_len.to_le_bytes());
        bytes[SHARD_OFFSET..SHARD_OFFSET + 2].copy_from_slice(&self.shard.to_le_bytes());
        bytes[PAYLOAD_LEN_OFFSET..PAYLOAD_LEN_OFFSET + 8]
            .copy_from_slice(&self.payload_len.to_le_bytes());
        bytes[EXTENSION_CRC_OFFSET..EXTENSION_CRC_OFFSET + 4]
            .copy_from_slice(&self.extension_crc.to_le_bytes());
        bytes[PAYLOAD_CRC_OFFSET..PAYLOAD_CRC_OFFSET + 4]
            .copy_from_slice(&self.payload_crc.to_le_bytes());
        let header_crc = crate::crc::crc32c(&bytes[..HEADER_CRC_OFFSET]);
        bytes[HEADER_CRC_OFFSET..].copy_from_slice(&header_crc.to_le_bytes());
        bytes
    }

    /// Decode and check a header against `limits`, before anything it announces is read or
    /// allocated. The lengths are checked before the reserved fields and the opcode, so that a
    /// header refused for those still announces lengths within the limits. `bytes` may be longer
    /// than a header; only the first 48 bytes are used.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<FrameHeader, ProtoError> {
        if bytes.len() < FRAME_HEADER_BYTES {
            return Err(ProtoError::Truncated {
                needed: FRAME_HEADER_BYTES,
                available: bytes.len(),
            });
        }
        let bytes = &bytes[..FRAME_HEADER_BYTES];
        let magic: [u8; 4] = field(bytes, MAGIC_OFFSET);
        if magic != PROTOCOL_MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        if !header_checksum_ok(bytes) {
            return Err(ProtoError::HeaderChecksum);
        }
        if bytes[VERSION_OFFSET] != PROTOCOL_VERSION {
            return Err(ProtoError::UnsupportedVersion(bytes[VERSION_OFFSET]));
        }
        // Lengths first: every error after this point leaves a header whose announced lengths
        // are within the limits, so a receiver may skip them and go on.
        let extension_len = u32::from_le_bytes(field(bytes, EXTENSION_LEN_OFFSET));
        if extension_len > limits.extension_bytes_max {
            return Err(ProtoError::ExtensionTooLong {
                bytes: extension_len,
                max: limits.extension_bytes_max,
            });
        }
        let payload_len = u64::from_le_bytes(field(bytes, PAYLOAD_LEN_OFFSET));
        if payload_len > limits.payload_bytes_max {
            return Err(ProtoError::PayloadTooLong {
                bytes: payload_len,
                max: limits.payload_bytes_max,
            });
        }
        let flags = bytes[FLAGS_OFFSET];
        let reserved_a = u16::from_le_bytes(field(bytes, RESERVED_A_OFFSET));
        let reserved_b = u32::from_le_bytes(field(bytes, RESERVED_B_OFFSET));
        if flags & !FrameFlags::KNOWN != 0 || reserved_a != 0 || reserved_b != 0 {
            return Err(ProtoError::ReservedNotZero);
        }
        let opcode = Opcode::from_byte(bytes[OPCODE_OFFSET])?;
        Ok(FrameHeader {
            flags: FrameFlags(flags),
            opcode,
            status: bytes[STATUS_OFFSET],
            request_id: u64::from_le_bytes(field(bytes, REQUEST_ID_OFFSET)),
            extension_len,
            shard: u16::from_le_bytes(field(bytes, SHARD_OFFSET)),
            payload_len,
            extension_crc: u32::from_le_bytes(field(bytes, EXTENSION_CRC_OFFSET)),
            payload_crc: u32::from_le_bytes(field(bytes, PAYLOAD_CRC_OFFSET)),
        })
    }

    /// The request id and lengths of a header whose checksum is valid but which was refused for
    /// its contents (an unknown opcode, say): enough to answer it and skip what follows. `None`
    /// when the header itself cannot be trusted.
    pub fn salvage(bytes: &[u8]) -> Option<(u64, u32, u64)> {
        if bytes.len() < FRAME_HEADER_BYTES
            || bytes[..4] != PROTOCOL_MAGIC
            || !header_checksum_ok(bytes)
        {
            return None;
        }
        Some((
            u64::from_le_bytes(field(bytes, REQUEST_ID_OFFSET)),
            u32::from_le_bytes(field(bytes, EXTENSION_LEN_OFFSET)),
            u64::from_le_bytes(field(bytes, PAYLOAD_LEN_OFFSET)),
        ))
    }

    /// A response header answering `request` with `status`.
    pub fn response(
        request: &FrameHeader,
        status: u8,
        extension: &[u8],
        payload: &[u8],
    ) -> FrameHeader {
        let mut header = FrameHeader::new(
            request.opcode,
            request.request_id,
            extension,
            payload.len() as u64,
            if payload.is_empty() {
                0
            } else {
                crate::crc::crc32c(payload)
            },
        );
        header.flags = FrameFlags::RESPONSE;
        header.status = status;
        header.shard = request.shard;
        header
    }

    /// Check an extension read after this header.
    pub fn check_extension(&self, extension: &[u8]) -> Result<(), ProtoError> {
        assert_eq!(extension.len(), self.extension_len as usize);
        let crc = if extension.is_empty() {
            0
        } else {
            crate::crc::crc32c(extension)
        };
        if crc != self.extension_crc {
            return Err(ProtoError::ExtensionChecksum);
        }
        Ok(())
    }

    /// Check the extension and the payload read after this header.
    pub fn check_body(&self, extension: &[u8], payload: &[u8]) -> Result<(), ProtoError> {
        self.check_extension(extension)?;
        self.check_payload_crc(payload_crc(payload))
    }

    /// Check a whole payload (or the CRC32C the receiver computed while streaming it in).
    pub fn check_payload_crc(&self, crc: u32) -> Result<(), ProtoError> {
        let expected = if self.payload_len == 0 {
            0
        } else {
            self.payload_crc
        };
        if crc != expected {
            return Err(ProtoError::PayloadChecksum);
        }
        Ok(())
    }
}

/// The `N` bytes of a header field at `offset`.
fn field<const N: usize>(bytes: &[u8], offset: usize) -> [u8; N] {
    bytes[offset..offset + N]
        .try_into()
        .expect("the field lies inside the header")
}

/// The header's own checksum (its last four bytes) matches the bytes before it.
fn header_checksum_ok(bytes: &[u8]) -> bool {
    crate::crc::crc32c(&bytes[..HEADER_CRC_OFFSET])
        == u32::from_le_bytes(field(bytes, HEADER_CRC_OFFSET))
}

/// The CRC32C a header carries for `payload` (0 for an empty one).
pub fn payload_crc(payload: &[u8]) -> u32 {
    if payload.is_empty() {
        0
    } else {
        crate::crc::crc32c(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        let mut header =
            FrameHeader::new(Opcode::Put, 42, b"extension", 5, crc32c::crc32c(b"hello"));
        header.flags = FrameFlags::MORE;
        header.shard = 3;
        header
    }

    #[test]
    fn round_trips() {
        let limits = Limits::default();
        let header = sample();
        let decoded = FrameHeader::decode(&header.encode(), &limits).unwrap();
        assert_eq!(decoded, header);
        decoded.check_extension(b"extension").unwrap();
        assert_eq!(
            decoded.check_extension(b"extensioN"),
            Err(ProtoError::ExtensionChecksum)
        );
        decoded.check_payload_crc(crc32c::crc32c(b"hello")).unwrap();
        assert_eq!(
            decoded.check_payload_crc(1),
            Err(ProtoError::PayloadChecksum)
        );
    }

    #[test]
    fn refuses_every_malformed_header() {
        let limits = Limits::default();
        let bytes = sample().encode();
        assert!(matches!(
            FrameHeader::decode(&bytes[..47], &limits),
            Err(ProtoError::Truncated { .. })
        ));
        let mut magic = bytes;
        magic[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&magic, &limits),
            Err(ProtoError::BadMagic(_))
        ));
        for position in 4..44 {
            let mut flipped = bytes;
            flipped[position] ^= 0x10;
            assert_eq!(
                FrameHeader::decode(&flipped, &limits),
                Err(ProtoError::HeaderChecksum),
                "flip at {position}"
            );
        }
        let reseal = |mut raw: [u8; FRAME_HEADER_BYTES]| {
            let crc = crc32c::crc32c(&raw[..HEADER_CRC_OFFSET]);
            raw[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
            raw
        };
        let mut version = bytes;
        version[VERSION_OFFSET] = 2;
        assert_eq!(
            FrameHeader::decode(&reseal(version), &limits),
            Err(ProtoError::UnsupportedVersion(2))
        );
        let mut opcode = bytes;
        opcode[OPCODE_OFFSET] = 200;
        assert_eq!(
            FrameHeader::decode(&reseal(opcode), &limits),
            Err(ProtoError::UnknownOpcode(200))
        );
        let mut flags = bytes;
        flags[FLAGS_OFFSET] = 0x80;
        assert_eq!(
            FrameHeader::decode(&reseal(flags), &limits),
            Err(ProtoError::ReservedNotZero)
        );
        let mut payload = bytes;
        payload[PAYLOAD_LEN_OFFSET..PAYLOAD_LEN_OFFSET + 8]
            .copy_from_slice(&(limits.payload_bytes_max + 1).to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&reseal(payload), &limits),
            Err(ProtoError::PayloadTooLong { .. })
        ));
        let mut extension = bytes;
        extension[EXTENSION_LEN_OFFSET..EXTENSION_LEN_OFFSET + 4]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&reseal(extension), &limits),
            Err(ProtoError::ExtensionTooLong { .. })
        ));
    }
}
