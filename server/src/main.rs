//! `hydrant-server`: serve the engine over hydrant's wire protocol.
//!
//! With no arguments it listens on 127.0.0.1:7700 with a 1 GiB data file in ./hydrant-data.
//! SIGINT or SIGTERM stops it: the shards stop (everything acknowledged is already durable) and
//! it exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::EngineConfig;
use hydrant_proto::Limits;
use hydrant_server::{Server, ServerConfig};

#[derive(Parser)]
#[command(
    name = "hydrant-server",
    about = "hydrant: an NVMe cache and write-back node for GPU servers"
)]
struct Arguments {
    /// A TOML file with any of these settings (keys as the flags, with _ for -). Flags and
    /// environment variables win over it.
    #[arg(long, env = "HYDRANT_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    /// Default 127.0.0.1:7700.
    #[arg(long, env = "HYDRANT_LISTEN")]
    listen: Option<SocketAddr>,
    /// A device or data file, PATH or PATH:SIZE (a file is created with SIZE, e.g. 64GiB).
    /// Repeat for several devices. Default hydrant-data/data.hyd:1GiB.
    #[arg(long = "data", env = "HYDRANT_DATA")]
    data: Vec<String>,
    /// Shards (one per core). Default: as formatted, or the number of cores (at most 4 for the
    /// default 1 GiB file).
    #[arg(long, env = "HYDRANT_SHARDS")]
    shards: Option<usize>,
    /// A file holding the shared token (at least 16 bytes) that clients prove they know in HELLO.
    #[arg(long, env = "HYDRANT_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Without a token, serve clients on other hosts too (by default only loopback clients are).
    #[arg(long)]
    allow_remote_without_token: bool,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics).
    #[arg(long, env = "HYDRANT_METRICS")]
    metrics: Option<SocketAddr>,
}

/// The settings a `--config` file may hold.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<SocketAddr>,
    data: Option<Vec<String>>,
    shards: Option<usize>,
    token_file: Option<PathBuf>,
    allow_remote_without_token: Option<bool>,
    metrics: Option<SocketAddr>,
}

const LISTEN_DEFAULT: &str = "127.0.0.1:7700";
const DATA_DEFAULT: &str = "hydrant-data/data.hyd:1GiB";

/// Fill what flags and the environment left unset from the config file, then the defaults.
fn merge(mut arguments: Arguments) -> Result<Arguments, String> {
    let file = match &arguments.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            toml::from_str::<ConfigFile>(&text)
                .map_err(|error| format!("{}: {error}", path.display()))?
        }
        None => ConfigFile::default(),
    };
    arguments.listen = arguments
        .listen
        .or(file.listen)
        .or(Some(LISTEN_DEFAULT.parse().expect("a valid default")));
    if arguments.data.is_empty() {
        arguments.data = file.data.unwrap_or_else(|| vec![DATA_DEFAULT.to_string()]);
    }
    arguments.shards = arguments.shards.or(file.shards);
    arguments.token_file = arguments.token_file.or(file.token_file);
    arguments.allow_remote_without_token |= file.allow_remote_without_token.unwrap_or(false);
    arguments.metrics = arguments.metrics.or(file.metrics);
    Ok(arguments)
}

/// "PATH" or "PATH:SIZE" with SIZE in bytes or with a KiB, MiB, GiB or TiB suffix.
fn device(argument: &str) -> Result<DeviceConfig, String> {
    let Some((path, size)) = argument.rsplit_once(':') else {
        return Ok(DeviceConfig::new(PathBuf::from(argument)));
    };
    let units = [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("", 1),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|(suffix, unit)| size.strip_suffix(suffix).map(|number| (number, *unit)))
        .expect("the empty suffix always matches");
    let number: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("--data {argument}: size {size:?} is not a number with an optional KiB/MiB/GiB/TiB suffix"))?;
    let bytes = number
        .checked_mul(unit)
        .ok_or_else(|| format!("--data {argument}: size overflows"))?;
    Ok(DeviceConfig::create(PathBuf::from(path), bytes))
}

/// Block SIGINT and SIGTERM in every thread (the mask is inherited), so that the main thread
/// can wait for them with sigwait.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; the calls only touch it and
    // this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_stop_signal(set: &libc::sigset_t) -> i32 {
    let mut signal: libc::c_int = 0;
    // SAFETY: sigwait reads the set and writes one int.
    unsafe { libc::sigwait(set, &mut signal) };
    signal
}

/// Every connection is a file descriptor: allow as many as the hard limit does.
fn raise_open_files_limit() {
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct we own.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn main() -> ExitCode {
    let arguments = match merge(Arguments::parse()) {
        Ok(arguments) => arguments,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            return ExitCode::from(2);
        }
    };
    let devices = match arguments
        .data
        .iter()
        .map(|argument| device(argument))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(devices) => devices,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            return ExitCode::from(2);
        }
    };
    let mut engine = EngineConfig::new(devices.clone());
    engine.shards = arguments.shards;
    if engine.shards.is_none() && devices.iter().all(|device| !device.path.exists()) {
        let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
        let smallest = devices
            .iter()
            .filter_map(|device| device.create_bytes)
            .min()
            .unwrap_or(u64::MAX);
        // Each shard needs three 64 MiB regions on every device.
        let fitting = ((smallest.saturating_sub(1 << 20)) / (3 * (64 << 20))).max(1) as usize;
        engine.shards = Some(cores.min(fitting));
    }
    let token = match &arguments.token_file {
        Some(path) => match std::fs::read(path) {
            Ok(bytes) => Some(bytes.trim_ascii().to_vec()),
            Err(error) => {
                eprintln!(
                    "hydrant-server: cannot read the token file {}: {error}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    raise_open_files_limit();
    let signals = block_stop_signals();
    let server = match Server::start(ServerConfig {
        listen: arguments.listen.expect("merged"),
        engine,
        limits: Limits::default(),
        token,
        allow_remote_without_token: arguments.allow_remote_without_token,
        metrics: arguments.metrics,
    }) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            return ExitCode::FAILURE;
        }
    };
    let data: Vec<String> = devices
        .iter()
        .map(|device| device.path.display().to_string())
        .collect();
    let metrics = server
        .metrics_address()
        .map(|address| format!("; metrics on http://{address}/metrics"))
        .unwrap_or_default();
    println!(
        "hydrant-server listening on {} with {} shards; data: {}{metrics}",
        server.address(),
        server.shard_count(),
        data.join(", ")
    );
    let signal = wait_for_stop_signal(&signals);
    eprintln!("hydrant-server: signal {signal}, stopping");
    match server.stop() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            ExitCode::FAILURE
        }
    }
}
