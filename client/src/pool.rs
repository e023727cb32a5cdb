//! Blocking connections to one node, pooled: a caller takes one for a request (or a pipelined
//! batch) and gives it back; at most `max_connections_per_node` are open at once.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};
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
        }
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
                    Ok(connection) => Ok(self.pooled(connection)),
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
