//! Why bytes on the wire were refused. Each maps to a status the peer is told (or, when the
//! stream cannot be trusted any more, to closing the connection).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the structure needs.
    Truncated {
        needed: usize,
        available: usize,
    },
    /// Not a hydrant frame: the stream is out of sync and must be closed.
    BadMagic([u8; 4]),
    /// The header does not match its checksum: the stream must be closed.
    HeaderChecksum,
    UnsupportedVersion(u8),
    UnknownOpcode(u8),
    /// A field the peer must leave zero was not.
    ReservedNotZero,
    ExtensionTooLong {
        bytes: u32,
        max: u32,
    },
    PayloadTooLong {
        bytes: u64,
        max: u64,
    },
    ExtensionChecksum,
    PayloadChecksum,
    /// A well-framed extension whose contents are invalid.
    Malformed(&'static str),
    /// A bucket, key or prefix outside the grammar of `name`.
    InvalidName(crate::name::NameError),
}

impl ProtoError {
    /// True when the byte stream can no longer be trusted to be in sync: the connection closes.
    pub fn is_fatal_to_connection(&self) -> bool {
        matches!(
            self,
            ProtoError::BadMagic(_)
                | ProtoError::HeaderChecksum
                | ProtoError::UnsupportedVersion(_)
                | ProtoError::ExtensionTooLong { .. }
                | ProtoError::PayloadTooLong { .. }
        )
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Truncated { needed, available } => {
                write!(
                    formatter,
                    "truncated: {needed} bytes needed, {available} available"
                )
            }
            ProtoError::BadMagic(magic) => {
                write!(formatter, "not a hydrant frame (magic {magic:02x?})")
            }
            ProtoError::HeaderChecksum => write!(formatter, "frame header checksum mismatch"),
            ProtoError::UnsupportedVersion(version) => {
                write!(formatter, "protocol version {version} is not supported")
            }
            ProtoError::UnknownOpcode(opcode) => write!(formatter, "unknown opcode {opcode}"),
            ProtoError::ReservedNotZero => write!(formatter, "a reserved field is not zero"),
            ProtoError::ExtensionTooLong { bytes, max } => {
                write!(
                    formatter,
                    "extension of {bytes} bytes exceeds the limit of {max}"
                )
            }
            ProtoError::PayloadTooLong { bytes, max } => {
                write!(
                    formatter,
                    "payload of {bytes} bytes exceeds the limit of {max}"
                )
            }
            ProtoError::ExtensionChecksum => write!(formatter, "extension checksum mismatch"),
            ProtoError::PayloadChecksum => write!(formatter, "payload checksum mismatch"),
            ProtoError::Malformed(what) => write!(formatter, "malformed request: {what}"),
            ProtoError::InvalidName(error) => write!(formatter, "invalid name: {error}"),
        }
    }
}

impl std::error::Error for ProtoError {}
