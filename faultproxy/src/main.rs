//! The proxy as a process: flags in, `listening on ADDRESS` as the first line out, then serve
//! until killed.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use hydrant_fault_proxy::{
    parse_bandwidth, parse_fault_rate, start, Config, DelayRange, FaultKind, Settings,
    CONNECTIONS_MAX_DEFAULT,
};

/// An HTTP/1.1 proxy for S3 that adds latency, a bandwidth cap and S3-style faults. Control
/// endpoint on the same listener: GET /__proxy/stats, POST /__proxy/reset,
/// GET|PUT /__proxy/config?fault_rate=..&delay_ms=..&bandwidth=..&faults=..&fault_match=..&fault_limit=..
#[derive(Parser)]
#[command(name = "hydrant-fault-proxy", version)]
struct Arguments {
    /// Where to listen; port 0 picks a free port, printed as the first line of output.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The S3-compatible server to forward to, as HOST:PORT.
    #[arg(long)]
    upstream: String,
    /// Per-request delay in milliseconds, MIN-MAX drawn uniformly, or one value; 0 disables.
    #[arg(long, default_value = "50-150", value_parser = DelayRange::parse)]
    delay_ms: DelayRange,
    /// Cap on body bytes per second, both directions and all connections together, such as
    /// 10MiB or 5MB; 0 is unlimited.
    #[arg(long, default_value = "0", value_parser = parse_bandwidth)]
    bandwidth: u64,
    /// The probability in 0..=1 that a request is faulted.
    #[arg(long, default_value = "0", value_parser = parse_fault_rate)]
    fault_rate: f64,
    /// The faults drawn from, uniformly: 503 (SlowDown), 500 (InternalError), reset (before
    /// forwarding or mid-body, by a coin flip), reset-before, reset-mid-body.
    #[arg(long, default_value = "503,500,reset", value_delimiter = ',', value_parser = FaultKind::parse)]
    faults: Vec<FaultKind>,
    /// Fault only requests whose `METHOD TARGET` contains this text, such as
    /// `POST /bucket/key?uploadId=` (the completions of multipart uploads of one key).
    #[arg(long)]
    fault_match: Option<String>,
    /// The most faults injected in all; none: no limit.
    #[arg(long)]
    fault_limit: Option<u64>,
    /// Seeds the fault and delay draws, so that runs repeat.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Client connections served at once; more are refused.
    #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT)]
    connections_max: usize,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let config = Config {
        listen: arguments.listen,
        upstream: arguments.upstream,
        settings: Settings {
            delay: arguments.delay_ms,
            bandwidth_bytes_per_second: arguments.bandwidth,
            fault_rate: arguments.fault_rate,
            faults: arguments.faults,
            fault_match: arguments.fault_match.unwrap_or_default(),
            faults_left: arguments.fault_limit,
        },
        seed: arguments.seed,
        connections_max: arguments.connections_max,
    };
    let proxy = match start(config) {
        Ok(proxy) => proxy,
        Err(error) => {
            eprintln!("hydrant-fault-proxy: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout();
    // Tests read this line to learn the port, so it is flushed before anything else happens.
    if writeln!(stdout, "listening on {}", proxy.addr())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    loop {
        std::thread::park();
    }
}
