//! Blocking connections to one node, pooled: a caller takes one for a request (or a pipelined
//! batch) and gives it back; at most `max_connections_per_node` are open at once.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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
    /// The shard-aware path: a pool per shard of this node, on the ports its HELLO told, learnt
    /// from a connection opened (`Some(None)` when the node offers none; `None` before, and
    /// again after a shard's connection broke: a restarted server has new ports). Shard pools
    /// have none of their own.
    shards: Mutex<Option<Option<Arc<ShardPools>>>>,
    shard_aware: bool,
}

pub(crate) struct ShardPools {
    placement_hash: u32,
    pools: Vec<NodePool>,
}

impl ShardPools {
    /// The shard that owns (bucket, key).
    pub(crate) fn shard_for(&self, bucket: &str, key: &str) -> Option<usize> {
        crate::placement::shard_for(self.placement_hash, self.pools.len() as u16, bucket, key)
    }

    /// The pool of shard `shard`.
    pub(crate) fn pool(&self, shard: usize) -> Option<&NodePool> {
        self.pools.get(shard)
    }
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
    /// Turn the shard-aware path off for this node (its single-key requests then use the
    /// node's own connections).
    pub(crate) fn without_shard_ports(mut self) -> NodePool {
        self.shard_aware = false;
        self
    }

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
            shards: Mutex::new(None),
            shard_aware: true,
        }
    }

    /// This node's shard pools, when it offered shard ports and a connection to it has been
    /// opened since they were last forgotten (`warm` opens one).
    pub(crate) fn shard_pools(&self) -> Option<Arc<ShardPools>> {
        self.shards
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
            .flatten()
    }

    /// Forget the shard ports and close the idle connections (a connection broke: the server
    /// may have restarted, on new ports); the next connection opened learns them again.
    pub(crate) fn forget_shards(&self) {
        *self
            .shards
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = None;
        let mut state = self.lock();
        let stale = state.idle.len();
        state.idle.clear();
        state.open -= stale;
        drop(state);
        self.returned.notify_all();
    }

    /// Stop using the shard ports (one could not be reached: a firewall, NAT, a container that
    /// publishes only the main port) until a connection to the node breaks.
    pub(crate) fn disable_shards(&self) {
        *self
            .shards
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(None);
    }

    /// A connection for requests of one shard of this node: from `shard`'s own pool when there
    /// is one with a connection free or room for one, else (every connection to the shard busy,
    /// or the shard's port unreachable, which turns the shard ports off for the node) one of
    /// the node's own.
    pub(crate) fn take_for_shard<'a>(
        &'a self,
        shard: Option<&'a NodePool>,
    ) -> Result<PooledConnection<'a>> {
        match shard.map(NodePool::try_take) {
            Some(Some(Ok(connection))) => Ok(connection),
            Some(Some(Err(_))) => {
                self.disable_shards();
                self.take()
            }
            Some(None) | None => self.take(),
        }
    }

    /// Learn the node's shard ports from a connection's HELLO, unless they are known.
    fn learn_shards(&self, connection: &Connection) {
        let mut known = self
            .shards
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if !self.shard_aware || known.is_some() {
            return;
        }
        // With one shard there is no hop to skip.
        let shards = (connection.shard_ports.len() == connection.shard_count as usize
            && connection.shard_count > 1)
            .then(|| {
                // The server this connection reached (a name may resolve to several), each
                // shard's port; else the configured host ("host:port" or "[v6]:port").
                let peer = connection.peer_address();
                let host = self
                    .address
                    .rsplit_once(':')
                    .map_or(self.address.as_str(), |(host, _)| host);
                let shard_address = |port: u16| match peer {
                    Some(mut address) => {
                        address.set_port(port);
                        address.to_string()
                    }
                    None => format!("{host}:{port}"),
                };
                ShardPools {
                    placement_hash: connection.placement_hash,
                    pools: connection
                        .shard_ports
                        .iter()
                        .map(|port| {
                            // The shard pools together hold about as many connections as the
                            // node's own pool may.
                            let per_shard =
                                self.connections_max.div_ceil(connection.shard_ports.len());
                            let mut pool = NodePool::new(
                                &shard_address(*port),
                                self.token.as_deref(),
                                self.connect_timeout,
                                self.request_timeout,
                                per_shard,
                            );
                            pool.shard_aware = false;
                            pool
                        })
                        .collect(),
                }
            });
        *known = Some(shards.map(Arc::new));
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
                return self.open_counted();
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

    /// An idle connection or a new one; `None` when all are busy and no more may be opened
    /// (the caller goes elsewhere rather than wait).
    pub(crate) fn try_take(&self) -> Option<Result<PooledConnection<'_>>> {
        let mut state = self.lock();
        if let Some(connection) = state.idle.pop() {
            return Some(Ok(self.pooled(connection)));
        }
        if state.open >= self.connections_max {
            return None;
        }
        state.open += 1;
        drop(state);
        Some(self.open_counted())
    }

    /// Open a connection already counted in `open` (uncounted again if it fails).
    fn open_counted(&self) -> Result<PooledConnection<'_>> {
        match self.open_connection() {
            Ok(connection) => {
                self.learn_shards(&connection);
                Ok(self.pooled(connection))
            }
            Err(error) => {
                self.closed();
                Err(error)
            }
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
