//! hydrant-server: one listener per shard (SO_REUSEPORT, so the kernel spreads connections over
//! the shards), each connection served by the executor of the shard that accepted it. Requests
//! for keys of another shard are forwarded to it through the engine's bounded inboxes.
//!
//! Operations: HELLO (version, limits, token proof), PING, GET, PUT (streamed over several frames
//! when large), HEAD, DELETE, LIST, BATCH_GET, STATS, FLUSH, PREFETCH, UPLOADS; pipelined
//! requests are answered as they complete (docs/protocol.md).

mod connection;
mod local;
pub mod metrics;
pub mod s3;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

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
    /// Serve Prometheus metrics over HTTP here (`GET /metrics`).
    pub metrics: Option<SocketAddr>,
    /// Serve the same-host path on this Unix domain socket (default none; docs/protocol.md,
    /// "Same-host path").
    pub local_socket: Option<std::path::PathBuf>,
    /// A connection that has said HELLO and then neither sends a frame nor waits for an answer
    /// for this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Listen on a port of its own for each shard, told to clients in HELLO (the shard-aware
    /// path).
    pub shard_ports: bool,
    /// Serve the S3 REST API too (`None`: not).
    pub s3: Option<s3::S3Config>,
}

/// How long a greeted connection may stay silent by default.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);

impl ServerConfig {
    /// A server on `listen` over `engine` with every other setting at its default: the default
    /// limits, no token (loopback clients only), no metrics endpoint, no same-host socket, the
    /// default idle timeout and a port per shard.
    pub fn new(listen: SocketAddr, engine: EngineConfig) -> ServerConfig {
        ServerConfig {
            listen,
            engine,
            limits: Limits::default(),
            token: None,
            allow_remote_without_token: false,
            metrics: None,
            local_socket: None,
            idle_timeout: Some(IDLE_TIMEOUT_DEFAULT),
            shard_ports: true,
            s3: None,
        }
    }
}

/// A running server.
pub struct Server {
    engine: Engine,
    address: SocketAddr,
    listeners: Vec<OwnedFd>,
    metrics: Option<MetricsEndpoint>,
    local: Option<local::LocalEndpoint>,
    s3: Option<s3::S3Endpoint>,
}

/// A small HTTP endpoint on its own thread: it answers every request with the metrics text.
struct MetricsEndpoint {
    address: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often the metrics thread looks for a stop request while idle.
const METRICS_POLL_MS: u64 = 100;
/// How long a scrape may take to send its request or read the answer.
const METRICS_IO_TIMEOUT_S: u64 = 2;

fn start_metrics(
    address: SocketAddr,
    engine: hydrant_engine::EngineHandle,
) -> Result<MetricsEndpoint, String> {
    let listener = std::net::TcpListener::bind(address)
        .map_err(|error| format!("cannot listen for metrics on {address}: {error}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|error| error.to_string())?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("hydrant-metrics".into())
        .spawn(move || serve_metrics(listener, engine, thread_stop))
        .map_err(|error| error.to_string())?;
    Ok(MetricsEndpoint {
        address,
        stop,
        thread,
    })
}

fn serve_metrics(
    listener: std::net::TcpListener,
    engine: hydrant_engine::EngineHandle,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(METRICS_POLL_MS));
                continue;
            }
            Err(_) => {
                // Out of file descriptors, say: wait rather than spin.
                std::thread::sleep(std::time::Duration::from_millis(METRICS_POLL_MS));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        // A scraper that stops reading must not hold up the next scrape or a shutdown.
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(METRICS_IO_TIMEOUT_S)));
        let _ =
            stream.set_write_timeout(Some(std::time::Duration::from_secs(METRICS_IO_TIMEOUT_S)));
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request);
        let (status, body) = match block_on(metrics::gather(&engine)) {
            Ok(text) => ("200 OK", text),
            Err(error) => ("503 Service Unavailable", format!("{error}\n")),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
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
        // The shard-aware path: one more listener per shard, on a port of its own (chosen by the
        // kernel), accepted only by that shard.
        let mut shard_ports = Vec::new();
        if config.shard_ports {
            // The same address (an IPv6 scope included), any port.
            let mut any_port = address;
            any_port.set_port(0);
            for _ in 0..engine.shard_count() {
                let listener = net::listen(any_port)
                    .map_err(|error| format!("cannot listen on {any_port}: {error}"))?;
                shard_ports.push(
                    net::local_address(&listener)
                        .map_err(|error| error.to_string())?
                        .port(),
                );
                listeners.push(listener);
            }
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
            idle_timeout: config.idle_timeout,
            shard_ports: shard_ports.clone().into(),
        };
        for (index, listener) in listeners.iter().enumerate() {
            // The shared listeners first (one per shard), then each shard's own.
            let shard = index % engine.shard_count();
            let fd = listener.as_raw_fd();
            let handle = engine.handle();
            let policy = policy.clone();
            let started = engine.spawn_on_shard(shard, move |store| async move {
                connection::accept_loop(store, handle, fd, policy).await;
            });
            block_on(started).map_err(|error| error.to_string())?;
        }
        let metrics = match config.metrics {
            Some(address) => Some(start_metrics(address, engine.handle())?),
            None => None,
        };
        let local = match &config.local_socket {
            Some(path) => Some(local::start(path, engine.handle())?),
            None => None,
        };
        let s3 = match &config.s3 {
            Some(s3_config) => match s3::S3Endpoint::start(s3_config.clone(), engine.handle()) {
                Ok(endpoint) => Some(endpoint),
                Err(error) if !s3_config.required => {
                    log::warn!("{error}; serving without the S3 endpoint");
                    None
                }
                Err(error) => return Err(error),
            },
            None => None,
        };
        Ok(Server {
            engine,
            address,
            listeners,
            metrics,
            local,
            s3,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where metrics are served, if they are.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|metrics| metrics.address)
    }

    /// Where the S3 endpoint listens, if it does.
    pub fn s3_address(&self) -> Option<SocketAddr> {
        self.s3.as_ref().map(|s3| s3.address())
    }

    /// The same-host socket, if there is one.
    pub fn local_socket(&self) -> Option<&std::path::Path> {
        self.local.as_ref().map(|local| local.path())
    }

    pub fn shard_count(&self) -> usize {
        self.engine.shard_count()
    }

    /// Stop the shards (which cancels their accepts and connections), then close the listeners.
    pub fn stop(self) -> io::Result<()> {
        let Server {
            engine,
            listeners,
            metrics,
            local,
            s3,
            ..
        } = self;
        if let Some(mut s3) = s3 {
            s3.stop();
        }
        if let Some(local) = local {
            local.stop();
        }
        if let Some(metrics) = metrics {
            metrics
                .stop
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = metrics.thread.join();
        }
        engine.close();
        drop(listeners);
        Ok(())
    }
}
