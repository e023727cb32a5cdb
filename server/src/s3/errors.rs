//! The engine's errors as S3 error documents: the code an SDK acts on (retrying SlowDown and
//! ServiceUnavailable with backoff), with the engine's message.

use hydrant_engine::{Error, ErrorKind};
use s3s::{S3Error, S3ErrorCode};

pub(crate) fn s3_error(error: Error) -> S3Error {
    let code = match error.kind() {
        ErrorKind::InvalidKey => S3ErrorCode::InvalidArgument,
        ErrorKind::InvalidRange => S3ErrorCode::InvalidRange,
        ErrorKind::TooLarge => S3ErrorCode::EntityTooLarge,
        ErrorKind::AttributesTooLarge => S3ErrorCode::MetadataTooLarge,
        ErrorKind::Busy => S3ErrorCode::SlowDown,
        ErrorKind::NoSpace
        | ErrorKind::OriginUnavailable
        | ErrorKind::ShuttingDown
        | ErrorKind::Timeout => S3ErrorCode::ServiceUnavailable,
        ErrorKind::ReadOnly | ErrorKind::OriginRefused => S3ErrorCode::AccessDenied,
        ErrorKind::PreconditionFailed => S3ErrorCode::PreconditionFailed,
        _ => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, error.to_string())
}
