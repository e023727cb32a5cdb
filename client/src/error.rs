//! The client's one error type: a kind the caller can act on, with a message for humans.

use std::fmt;
use std::io;

use hydrant_proto::{ProtoError, Status, StatusClass};

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered with a status other than OK; `message` is its reason.
    Status { status: u8, message: String },
    /// The connection failed (refused, reset, closed, or no answer within the request timeout).
    Io(io::Error),
    /// The server sent bytes that are not a valid answer; the connection was closed.
    Protocol(ProtoError),
    /// Bad input caught before anything was sent.
    Usage(String),
    /// `get_into`'s buffer cannot hold the answer: `needed` bytes, `capacity` given. Nothing was
    /// copied into it.
    BufferTooSmall { needed: u64, capacity: usize },
    /// The caller's reader or writer failed (a streamed put's source, a streamed get's
    /// destination), or a stream broke off after some of its bytes were written: not retried.
    Local(io::Error),
}

impl ClientError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Status { status, .. } if *status == Status::NotFound as u8)
    }

    /// Worth retrying (a retriable status, or a broken connection).
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Status { status, .. } => {
                Status::class_of(*status) == StatusClass::Retriable
            }
            ClientError::Io(_) => true,
            _ => false,
        }
    }

    /// The error an answer with a status other than OK stands for; its payload is the reason.
    pub(crate) fn from_answer(status: u8, payload: &[u8]) -> ClientError {
        ClientError::Status {
            status,
            message: String::from_utf8_lossy(payload).into_owned(),
        }
    }

    /// The same error, with the server's address in an I/O error's message.
    pub(crate) fn at(self, address: &str) -> ClientError {
        match self {
            ClientError::Io(error) => {
                ClientError::Io(io::Error::new(error.kind(), format!("{address}: {error}")))
            }
            other => other,
        }
    }

    /// An I/O or protocol error leaves a connection's byte stream out of step: it is closed.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(self, ClientError::Io(_) | ClientError::Protocol(_))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Status { status, message } => {
                let name = Status::from_byte(*status)
                    .map(|status| format!("{status:?}"))
                    .unwrap_or(format!("status {status:#x}"));
                write!(formatter, "{name}: {message}")
            }
            ClientError::Io(error) => write!(formatter, "{error}"),
            ClientError::Protocol(error) => write!(formatter, "protocol error: {error}"),
            ClientError::Usage(message) => write!(formatter, "{message}"),
            ClientError::BufferTooSmall { needed, capacity } => write!(
                formatter,
                "the answer has {needed} bytes, the buffer holds {capacity}"
            ),
            ClientError::Local(error) => write!(formatter, "{error}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        ClientError::Io(error)
    }
}

impl From<ProtoError> for ClientError {
    fn from(error: ProtoError) -> Self {
        ClientError::Protocol(error)
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
