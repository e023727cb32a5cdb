//! Limits negotiated in HELLO: each side states its own, and the smaller of each pair applies.

use crate::codec::{Reader, Writer};
use crate::ProtoError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one frame's extension.
    pub extension_bytes_max: u32,
    /// Bytes of one frame's payload (larger objects are streamed over several frames).
    pub payload_bytes_max: u64,
    /// Requests one connection may have in flight (the client's credits).
    pub requests_in_flight_max: u32,
    /// Items in one BATCH_GET.
    pub batch_items_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            extension_bytes_max: 64 * 1024,
            payload_bytes_max: 16 * 1024 * 1024,
            requests_in_flight_max: 1024,
            batch_items_max: 4096,
        }
    }
}

/// Bounds no negotiation can exceed.
const EXTENSION_BYTES_CEILING: u32 = 1024 * 1024;
const PAYLOAD_BYTES_CEILING: u64 = 1 << 30;

impl Limits {
    /// The limits both sides accept.
    pub fn negotiate(&self, other: &Limits) -> Limits {
        Limits {
            extension_bytes_max: self.extension_bytes_max.min(other.extension_bytes_max),
            payload_bytes_max: self.payload_bytes_max.min(other.payload_bytes_max),
            requests_in_flight_max: self
                .requests_in_flight_max
                .min(other.requests_in_flight_max),
            batch_items_max: self.batch_items_max.min(other.batch_items_max),
        }
    }

    pub(crate) fn encode(&self, writer: &mut Writer) {
        writer.u32(self.extension_bytes_max);
        writer.u64(self.payload_bytes_max);
        writer.u32(self.requests_in_flight_max);
        writer.u32(self.batch_items_max);
    }

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<Limits, ProtoError> {
        let limits = Limits {
            extension_bytes_max: reader.u32()?,
            payload_bytes_max: reader.u64()?,
            requests_in_flight_max: reader.u32()?,
            batch_items_max: reader.u32()?,
        };
        let sane = (1024..=EXTENSION_BYTES_CEILING).contains(&limits.extension_bytes_max)
            && (4096..=PAYLOAD_BYTES_CEILING).contains(&limits.payload_bytes_max)
            && limits.requests_in_flight_max >= 1
            && limits.batch_items_max >= 1;
        if !sane {
            return Err(ProtoError::Malformed("limits out of range"));
        }
        Ok(limits)
    }
}
