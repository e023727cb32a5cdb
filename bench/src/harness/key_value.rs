//! The key-value workloads: `get`, `put` and `mixed` over `--keys` keys of `--value-bytes` each,
//! chosen uniformly or by Zipf's law (rank 1 is the hottest key). With `--peer-memcached` and
//! `--peer-redis`, the same workload (same keys, values, threads, connections, seeds and bounds)
//! then runs against each peer, its report, in the same schema, goes beside hydrant's, and the
//! ratios of hydrant's figures to the peer's are printed.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use hydrant_client::{Client, ClientError};
use serde::Serialize;

use crate::memcached::{self, MemcachedConnection};
use crate::redis::{self, RedisConnection};

use super::runner::{self, ThreadBody, ThreadContext};
use super::schema::RunReport;
use super::zipf::{KeyChooser, Random};
use super::{parameters_of, report_of, value_of, CommonArgs};

/// Without `--duration` or `--ops`, a run lasts this long.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipf,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct KeyValueArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    #[arg(long, default_value_t = 4096)]
    pub value_bytes: usize,
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// Zipf's exponent (alpha): 0.99 is YCSB's; larger is more skewed.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_exponent: f64,
    /// Keys are named PREFIX + their number.
    #[arg(long, default_value = "kv/")]
    pub key_prefix: String,
    /// Skip the load phase (the keys are already there, from an earlier run).
    #[arg(long)]
    pub no_load: bool,
    #[command(flatten)]
    pub peer: PeerArgs,
}

/// The peer the same workload is measured against, right after hydrant, in the same run.
#[derive(clap::Args, Clone, Debug, Default, Serialize)]
pub struct PeerArgs {
    /// Then run the same workload against this memcached, HOST:PORT (its keys loaded first
    /// unless --no-load); its report is labelled LABEL-memcached.
    #[arg(long)]
    pub peer_memcached: Option<String>,
    /// Where the memcached peer's report goes (default: beside --json, FILE-memcached.json).
    #[arg(long)]
    pub peer_json: Option<PathBuf>,
    /// Then (after memcached, when both are given) run the same workload against this Redis,
    /// HOST:PORT; its report is labelled LABEL-redis and goes beside --json (FILE-redis.json).
    #[arg(long)]
    pub peer_redis: Option<String>,
}

/// A store the key-value workloads are measured against, in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Memcached,
    Redis,
}

impl Peer {
    /// In the order they run.
    pub const ALL: [Peer; 2] = [Peer::Memcached, Peer::Redis];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Memcached => "memcached",
            Peer::Redis => "redis",
        }
    }

    fn address(self, args: &KeyValueArgs) -> Option<&String> {
        match self {
            Peer::Memcached => args.peer.peer_memcached.as_ref(),
            Peer::Redis => args.peer.peer_redis.as_ref(),
        }
    }
}

/// One line comparing hydrant's run with a peer's run of the same workload: throughput and
/// latency percentiles as hydrant's over the peer's (above 1 is better for throughput, below 1
/// is better for latency).
pub fn ratio_line(hydrant: &RunReport, peer: &RunReport, name: &str) -> String {
    let ratio = |ours: f64, theirs: f64| {
        if theirs > 0.0 {
            format!("{:.2}", ours / theirs)
        } else {
            "-".to_string()
        }
    };
    format!(
        "hydrant/{name}: ops/s {} · MiB/s {} · p50 latency {} · p99 latency {}",
        ratio(hydrant.operations_per_second, peer.operations_per_second),
        ratio(hydrant.mebibytes_per_second, peer.mebibytes_per_second),
        ratio(hydrant.latency_us.p50, peer.latency_us.p50),
        ratio(hydrant.latency_us.p99, peer.latency_us.p99),
    )
}

/// One thread's connection to the store under test: hydrant's client, or a peer's. Each
/// operation returns the bytes it moved.
pub trait KeyValueConnection: Send {
    fn get(&mut self, bucket: &str, key: &str) -> Result<u64, ClientError>;
    fn put(&mut self, bucket: &str, key: &str, value: &[u8]) -> Result<u64, ClientError>;
}

impl KeyValueConnection for Client {
    fn get(&mut self, bucket: &str, key: &str) -> Result<u64, ClientError> {
        let (_, data) = Client::get(self, bucket, key, None)?;
        Ok(data.len() as u64)
    }

    fn put(&mut self, bucket: &str, key: &str, value: &[u8]) -> Result<u64, ClientError> {
        Client::put(self, bucket, key, value)?;
        Ok(value.len() as u64)
    }
}

/// A peer's blocking connection: values by key, no buckets (keys are the same strings hydrant
/// stores in `--bucket`).
trait PeerStore: Send {
    fn get(&mut self, key: &str) -> std::io::Result<Option<&[u8]>>;
    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()>;
}

impl PeerStore for MemcachedConnection {
    fn get(&mut self, key: &str) -> std::io::Result<Option<&[u8]>> {
        MemcachedConnection::get(self, key)
    }

    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()> {
        MemcachedConnection::set(self, key, value)
    }
}

impl PeerStore for RedisConnection {
    fn get(&mut self, key: &str) -> std::io::Result<Option<&[u8]>> {
        RedisConnection::get(self, key)
    }

    fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()> {
        RedisConnection::set(self, key, value)
    }
}

struct PeerConnection<C> {
    connection: C,
    peer: Peer,
    address: String,
}

impl<C> PeerConnection<C> {
    /// A failure ends the run (not retriable): this connection does not reconnect, and a
    /// missing key means the peer does not hold what hydrant held, so the two are not comparable.
    fn failed(&self, key: &str, what: impl std::fmt::Display) -> ClientError {
        ClientError::Usage(format!(
            "{} {}: {key}: {what}",
            self.peer.name(),
            self.address
        ))
    }
}

impl<C: PeerStore> KeyValueConnection for PeerConnection<C> {
    fn get(&mut self, _bucket: &str, key: &str) -> Result<u64, ClientError> {
        match self.connection.get(key) {
            Ok(Some(value)) => Ok(value.len() as u64),
            Ok(None) => Err(self.failed(key, "not found (load it, or leave out --no-load)")),
            Err(error) => Err(self.failed(key, error)),
        }
    }

    fn put(&mut self, _bucket: &str, key: &str, value: &[u8]) -> Result<u64, ClientError> {
        self.connection
            .set(key, value)
            .map_err(|error| self.failed(key, error))?;
        Ok(value.len() as u64)
    }
}

fn connect_peer(
    peer: Peer,
    address: &str,
    timeout: Duration,
) -> Result<Box<dyn KeyValueConnection>, String> {
    let failed =
        |error: std::io::Error| format!("connecting to {} {address}: {error}", peer.name());
    let address = address.to_string();
    Ok(match peer {
        Peer::Memcached => Box::new(PeerConnection {
            connection: MemcachedConnection::connect(&address, timeout).map_err(failed)?,
            peer,
            address,
        }),
        Peer::Redis => Box::new(PeerConnection {
            connection: RedisConnection::connect(&address, timeout).map_err(failed)?,
            peer,
            address,
        }),
    })
}

/// Opens one connection per thread.
type Connect<'args> = dyn Fn() -> Result<Box<dyn KeyValueConnection>, String> + Sync + 'args;

fn connect_hydrant(common: &CommonArgs) -> Result<Box<dyn KeyValueConnection>, String> {
    Ok(Box::new(common.connect()?))
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct MixedArgs {
    #[command(flatten)]
    pub key_value: KeyValueArgs,
    /// The share of operations that are GETs; the rest are PUTs of the same keys.
    #[arg(long, default_value_t = 0.9)]
    pub read_fraction: f64,
}

impl KeyValueArgs {
    fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if !(self.zipf_exponent > 0.0 && self.zipf_exponent.is_finite()) {
            return Err("--zipf-exponent must be above 0".into());
        }
        if self.peer.peer_memcached.is_some() && !memcached::valid_key(&self.key(self.keys - 1)) {
            return Err(format!(
                "--key-prefix {:?}: memcached refuses such keys (spaces, control characters, over {} bytes)",
                self.key_prefix,
                memcached::KEY_BYTES_MAX
            ));
        }
        if self.peer.peer_redis.is_some() && self.key(self.keys - 1).len() > redis::KEY_BYTES_MAX {
            return Err(format!(
                "--key-prefix {:?}: keys over {} bytes",
                self.key_prefix,
                redis::KEY_BYTES_MAX
            ));
        }
        Ok(())
    }

    fn chooser(&self) -> KeyChooser {
        match self.distribution {
            Distribution::Uniform => KeyChooser::uniform(self.keys),
            Distribution::Zipf => KeyChooser::zipf(self.keys, self.zipf_exponent),
        }
    }

    fn key(&self, index: u64) -> String {
        format!("{}{index:012}", self.key_prefix)
    }
}

/// PUT every key once, the connections sharing the keys, so that GETs find them.
fn load(args: &KeyValueArgs, connect: &Connect) -> Result<(), String> {
    let started = Instant::now();
    let connections = args.common.connections as u64;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..connections)
            .map(|thread| {
                scope.spawn(move || -> Result<(), String> {
                    let mut connection = connect()?;
                    let value = value_of(args.value_bytes, thread);
                    for index in (thread..args.keys).step_by(connections as usize) {
                        connection
                            .put(&args.common.bucket, &args.key(index), &value)
                            .map_err(|error| format!("loading {}: {error}", args.key(index)))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|handle| handle.join().expect("a load thread panicked"))
    })?;
    eprintln!(
        "loaded {} keys of {} bytes in {:.1} s",
        args.keys,
        args.value_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// GETs of keys chosen by `--distribution`.
pub fn get(args: &KeyValueArgs) -> Result<RunReport, String> {
    run_on_hydrant("get", args, 1.0, parameters_of(args))
}

/// PUTs of keys chosen by `--distribution`, overwriting them.
pub fn put(args: &KeyValueArgs) -> Result<RunReport, String> {
    run_on_hydrant("put", args, 0.0, parameters_of(args))
}

/// GETs with probability `--read-fraction`, PUTs of the same keys otherwise.
pub fn mixed(args: &MixedArgs) -> Result<RunReport, String> {
    check_read_fraction(args.read_fraction)?;
    run_on_hydrant(
        "mixed",
        &args.key_value,
        args.read_fraction,
        parameters_of(args),
    )
}

/// The same `get` against `peer`; `None` when that peer was not given.
pub fn get_on_peer(args: &KeyValueArgs, peer: Peer) -> Result<Option<RunReport>, String> {
    run_on_peer("get", args, 1.0, parameters_of(args), peer)
}

pub fn put_on_peer(args: &KeyValueArgs, peer: Peer) -> Result<Option<RunReport>, String> {
    run_on_peer("put", args, 0.0, parameters_of(args), peer)
}

pub fn mixed_on_peer(args: &MixedArgs, peer: Peer) -> Result<Option<RunReport>, String> {
    check_read_fraction(args.read_fraction)?;
    run_on_peer(
        "mixed",
        &args.key_value,
        args.read_fraction,
        parameters_of(args),
        peer,
    )
}

fn check_read_fraction(read_fraction: f64) -> Result<(), String> {
    if !(0.0..=1.0).contains(&read_fraction) {
        return Err("--read-fraction must be between 0 and 1".into());
    }
    Ok(())
}

/// Where a peer's report goes: for memcached `--peer-json`, else beside `--json` (`run.json` →
/// `run-memcached.json`, `run-redis.json`); `None` when neither is given.
pub fn peer_json(args: &KeyValueArgs, peer: Peer) -> Option<PathBuf> {
    let given = match peer {
        Peer::Memcached => args.peer.peer_json.clone(),
        Peer::Redis => None,
    };
    given.or_else(|| Some(super::json_beside(args.common.json.as_ref()?, peer.name())))
}

const GET: usize = 0;
const PUT: usize = 1;
const KINDS: [&str; 2] = ["get", "put"];

fn run_on_hydrant(
    workload: &str,
    args: &KeyValueArgs,
    read_fraction: f64,
    parameters: std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<RunReport, String> {
    args.validate()?;
    let connect = || connect_hydrant(&args.common);
    run(workload, args, read_fraction, parameters, &connect)
}

/// A peer's run: the same arguments, against the peer; its report names the peer's address as
/// its server, `LABEL-PEER` as its label and `peer: PEER` among its parameters.
fn run_on_peer(
    workload: &str,
    args: &KeyValueArgs,
    read_fraction: f64,
    mut parameters: std::collections::BTreeMap<String, serde_json::Value>,
    peer: Peer,
) -> Result<Option<RunReport>, String> {
    let Some(address) = peer.address(args).cloned() else {
        return Ok(None);
    };
    args.validate()?;
    let mut peer_args = args.clone();
    peer_args.common.servers = vec![address.clone()];
    peer_args.common.label = Some(format!(
        "{}-{}",
        args.common.label_or(workload),
        peer.name()
    ));
    parameters.insert("peer".into(), serde_json::json!(peer.name()));
    let timeout = Duration::from_secs(args.common.timeout_seconds);
    let connect = || connect_peer(peer, &address, timeout);
    run(workload, &peer_args, read_fraction, parameters, &connect).map(Some)
}

fn run(
    workload: &str,
    args: &KeyValueArgs,
    read_fraction: f64,
    parameters: std::collections::BTreeMap<String, serde_json::Value>,
    connect: &Connect,
) -> Result<RunReport, String> {
    let common = &args.common;
    let bounds = common.bounds(Some(DEFAULT_DURATION))?;
    // Nothing needs to be there before a PUT.
    if !args.no_load && read_fraction > 0.0 {
        load(args, connect)?;
    }
    let chooser = args.chooser();
    let mut bodies: Vec<ThreadBody<()>> = Vec::with_capacity(common.connections);
    for thread in 0..common.connections {
        let mut connection = connect()?;
        let mut random = Random::new(common.thread_seed(thread));
        let value = value_of(args.value_bytes, thread as u64);
        let chooser = &chooser;
        bodies.push(Box::new(move |context: &mut ThreadContext| {
            while context.next().is_some() {
                let key = args.key(chooser.next(&mut random));
                if read_fraction >= 1.0 || random.next_unit() < read_fraction {
                    context.measure(GET, || connection.get(&common.bucket, &key))?;
                } else {
                    context.measure(PUT, || connection.put(&common.bucket, &key, &value))?;
                }
            }
            Ok(())
        }));
    }
    let started = SystemTime::now();
    let measured = runner::run(&KINDS, bounds, bodies)?;
    Ok(report_of(workload, common, parameters, &measured, started))
}
