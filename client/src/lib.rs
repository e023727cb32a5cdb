//! hydrant-client: blocking and async clients for hydrant servers.
//!
//! - [`SharedClient`] (blocking, cloneable, `Send + Sync`) keeps a bounded pool of connections
//!   per node, so threads sharing it use several; [`Client`] is the same behind `&mut self`.
//! - [`Pipeline`] sends many GET/PUT/HEAD requests on one connection before reading any answer;
//!   answers come in any order and are matched by request id.
//! - [`AsyncClient`] (feature `async`, on by default) does the same operations on tokio: every
//!   request is pipelined on a pooled connection whose background task matches answers to
//!   requests by id.
//! - Requests that get a retriable status (BUSY, ORIGIN_UNAVAILABLE, SHUTTING_DOWN, NO_SPACE,
//!   TIMEOUT) or lose their connection are retried with exponential backoff and jitter, within
//!   [`ClientConfig`]'s `retries_max` and `retry_deadline`. Every operation is idempotent in
//!   hydrant (a PUT writes the same bytes to the same key again), so all are retried but FLUSH,
//!   whose timeout is the caller's.
//! - `get_into` reads an object into the caller's buffer.
//!
//! Keys are placed on nodes by rendezvous hashing ([`node_for`]).

#[cfg(feature = "async")]
mod asynchronous;
mod blocking;
mod config;
mod connection;
pub mod cuda;
mod error;
mod frames;
pub mod local;
mod nodes;
mod pipeline;
mod placement;
mod pool;
mod retry;

#[cfg(feature = "async")]
pub use asynchronous::AsyncClient;
pub use blocking::{Client, SharedClient};
pub use config::{
    ClientConfig, BACKOFF_INITIAL_DEFAULT, BACKOFF_MAX_DEFAULT, CONNECTIONS_PER_NODE_MAX_DEFAULT,
    CONNECT_TIMEOUT_DEFAULT, REQUEST_TIMEOUT_DEFAULT, RETRIES_MAX_DEFAULT, RETRY_DEADLINE_DEFAULT,
};
pub use error::{ClientError, Result};
pub use frames::Progress;
pub use hydrant_proto::message::{ListEntry, ObjectInfo};
pub use pipeline::Pipeline;
pub use placement::node_for;

/// One item of a batch get: a key and an optional range (`start`, exclusive `end`).
#[derive(Clone, Debug)]
pub struct GetItem {
    pub bucket: String,
    pub key: String,
    pub range: Option<(u64, Option<u64>)>,
}

/// One item's outcome in a batch.
pub type ItemResult = Result<(ObjectInfo, Vec<u8>)>;
