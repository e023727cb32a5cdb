//! Status codes, in classes a client acts on: a client error is not retried, a retriable one is
//! (with backoff), a fatal one means the server cannot serve the request at all.

use crate::ProtoError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    // Client errors: 0x10..=0x3f.
    BadRequest = 0x10,
    NotFound = 0x11,
    InvalidKey = 0x12,
    InvalidRange = 0x13,
    TooLarge = 0x14,
    Unauthenticated = 0x15,
    ReadOnly = 0x16,
    Unsupported = 0x17,
    ChecksumMismatch = 0x18,
    /// The origin refused the request for good (permission, a name it cannot hold).
    OriginRefused = 0x19,
    /// The key is not as a conditional write requires (another version, or present).
    PreconditionFailed = 0x1a,
    // Retriable: 0x40..=0x7f.
    Busy = 0x40,
    OriginUnavailable = 0x41,
    ShuttingDown = 0x42,
    NoSpace = 0x43,
    Timeout = 0x44,
    /// The object changed while a streamed answer was sent (a later frame ends the answer with
    /// it): read it again.
    Changed = 0x45,
    // Fatal: 0x80..=0xff.
    Internal = 0x80,
    DataCorrupt = 0x81,
    StoreFailed = 0x82,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    Success,
    ClientError,
    Retriable,
    Fatal,
}

impl Status {
    pub const ALL: [Status; 21] = [
        Status::Ok,
        Status::BadRequest,
        Status::NotFound,
        Status::InvalidKey,
        Status::InvalidRange,
        Status::TooLarge,
        Status::Unauthenticated,
        Status::ReadOnly,
        Status::Unsupported,
        Status::ChecksumMismatch,
        Status::OriginRefused,
        Status::PreconditionFailed,
        Status::Busy,
        Status::OriginUnavailable,
        Status::ShuttingDown,
        Status::NoSpace,
        Status::Timeout,
        Status::Changed,
        Status::Internal,
        Status::DataCorrupt,
        Status::StoreFailed,
    ];

    pub fn from_byte(byte: u8) -> Result<Status, ProtoError> {
        Status::ALL
            .into_iter()
            .find(|status| *status as u8 == byte)
            .ok_or(ProtoError::Malformed("unknown status code"))
    }

    /// The class follows from the code's range, so a client can act on codes it does not know.
    pub fn class_of(byte: u8) -> StatusClass {
        match byte {
            0 => StatusClass::Success,
            0x01..=0x3f => StatusClass::ClientError,
            0x40..=0x7f => StatusClass::Retriable,
            _ => StatusClass::Fatal,
        }
    }

    pub fn class(self) -> StatusClass {
        Status::class_of(self as u8)
    }

    /// The status to answer a request that failed to decode.
    pub fn for_error(error: &ProtoError) -> Status {
        match error {
            ProtoError::UnsupportedVersion(_) | ProtoError::UnknownOpcode(_) => Status::Unsupported,
            ProtoError::ExtensionTooLong { .. } | ProtoError::PayloadTooLong { .. } => {
                Status::TooLarge
            }
            ProtoError::ExtensionChecksum | ProtoError::PayloadChecksum => Status::ChecksumMismatch,
            ProtoError::InvalidName(_) => Status::InvalidKey,
            _ => Status::BadRequest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_classes_follow_ranges() {
        for status in Status::ALL {
            assert_eq!(Status::from_byte(status as u8), Ok(status));
        }
        assert_eq!(Status::NotFound.class(), StatusClass::ClientError);
        assert_eq!(Status::Busy.class(), StatusClass::Retriable);
        assert_eq!(Status::DataCorrupt.class(), StatusClass::Fatal);
        assert_eq!(Status::class_of(0x3f), StatusClass::ClientError);
        assert_eq!(Status::class_of(0x7e), StatusClass::Retriable);
        assert!(Status::from_byte(0x3f).is_err());
    }
}
