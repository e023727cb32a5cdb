//! hydrant-proto: the frames, opcodes and status codes of hydrant's wire protocol, with their
//! encodings. No I/O: the server and the client meet here, and nowhere else.
//!
//! A frame is a fixed 48-byte header ([`FrameHeader`]), an opcode-specific extension (at most
//! [`Limits::extension_bytes_max`], encoded with [`codec`]) and a payload of raw bytes (object
//! data, unframed so that it can go straight to or from a pinned buffer). Every length is checked
//! against the negotiated [`Limits`] before anything is allocated. The byte layout is in
//! docs/protocol.md.

pub mod auth;
pub mod codec;
mod error;
mod frame;
mod limits;
pub mod local;
pub mod local_ring;
pub mod message;
pub mod name;
mod opcode;
mod status;

pub use error::ProtoError;
pub use frame::{
    payload_crc, FrameFlags, FrameHeader, FRAME_HEADER_BYTES, PROTOCOL_MAGIC, PROTOCOL_VERSION,
};
/// CRC32C, as frames use it (the `hydrant-crc` crate).
pub use hydrant_crc as crc;
pub use limits::Limits;
pub use opcode::Opcode;
pub use status::{Status, StatusClass};
