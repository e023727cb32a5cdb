//! The listener: accepts connections up to the limit, serves each on its own thread, and shuts
//! everything down on request.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::config::{Config, ConfigError, ConfigUpdate, Settings};
use crate::connection;
use crate::stats::{Recorder, Stats};
use crate::throttle::Throttle;

/// How long `shutdown` waits for connection threads to finish once their sockets are shut. A
/// thread may be asleep in a delay or the throttle, so this covers the longest default delay.
pub const SHUTDOWN_WAIT_MS: u64 = 5_000;

/// How often `shutdown` looks whether the connection threads have finished.
const SHUTDOWN_POLL_MS: u64 = 5;

/// State shared by the listener and every connection thread.
pub struct Shared {
    pub upstream: String,
    pub seed: u64,
    pub settings: Mutex<Settings>,
    pub throttle: Throttle,
    pub stats: Recorder,
    pub connections: Registry,
    shutting_down: AtomicBool,
}

impl Shared {
    pub fn settings(&self) -> Settings {
        self.settings.lock().unwrap().clone()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Takes one fault from the limit, if there is one; false when none is left.
    pub fn take_fault(&self) -> bool {
        let mut settings = self.settings.lock().unwrap();
        match settings.faults_left {
            None => true,
            Some(0) => false,
            Some(left) => {
                settings.faults_left = Some(left - 1);
                true
            }
        }
    }

    pub fn update_settings(&self, update: &ConfigUpdate) -> Result<Settings, ConfigError> {
        let mut settings = self.settings.lock().unwrap();
        let updated = update.apply_to(&settings)?;
        if updated.bandwidth_bytes_per_second != settings.bandwidth_bytes_per_second {
            self.throttle.set_rate(updated.bandwidth_bytes_per_second);
        }
        *settings = updated.clone();
        Ok(updated)
    }
}

/// The sockets of the open connections (a client's, and its upstream's once connected), so that
/// shutdown can unblock threads waiting in reads. Its size is the count of open connections.
#[derive(Default)]
pub struct Registry {
    sockets: Mutex<HashMap<u64, Vec<TcpStream>>>,
}

impl Registry {
    /// Registers a connection unless `connections_max` are open.
    fn admit(&self, id: u64, client: TcpStream, connections_max: usize) -> bool {
        let mut sockets = self.sockets.lock().unwrap();
        if sockets.len() >= connections_max {
            return false;
        }
        sockets.insert(id, vec![client]);
        true
    }

    /// Adds a socket to connection `id`, replacing the upstream socket it had.
    pub fn set_upstream(&self, id: u64, upstream: TcpStream) {
        if let Some(sockets) = self.sockets.lock().unwrap().get_mut(&id) {
            sockets.truncate(1);
            sockets.push(upstream);
        }
    }

    /// Forgets connection `id`, closing the registry's descriptors of its sockets, which must
    /// happen before a reset: the reset is sent only when the last descriptor closes.
    pub fn remove(&self, id: u64) {
        self.sockets.lock().unwrap().remove(&id);
    }

    fn shut_all(&self) {
        for sockets in self.sockets.lock().unwrap().values() {
            for socket in sockets {
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    fn open_count(&self) -> usize {
        self.sockets.lock().unwrap().len()
    }
}

/// A running proxy. Dropping it shuts the proxy down.
pub struct ProxyHandle {
    address: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

/// Starts a proxy: binds `config.listen` and serves on background threads.
pub fn start(config: Config) -> io::Result<ProxyHandle> {
    config
        .settings
        .validate()
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    if config.connections_max == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "connections_max must be at least 1",
        ));
    }
    let listener = TcpListener::bind(config.listen)?;
    let address = listener.local_addr()?;
    let shared = Arc::new(Shared {
        upstream: config.upstream,
        seed: config.seed,
        throttle: Throttle::new(config.settings.bandwidth_bytes_per_second),
        settings: Mutex::new(config.settings),
        stats: Recorder::default(),
        connections: Registry::default(),
        shutting_down: AtomicBool::new(false),
    });
    let accept_shared = Arc::clone(&shared);
    let connections_max = config.connections_max;
    let accept_thread = thread::Builder::new()
        .name("fault-proxy-accept".into())
        .spawn(move || accept_loop(listener, accept_shared, connections_max))?;
    Ok(ProxyHandle {
        address,
        shared,
        accept_thread: Some(accept_thread),
    })
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, connections_max: usize) {
    let mut next_id: u64 = 0;
    loop {
        let accepted = listener.accept();
        if shared.is_shutting_down() {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of descriptors or a connection aborted while queued: wait a moment instead of
            // spinning, and go on.
            Err(_) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        if !shared.connections.admit(id, registered, connections_max) {
            shared.stats.connection_refused();
            drop(stream);
            continue;
        }
        shared.stats.connection_accepted();
        let connection_shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name(format!("fault-proxy-connection-{id}"))
            .spawn(move || connection::run(&connection_shared, id, stream));
        if spawned.is_err() {
            shared.connections.remove(id);
        }
    }
}

impl ProxyHandle {
    /// The address the proxy listens on, with the port chosen when `listen` had port 0.
    pub fn addr(&self) -> SocketAddr {
        self.address
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    pub fn reset_stats(&self) {
        self.shared.stats.reset();
    }

    pub fn settings(&self) -> Settings {
        self.shared.settings()
    }

    /// Changes settings while the proxy runs; requests that already started keep the settings
    /// they started with. Returns the settings now in force.
    pub fn set_config(&self, update: ConfigUpdate) -> Result<Settings, ConfigError> {
        self.shared.update_settings(&update)
    }

    /// Stops accepting, shuts the open connections and waits (up to `SHUTDOWN_WAIT_MS`) for
    /// their threads to finish. Calling it again does nothing.
    pub fn shutdown(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        self.shared.shutting_down.store(true, Ordering::Release);
        // The accept thread is blocked in accept; a connection of our own wakes it.
        let _ = TcpStream::connect(wake_address(self.address));
        let _ = accept_thread.join();
        self.shared.connections.shut_all();
        let deadline = Instant::now() + Duration::from_millis(SHUTDOWN_WAIT_MS);
        while self.shared.connections.open_count() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(SHUTDOWN_POLL_MS));
        }
    }
}

/// The address to connect to in order to reach a listener bound to `address`, which may be the
/// unspecified address.
fn wake_address(address: SocketAddr) -> SocketAddr {
    match address {
        SocketAddr::V4(v4) if v4.ip().is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, v4.port()))
        }
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, v6.port()))
        }
        other => other,
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
