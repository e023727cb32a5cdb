//! How a client connects, waits and retries: a builder with a documented default on every
//! option.

use std::time::Duration;

/// Default: how long to wait for a TCP connection and its HELLO exchange.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default: how long to wait for the next frame of an answer (or for the socket to take ours).
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default: retries after the first attempt, so at most five attempts.
pub const RETRIES_MAX_DEFAULT: u32 = 4;
/// Default: the wait before the first retry; it doubles for each one after.
pub const BACKOFF_INITIAL_DEFAULT: Duration = Duration::from_millis(20);
/// Default: the longest wait between two attempts.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(2);
/// Default: no retry starts later than this after the call began.
pub const RETRY_DEADLINE_DEFAULT: Duration = Duration::from_secs(60);
/// Default: connections kept open to one node at most.
pub const CONNECTIONS_PER_NODE_MAX_DEFAULT: usize = 8;

/// A client's settings. Every option has a default (the constants above); change the ones you
/// need: `ClientConfig::new(servers).request_timeout(Duration::from_secs(5)).retries_max(2)`.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub(crate) servers: Vec<String>,
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) retries_max: u32,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) retry_deadline: Duration,
    pub(crate) max_connections_per_node: usize,
    pub(crate) shard_aware: bool,
}

impl ClientConfig {
    /// The defaults, for the servers `servers` (addresses `host:port`; keys are placed on them
    /// by rendezvous hashing).
    pub fn new(servers: &[String]) -> ClientConfig {
        ClientConfig {
            servers: servers.to_vec(),
            token: None,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            retries_max: RETRIES_MAX_DEFAULT,
            backoff_initial: BACKOFF_INITIAL_DEFAULT,
            backoff_max: BACKOFF_MAX_DEFAULT,
            retry_deadline: RETRY_DEADLINE_DEFAULT,
            max_connections_per_node: CONNECTIONS_PER_NODE_MAX_DEFAULT,
            shard_aware: true,
        }
    }

    /// The shared token, for servers that ask for a proof of it (default: none).
    pub fn token(mut self, token: Option<&[u8]>) -> ClientConfig {
        self.token = token.map(<[u8]>::to_vec);
        self
    }

    /// How long to wait for a connection and its HELLO (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientConfig {
        self.connect_timeout = timeout;
        self
    }

    /// How long a request waits for each frame of its answer, and for the socket to take each
    /// of its frames (default 30 s). It bounds the silence, not the whole transfer, so that a
    /// 1 GiB object on a slow link is not cut off while its bytes still flow.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientConfig {
        self.request_timeout = timeout;
        self
    }

    /// Retries of a request that got a retriable status (BUSY, ORIGIN_UNAVAILABLE,
    /// SHUTTING_DOWN, NO_SPACE, TIMEOUT) or lost its connection (default 4; 0: none).
    pub fn retries_max(mut self, retries: u32) -> ClientConfig {
        self.retries_max = retries;
        self
    }

    /// The wait before the first retry (default 20 ms), doubled for each one after, at most
    /// `maximum` (default 2 s). Each wait is drawn between half and all of that, so that
    /// clients that failed together do not retry together.
    pub fn backoff(mut self, initial: Duration, maximum: Duration) -> ClientConfig {
        self.backoff_initial = initial;
        self.backoff_max = maximum.max(initial);
        self
    }

    /// No retry starts later than this after the call began (default 60 s); the last error is
    /// returned instead.
    pub fn retry_deadline(mut self, deadline: Duration) -> ClientConfig {
        self.retry_deadline = deadline;
        self
    }

    /// Connections kept open to one node at most (default 8, at least 1). Blocking callers
    /// each take one for a request; async callers share them, many requests on each.
    pub fn max_connections_per_node(mut self, connections: usize) -> ClientConfig {
        self.max_connections_per_node = connections.max(1);
        self
    }

    /// Send single-key requests to the owning shard's own port when a node offers them in
    /// HELLO (default on; docs/protocol.md, "The shard-aware path"). The shard pools of a node
    /// together hold about `max_connections_per_node` connections, beside the node's own.
    pub fn shard_aware(mut self, shard_aware: bool) -> ClientConfig {
        self.shard_aware = shard_aware;
        self
    }
}
