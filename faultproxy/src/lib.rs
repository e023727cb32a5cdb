//! hydrant-fault-proxy: an HTTP/1.1 proxy between an S3 client and an S3-compatible server that
//! adds per-request latency, a shared bandwidth cap and S3-style faults (503 SlowDown, 500
//! InternalError, connection resets), so that tests and benchmarks see an origin that behaves
//! like S3 on a bad day. Requests are forwarded unchanged; a control endpoint under
//! `/__proxy/` on the same listener reports counters and changes settings at run time.
//!
//! Embedding it in a test:
//!
//! ```no_run
//! use hydrant_fault_proxy::{start, Config, ConfigUpdate, DelayRange};
//!
//! let mut config = Config::new("127.0.0.1:5000");
//! config.settings.delay = DelayRange::NONE;
//! let proxy = start(config).unwrap();
//! let endpoint = format!("http://{}", proxy.addr());
//! // ... point the S3 client at `endpoint`, then turn faults on:
//! proxy
//!     .set_config(ConfigUpdate {
//!         fault_rate: Some(0.2),
//!         ..ConfigUpdate::default()
//!     })
//!     .unwrap();
//! assert_eq!(proxy.stats().total.failed, 0);
//! ```

mod config;
mod connection;
mod control;
mod http;
mod server;
mod socket;
mod stats;
mod throttle;

pub use config::{
    parse_bandwidth, parse_fault_rate, parse_faults, Config, ConfigError, ConfigUpdate, DelayRange,
    FaultKind, Settings, CONNECTIONS_MAX_DEFAULT, DELAY_DEFAULT, DELAY_MS_MAX,
};
pub use connection::CONTROL_PREFIX;
pub use http::HEAD_BYTES_MAX;
pub use server::{start, ProxyHandle};
pub use stats::{FaultCounts, Method, RequestCounts, Stats, GET_PATHS_TRACKED_MAX};
