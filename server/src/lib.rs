//! hydrant-server: one listener per shard (SO_REUSEPORT, so the kernel spreads connections over
//! the shards), each connection served by the executor of the shard that accepted it. Requests
//! for keys of another shard are forwarded to it through the engine's bounded inboxes.
//!
//! Built so far (issue 3, in progress): HELLO (version, limits, token proof), PING, GET, PUT (one
//! frame), HEAD, DELETE, LIST, with pipelined requests answered as they complete.

mod connection;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use hydrant_engine::rt::{block_on, net};
use hydrant_engine::{Engine, EngineConfig};
use hydrant_proto::Limits;

/// What a server runs with.
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free port (see `Server::address`).
    pub listen: SocketAddr,
    pub engine: EngineConfig,
    /// The server's side of the negotiated limits.
    pub limits: Limits,
    /// The shared token clients prove knowledge of in HELLO. `None`: no proof is asked, and only
    /// loopback clients are served unless `allow_remote_without_token`.
    pub token: Option<Vec<u8>>,
    pub allow_remote_without_token: bool,
}

/// A running server.
pub struct Server {
    engine: Engine,
    address: SocketAddr,
    listeners: Vec<OwnedFd>,
}

impl Server {
    /// Open the engine, bind one listener per shard and start accepting.
    pub fn start(config: ServerConfig) -> Result<Server, String> {
        let engine = Engine::open(config.engine).map_err(|error| error.to_string())?;
        let first = net::listen(config.listen)
            .map_err(|error| format!("cannot listen on {}: {error}", config.listen))?;
        let address = net::local_address(&first).map_err(|error| error.to_string())?;
        let mut listeners = vec![first];
        for _ in 1..engine.shard_count() {
            listeners.push(
                net::listen(address)
                    .map_err(|error| format!("cannot listen on {address}: {error}"))?,
            );
        }
        if let Some(token) = &config.token {
            if token.len() < hydrant_proto::auth::TOKEN_BYTES_MIN {
                return Err(format!(
                    "the token is {} bytes; use at least {}",
                    token.len(),
                    hydrant_proto::auth::TOKEN_BYTES_MIN
                ));
            }
        }
        let policy = connection::Policy {
            limits: config.limits,
            token: config.token.clone(),
            allow_remote_without_token: config.allow_remote_without_token,
        };
        for (shard, listener) in listeners.iter().enumerate() {
            let fd = listener.as_raw_fd();
            let handle = engine.handle();
            let policy = policy.clone();
            let started = engine.spawn_on_shard(shard, move |store| async move {
                connection::accept_loop(store, handle, fd, policy).await;
            });
            block_on(started).map_err(|error| error.to_string())?;
        }
        Ok(Server {
            engine,
            address,
            listeners,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn shard_count(&self) -> usize {
        self.engine.shard_count()
    }

    /// Stop the shards (which cancels their accepts and connections), then close the listeners.
    pub fn stop(self) -> io::Result<()> {
        let Server {
            engine, listeners, ..
        } = self;
        engine.close();
        drop(listeners);
        Ok(())
    }
}
