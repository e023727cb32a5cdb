//! The engine's one error type: a kind that callers act on, plus context that humans read.

use std::fmt;
use std::io;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bucket name or key that the engine does not accept.
    InvalidKey,
    /// A byte range outside the object, or otherwise malformed.
    InvalidRange,
    /// An object larger than the engine accepts.
    TooLarge,
    /// An object's attributes (its headers, user metadata) larger than the engine keeps.
    AttributesTooLarge,
    /// A configuration value out of bounds.
    InvalidConfig,
    /// The device is smaller than one usable layout.
    DeviceTooSmall,
    /// The device's size is not a multiple of its direct-I/O alignment, or the alignment is
    /// larger than the format's block.
    DeviceMisaligned,
    /// The device holds a hydrant store with another geometry (region size, shard count, ...).
    GeometryMismatch,
    /// The device holds data that is not a hydrant store.
    ForeignDevice,
    /// Stored bytes do not match their checksum.
    ChecksumMismatch,
    /// No space is left that can be reclaimed (everything left is pinned).
    NoSpace,
    /// An earlier I/O error stopped the store from accepting writes until it is reopened.
    StoreFailed,
    /// The engine is stopping or stopped.
    ShuttingDown,
    /// An operating-system I/O error.
    Io,
    /// The origin refused the request for good (no permission, a name it cannot hold, a request
    /// it rejects): retrying the same request will not help.
    OriginRefused,
    /// The origin could not be reached or answered with an error; retriable.
    OriginUnavailable,
    /// The bucket's origin is read-only.
    ReadOnly,
    /// The dirty-byte budget stayed full for longer than a writer may wait; retriable.
    Busy,
    /// A wait (FLUSH) ran past its deadline.
    Timeout,
    /// A conditional write found the key not as its condition requires.
    PreconditionFailed,
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<io::Error>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            context: context.into(),
            source: Some(source),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn context(&self) -> &str {
        &self.context
    }
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(formatter, "{}: {source}", self.context),
            None => write!(formatter, "{}", self.context),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|source| source as _)
    }
}
