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
use hydrant_engine::{
    origin, units, BucketOrigin, EngineConfig, OriginConfig, IO_BYTES_IN_FLIGHT_MAX,
    IO_BYTES_IN_FLIGHT_MIN,
};
use hydrant_proto::Limits;
use hydrant_server::{Server, ServerConfig};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{SigSet, Signal};

/// Every setting: from flags and the environment (clap), and from a `--config` TOML file
/// (serde, the same fields), merged by [`merge`].
#[derive(Parser, serde::Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "hydrant-server",
    about = "hydrant: an NVMe cache and write-back node for GPU servers"
)]
struct Arguments {
    /// A TOML file with any of these settings (keys as the flags, with _ for -). Flags and
    /// environment variables win over it.
    #[arg(long, env = "HYDRANT_CONFIG")]
    #[serde(skip)]
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
    /// Do not open a port per shard for shard-aware clients (by default each shard also listens
    /// on a port of its own, told to clients in HELLO, so their requests skip the hop between
    /// cores).
    #[arg(long)]
    no_shard_ports: bool,
    /// Serve the S3 REST API on this address (`off`: not at all). Default 127.0.0.1:7780.
    #[arg(long, env = "HYDRANT_S3_LISTEN")]
    s3_listen: Option<String>,
    /// S3 keys (TOML: [[key]] with access_key_id, secret_access_key, read and write bucket
    /// lists): S3 requests must then be signed with one of them. Without it, S3 requests are
    /// anonymous and served from loopback only.
    #[arg(long, env = "HYDRANT_S3_CREDENTIALS")]
    s3_credentials: Option<PathBuf>,
    /// Abort a multipart upload this long after it began, when it has neither completed nor
    /// been aborted (its parts' bytes are freed): 30m, 24h, 7d; 0 never. Default 24h.
    #[arg(long, env = "HYDRANT_S3_UPLOAD_EXPIRY")]
    s3_upload_expiry: Option<String>,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics).
    #[arg(long, env = "HYDRANT_METRICS")]
    metrics: Option<SocketAddr>,
    /// The default origin: cache bucket B maps to URL/B/ (s3://bucket[/prefix], gs://...,
    /// az://..., file:///path; `none`: buckets live on NVMe only). Default: the folder `origin`
    /// beside the first data file.
    #[arg(long, env = "HYDRANT_ORIGIN")]
    origin: Option<String>,
    /// A bucket with an origin of its own, repeatable:
    /// NAME=URL[,write=back|through|read-only][,revalidate=immutable|ttl=DURATION][,endpoint=URL][,settings=FILE]
    #[arg(long = "bucket")]
    bucket: Vec<String>,
    /// Write mode of buckets on the default origin: back, through or read-only. Default back.
    #[arg(long, env = "HYDRANT_WRITE")]
    write: Option<String>,
    /// Revalidation of buckets on the default origin: immutable or ttl=DURATION. Default
    /// immutable.
    #[arg(long, env = "HYDRANT_REVALIDATE")]
    revalidate: Option<String>,
    /// The write budget for admitting origin data to NVMe, bytes per second (e.g. 500MiB).
    /// Default: none.
    #[arg(long, env = "HYDRANT_ADMISSION_BYTES_PER_SECOND")]
    admission_bytes_per_second: Option<String>,
    /// Memory for the DRAM tier in front of NVMe, e.g. 8GiB (0: none). Default 256MiB.
    #[arg(long, env = "HYDRANT_DRAM_BYTES")]
    dram_bytes: Option<String>,
    /// Device bytes in flight per shard, 4KiB-1GiB, e.g. 16MiB (raised to one chunk and its 4 KiB
    /// header if smaller); a larger operation goes alone. Some devices serve large reads fastest
    /// with few in flight: measure with fio-profiles/randread-1m-depths.fio. Default 8MiB.
    #[arg(long, env = "HYDRANT_IO_BYTES_IN_FLIGHT")]
    io_bytes_in_flight: Option<String>,
    /// The dirty-byte budget: write-back PUTs wait (then get BUSY) above it, e.g. 4GiB.
    /// Default: a quarter of the data devices, at most 4 GiB.
    #[arg(long, env = "HYDRANT_DIRTY_BYTES_MAX")]
    dirty_bytes_max: Option<String>,
    /// How long one origin read or metadata request may take, retries included, before the
    /// reader is told the origin is unavailable: 5s, 30s, 2m. Default 30s.
    #[arg(long, env = "HYDRANT_ORIGIN_TIMEOUT")]
    origin_timeout: Option<String>,
    /// How long one upload request to the origin may take, retries included: a part, or the
    /// completion of a multipart upload, which S3 may take minutes to assemble for a large
    /// object. A failed part is sent again; a failed completion is checked and sent again,
    /// never the whole object. Default 10m.
    #[arg(long, env = "HYDRANT_UPLOAD_TIMEOUT")]
    upload_timeout: Option<String>,
    /// Bytes of write-back parts in flight to object stores for the whole node (read from NVMe,
    /// held in memory, on their way), e.g. 1GiB; at least one part (16 MiB). Up to 8 parts of
    /// one object and 4 objects per shard go at once within it. Default 256MiB.
    #[arg(long, env = "HYDRANT_UPLOAD_BYTES_IN_FLIGHT")]
    upload_bytes_in_flight: Option<String>,
    /// Serve clients on this host over this Unix domain socket too: reads land in a shared
    /// memory region instead of crossing a socket (docs/protocol.md, "Same-host path").
    #[arg(long, env = "HYDRANT_LOCAL_SOCKET")]
    local_socket: Option<PathBuf>,
    /// Close a connection that said HELLO and then stays silent this long (nothing received,
    /// no request running, no answer being sent): 500ms, 30s, 5m, 2h; 0 never. Default 300s.
    #[arg(long, env = "HYDRANT_IDLE_TIMEOUT")]
    idle_timeout: Option<String>,
    /// Provided 4 KiB receive buffers per shard, which waiting connections' multishot receives
    /// share: a power of two up to 32768, or 0 for a receive per request into each connection's
    /// own buffer. Default 256.
    #[arg(long, env = "HYDRANT_RECEIVE_BUFFERS")]
    receive_buffers: Option<u16>,
    /// Write a checkpoint of each shard's index every this many filled regions (0: only on a
    /// clean stop), so that a restart reads it and scans only the log written after it.
    /// Default 16.
    #[arg(long, env = "HYDRANT_CHECKPOINT_REGIONS")]
    checkpoint_regions: Option<u32>,
    /// Print these settings as a Markdown table (docs/configuration.md is made of it) and exit.
    #[arg(long, hide = true)]
    #[serde(skip)]
    help_markdown: bool,
}

/// The settings of `command` as a Markdown table: flag, environment variable, what it does.
/// From the same text as `--help`, so that the documentation cannot drift from it.
fn markdown_reference(command: &clap::Command) -> String {
    let mut table = String::from("| flag | environment | what it sets |\n|---|---|---|\n");
    for argument in command.get_arguments() {
        let Some(long) = argument.get_long() else {
            continue;
        };
        if argument.is_hide_set() || long == "help" || long == "version" {
            continue;
        }
        let takes_value = argument
            .get_num_args()
            .is_some_and(|count| count.takes_values());
        let flag = match argument.get_value_names() {
            Some(names) if takes_value => format!("`--{long} {}`", names[0]),
            _ => format!("`--{long}`"),
        };
        let environment = argument
            .get_env()
            .map(|name| format!("`{}`", name.to_string_lossy()))
            .unwrap_or_default();
        let help = argument
            .get_long_help()
            .or(argument.get_help())
            .map(|text| text.to_string())
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        table.push_str(&format!("| {flag} | {environment} | {help} |\n"));
    }
    table
}

const LISTEN_DEFAULT: &str = "127.0.0.1:7700";
const DATA_DEFAULT: &str = "hydrant-data/data.hyd:1GiB";

/// Fill what flags and the environment left unset from the config file, then the defaults.
fn merge(mut arguments: Arguments) -> Result<Arguments, String> {
    let file = match &arguments.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            toml::from_str::<Arguments>(&text)
                .map_err(|error| format!("{}: {error}", path.display()))?
        }
        None => Arguments::default(),
    };
    macro_rules! from_file {
        ($($field:ident),*) => {
            $(arguments.$field = arguments.$field.or(file.$field);)*
        };
    }
    from_file!(
        listen,
        shards,
        token_file,
        metrics,
        origin,
        write,
        revalidate,
        dirty_bytes_max,
        origin_timeout,
        upload_timeout,
        upload_bytes_in_flight,
        dram_bytes,
        io_bytes_in_flight,
        admission_bytes_per_second,
        local_socket,
        idle_timeout,
        receive_buffers,
        checkpoint_regions,
        s3_listen,
        s3_credentials,
        s3_upload_expiry
    );
    if arguments.data.is_empty() {
        arguments.data = file.data;
    }
    if arguments.bucket.is_empty() {
        arguments.bucket = file.bucket;
    }
    arguments.allow_remote_without_token |= file.allow_remote_without_token;
    arguments.no_shard_ports |= file.no_shard_ports;
    if arguments.data.is_empty() {
        arguments.data = vec![DATA_DEFAULT.to_string()];
    }
    arguments.listen = arguments
        .listen
        .or(Some(LISTEN_DEFAULT.parse().expect("a valid default")));
    Ok(arguments)
}

/// The origins of `arguments`, checked; `devices` place the default local-folder origin and
/// size the default dirty budget.
fn origins(
    arguments: &Arguments,
    devices: &[DeviceConfig],
) -> Result<Option<OriginConfig>, String> {
    let mut config = OriginConfig::new();
    let fail = |error: hydrant_engine::Error| error.to_string();
    config.default_url = match arguments.origin.as_deref() {
        Some("none") => None,
        Some(url) => Some(url.to_string()),
        None => {
            let first = &devices[0].path;
            let folder = first
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .join("origin");
            std::fs::create_dir_all(&folder)
                .map_err(|error| format!("cannot create {}: {error}", folder.display()))?;
            let absolute = folder
                .canonicalize()
                .map_err(|error| format!("{}: {error}", folder.display()))?;
            Some(format!("file://{}", absolute.display()))
        }
    };
    let timeout = |flag: &str, text: &str| {
        units::parse_duration(text)
            .map_err(|error| format!("--{flag}: {error}"))
            .and_then(|duration| {
                if duration.is_zero() {
                    Err(format!("--{flag}: must be more than 0"))
                } else {
                    Ok(duration)
                }
            })
    };
    if let Some(text) = &arguments.origin_timeout {
        config.request_timeout = timeout("origin-timeout", text)?;
    }
    if let Some(text) = &arguments.upload_timeout {
        config.upload_timeout = timeout("upload-timeout", text)?;
    }
    if let Some(text) = &arguments.upload_bytes_in_flight {
        config.part_bytes_in_flight_max =
            size_bytes(text).map_err(|error| format!("--upload-bytes-in-flight: {error}"))?;
    }
    if let Some(write) = &arguments.write {
        config.default_write = origin::parse_write_mode(write).map_err(fail)?;
    }
    if let Some(revalidate) = &arguments.revalidate {
        config.default_revalidate = origin::parse_revalidate(revalidate).map_err(fail)?;
    }
    let defaults = BucketOrigin {
        url: String::new(),
        write: config.default_write,
        revalidate: config.default_revalidate,
        settings: Default::default(),
    };
    for spec in &arguments.bucket {
        let (name, origin) = spec.split_once('=').ok_or_else(|| {
            format!("--bucket {spec}: expected NAME=URL[,write=...][,revalidate=...][,endpoint=...][,settings=...]")
        })?;
        let origin = BucketOrigin::parse(origin, &defaults)
            .map_err(|error| format!("--bucket {spec}: {error}"))?;
        config.buckets.insert(name.to_string(), origin);
    }
    let device_bytes: u64 = devices
        .iter()
        .map(|device| {
            device
                .create_bytes
                .unwrap_or_else(|| std::fs::metadata(&device.path).map_or(0, |meta| meta.len()))
        })
        .sum();
    config.dirty_bytes_max = match &arguments.dirty_bytes_max {
        Some(text) => size_bytes(text).map_err(|error| format!("--dirty-bytes-max: {error}"))?,
        None => (device_bytes / 4).clamp(64 << 20, 4 << 30),
    };
    config.dirty_bytes_low = config.dirty_bytes_max / 4 * 3;
    // Writes the origin refused may hold as much of NVMe as the dirty budget, apart from it.
    config.failed_bytes_max = config.dirty_bytes_max;
    if config.default_url.is_none() && config.buckets.is_empty() {
        return Ok(None);
    }
    Ok(Some(config))
}

/// Bytes, as `hydrant_engine::units::parse_size` reads them (`4GiB`, `512MiB`, `10MB`).
fn size_bytes(size: &str) -> Result<u64, String> {
    units::parse_size(size).map_err(|error| error.to_string())
}

/// "PATH" or "PATH:SIZE" with SIZE in bytes or with a unit (`64GiB`).
fn device(argument: &str) -> Result<DeviceConfig, String> {
    let Some((path, size)) = argument.rsplit_once(':') else {
        return Ok(DeviceConfig::new(PathBuf::from(argument)));
    };
    let bytes = size_bytes(size).map_err(|error| format!("--data {argument}: {error}"))?;
    Ok(DeviceConfig::create(PathBuf::from(path), bytes))
}

/// Block SIGINT and SIGTERM in every thread (the mask is inherited), so that the main thread
/// can wait for them with sigwait. Waiting this way, rather than with a handler, means no
/// thread is ever interrupted by them: a shard blocked in `io_uring_enter` is not woken with
/// EINTR, and nothing runs in signal context.
fn block_stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()
        .expect("blocking signals in this thread cannot fail");
    set
}

/// Every connection is a file descriptor: allow as many as the hard limit does.
fn raise_open_files_limit() {
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// What the server is started with, checked.
struct Settings {
    server: ServerConfig,
    devices: Vec<DeviceConfig>,
}

impl Settings {
    fn from_arguments(arguments: Arguments) -> Result<Settings, String> {
        let arguments = merge(arguments)?;
        let devices = arguments
            .data
            .iter()
            .map(|argument| device(argument))
            .collect::<Result<Vec<_>, _>>()?;
        let mut engine = EngineConfig::new(devices.clone());
        engine.shards = arguments.shards.or_else(|| default_shards(&devices));
        if let Some(text) = &arguments.dram_bytes {
            engine.dram_bytes =
                size_bytes(text).map_err(|error| format!("--dram-bytes: {error}"))?;
        }
        if let Some(text) = &arguments.io_bytes_in_flight {
            let bytes =
                size_bytes(text).map_err(|error| format!("--io-bytes-in-flight: {error}"))?;
            if !(IO_BYTES_IN_FLIGHT_MIN..=IO_BYTES_IN_FLIGHT_MAX).contains(&bytes) {
                return Err(format!(
                    "--io-bytes-in-flight must be 4KiB-1GiB, not {bytes}"
                ));
            }
            engine.io_bytes_in_flight_max = bytes;
        }
        if let Some(regions) = arguments.checkpoint_regions {
            engine.checkpoints.every_regions = regions;
        }
        if let Some(count) = arguments.receive_buffers {
            if !hydrant_engine::rt::receive_buffers_valid(count) {
                return Err(format!(
                    "--receive-buffers must be 0 or a power of two up to 32768, not {count}"
                ));
            }
            engine.receive_buffers = count;
        }
        if let Some(text) = &arguments.admission_bytes_per_second {
            let bytes = size_bytes(text)
                .map_err(|error| format!("--admission-bytes-per-second: {error}"))?;
            engine.admission_bytes_per_second = Some(bytes);
        }
        engine.origins = origins(&arguments, &devices)?;
        let token = match &arguments.token_file {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|error| {
                        format!("cannot read the token file {}: {error}", path.display())
                    })?
                    .trim_ascii()
                    .to_vec(),
            ),
            None => None,
        };
        let idle_timeout = match arguments.idle_timeout.as_deref() {
            None => Some(hydrant_server::IDLE_TIMEOUT_DEFAULT),
            Some(text) => {
                let duration = units::parse_duration(text)
                    .map_err(|error| format!("--idle-timeout: {error}"))?;
                (!duration.is_zero()).then_some(duration)
            }
        };
        let s3 = match arguments.s3_listen.as_deref() {
            Some("off") => None,
            asked => {
                let listen = asked
                    .unwrap_or(hydrant_server::s3::S3_LISTEN_DEFAULT)
                    .parse()
                    .map_err(|error| format!("--s3-listen: {error}"))?;
                let credentials = arguments
                    .s3_credentials
                    .as_deref()
                    .map(hydrant_server::s3::Credentials::load)
                    .transpose()?;
                Some(hydrant_server::s3::S3Config {
                    listen,
                    credentials,
                    required: asked.is_some(),
                    cpus: Vec::new(),
                    upload_expiry: match arguments.s3_upload_expiry.as_deref() {
                        None => Some(hydrant_server::s3::UPLOAD_EXPIRY_DEFAULT),
                        Some(text) => {
                            let duration = units::parse_duration(text)
                                .map_err(|error| format!("--s3-upload-expiry: {error}"))?;
                            (!duration.is_zero()).then_some(duration)
                        }
                    },
                })
            }
        };
        let server = ServerConfig {
            listen: arguments.listen.expect("merged"),
            engine,
            limits: Limits::default(),
            token,
            allow_remote_without_token: arguments.allow_remote_without_token,
            metrics: arguments.metrics,
            local_socket: arguments.local_socket.clone(),
            idle_timeout,
            shard_ports: !arguments.no_shard_ports,
            s3,
        };
        Ok(Settings { server, devices })
    }

    /// What the started server prints on its first line, after where it listens.
    fn summary(&self) -> String {
        let data: Vec<String> = self
            .devices
            .iter()
            .map(|device| device.path.display().to_string())
            .collect();
        let origin = match &self.server.engine.origins {
            Some(origins) => format!(
                "; origin: {} ({} buckets of their own), dirty budget {} MiB",
                origins.default_url.as_deref().unwrap_or("none"),
                origins.buckets.len(),
                origins.dirty_bytes_max >> 20
            ),
            None => "; no origin".to_string(),
        };
        format!(
            "data: {}; DRAM tier {} MiB{origin}",
            data.join(", "),
            self.server.engine.dram_bytes >> 20
        )
    }
}

/// Shards for devices not yet formatted: one per core, as many as the smallest device that is
/// to be created holds (each shard needs three 64 MiB regions on every device). `None` (as
/// formatted) when a device exists.
fn default_shards(devices: &[DeviceConfig]) -> Option<usize> {
    if devices.iter().any(|device| device.path.exists()) {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
    let smallest = devices
        .iter()
        .filter_map(|device| device.create_bytes)
        .min()
        .unwrap_or(u64::MAX);
    let fitting = ((smallest.saturating_sub(1 << 20)) / (3 * (64 << 20))).max(1) as usize;
    Some(cores.min(fitting))
}

/// Keep the C allocator's memory close to what is live, before any thread starts. glibc gives
/// threads arenas of their own (up to 8 per core) and keeps what is freed in each, and after the
/// first large free it serves buffers of that size from those arenas instead of mapping them:
/// chunks allocated on the origin threads and freed on the shards left a 20 GiB read-through up
/// to 480 MiB larger than its live memory. With buffers of 2 MiB or more always mapped (and
/// unmapped when freed) and at most 8 arenas, the same run grew by 130 MiB
/// (server/tests/large.rs).
const ALLOCATOR_MMAP_THRESHOLD_BYTES: libc::c_int = 2 << 20;

fn bound_allocator_memory() {
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
    let arenas = cores.clamp(2, 8) as libc::c_int;
    // SAFETY: mallopt only sets parameters of the allocator; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
}

fn main() -> ExitCode {
    bound_allocator_memory();
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("HYDRANT_LOG", "info")).init();
    let arguments = Arguments::parse();
    if arguments.help_markdown {
        let mut command = <Arguments as clap::CommandFactory>::command();
        command.build();
        print!("{}", markdown_reference(&command));
        return ExitCode::SUCCESS;
    }
    let settings = match Settings::from_arguments(arguments) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            return ExitCode::from(2);
        }
    };
    let summary = settings.summary();
    raise_open_files_limit();
    let signals = block_stop_signals();
    let server = match Server::start(settings.server) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            return ExitCode::FAILURE;
        }
    };
    let local = server
        .local_socket()
        .map(|path| format!("; local socket {}", path.display()))
        .unwrap_or_default();
    let s3 = server
        .s3_address()
        .map(|address| format!("; S3 on http://{address}"))
        .unwrap_or_default();
    let metrics = server
        .metrics_address()
        .map(|address| format!("; metrics on http://{address}/metrics"))
        .unwrap_or_default();
    println!(
        "hydrant-server listening on {} with {} shards; {summary}{s3}{local}{metrics}",
        server.address(),
        server.shard_count(),
    );
    let signal = signals.wait().map_or(0, |signal| signal as i32);
    eprintln!("hydrant-server: signal {signal}, stopping");
    match server.stop() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hydrant-server: {error}");
            ExitCode::FAILURE
        }
    }
}
