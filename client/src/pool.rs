//! Blocking connections to one node, pooled: a caller takes one for a request (or a pipelined
//! batch) and gives it back; at most `max_connections_per_node` are open at once.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::connection::Connection;
use crate::error::{ClientError, Result};

pub(crate) struct NodePool {
    pub(crate) address: String,
    token: Option<Vec<u8>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    connections_max: usize,
    state: Mutex<PoolState>,
    /// Signalled when a connection is given back or closed.
    returned: Condvar,
    /// The shard-aware path: a pool per shard of this node, on the ports its HELLO told, set
    /// from the first connection opened (`None` when the node offers none). Shard pools have
    /// none of their own.
    shards: OnceLock<Option<ShardPools>>,
    shard_aware: bool,
}

pub(crate) struct ShardPools {
    placement_hash: u32,
    pools: Vec<NodePool>,
}

struct PoolState {
    /// Connections nobody uses, the most recently used last.
    idle: Vec<Connection>,
    /// Connections open or being opened, idle or in use.
    open: usize,
}

/// A connection taken from a pool; it goes back when dropped, or is closed when broken.
pub(crate) struct PooledConnection<'a> {
    pool: &'a NodePool,
    connection: Option<Connection>,
}

impl NodePool {
    pub(crate) fn new(
        address: &str,
        token: Option<&[u8]>,
        connect_timeout: Duration,
        request_timeout: Duration,
        connections_max: usize,
    ) -> NodePool {
        assert!(connections_max >= 1);
        NodePool {
            address: address.to_string(),
            token: token.map(<[u8]>::to_vec),
            connect_timeout,
            request_timeout,
            connections_max,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            returned: Condvar::new(),
            shards: OnceLock::new(),
            shard_aware: true,
        }
    }

    /// The pool of the shard that owns (bucket, key) on this node, when the node offered
    /// shard ports and a connection to it has been opened (`warm` opens one).
    pub(crate) fn shard_pool(&self, bucket: &str, key: &str) -> Option<&NodePool> {
        let shards = self.shards.get()?.as_ref()?;
        let shard = crate::placement::shard_for(
            shards.placement_hash,
            shards.pools.len() as u16,
            bucket,
            key,
        )?;
        shards.pools.get(shard)
    }

    /// Learn the node's shard ports from a connection's HELLO, once.
    fn learn_shards(&self, connection: &Connection) {
        if !self.shard_aware || self.shards.get().is_some() {
            return;
        }
        let shards = (connection.shard_ports.len() == connection.shard_count as usize
            && !connection.shard_ports.is_empty())
        .then(|| {
            // The same host, the shard's port: "host:port" or "[v6]:port".
            let host = self
                .address
                .rsplit_once(':')
                .map_or(self.address.as_str(), |(host, _)| host);
            ShardPools {
                placement_hash: connection.placement_hash,
                pools: connection
                    .shard_ports
                    .iter()
                    .map(|port| {
                        let mut pool = NodePool::new(
                            &format!("{host}:{port}"),
                            self.token.as_deref(),
                            self.connect_timeout,
                            self.request_timeout,
                            self.connections_max,
                        );
                        pool.shard_aware = false;
                        pool
                    })
                    .collect(),
            }
        });
        let _ = self.shards.set(shards);
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves a consistent state (it only moves values in
        // and out), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// An idle connection, a new one when all are busy and fewer than the maximum are open, or
    /// else the first one given back (waiting at most the request timeout).
    pub(crate) fn take(&self) -> Result<PooledConnection<'_>> {
        let deadline = Instant::now() + self.request_timeout;
        let mut state = self.lock();
        loop {
            if let Some(connection) = state.idle.pop() {
                return Ok(self.pooled(connection));
            }
            if state.open < self.connections_max {
                state.open += 1;
                drop(state);
                return match self.open_connection() {
                    Ok(connection) => {
                        self.learn_shards(&connection);
                        Ok(self.pooled(connection))
                    }
                    Err(error) => {
                        self.closed();
                        Err(error)
                    }
                };
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(ClientError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "{}: all {} connections stayed busy",
                        self.address, self.connections_max
                    ),
                )));
            }
            state = self
                .returned
                .wait_timeout(state, wait)
                .unwrap_or_else(|poison| poison.into_inner())
                .0;
        }
    }

    fn open_connection(&self) -> Result<Connection> {
        Connection::open(
            &self.address,
            self.token.as_deref(),
            self.connect_timeout,
            self.request_timeout,
        )
        .map_err(|error| error.at(&self.address))
    }

    /// Open a connection now and keep it idle, so that a bad address fails at connect time.
    pub(crate) fn warm(&self) -> Result<()> {
        self.take().map(drop)
    }

    fn pooled(&self, connection: Connection) -> PooledConnection<'_> {
        PooledConnection {
            pool: self,
            connection: Some(connection),
        }
    }

    fn give_back(&self, connection: Connection) {
        if connection.broken {
            // A connection broke, most likely because the server went away: the idle ones are
            // probably dead too, and a retry on one of them would fail again.
            let mut state = self.lock();
            let stale = state.idle.len();
            state.idle.clear();
            state.open -= 1 + stale;
        } else {
            self.lock().idle.push(connection);
        }
        self.returned.notify_all();
    }

    fn closed(&self) {
        self.lock().open -= 1;
        self.returned.notify_all();
    }
}

impl PooledConnection<'_> {
    /// The address of the pool it came from.
    pub(crate) fn pool_address(&self) -> &str {
        &self.pool.address
    }
}

impl Deref for PooledConnection<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection.as_ref().expect("held until dropped")
    }
}

impl DerefMut for PooledConnection<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.connection.as_mut().expect("held until dropped")
    }
}

impl Drop for PooledConnection<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.pool.give_back(connection);
        }
    }
}
