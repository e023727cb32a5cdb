//! hydrant-server against memcached on the same loopback: GETs of 4 KiB values, the same number
//! of client threads and connections, each thread one request at a time. The server (and
//! memcached, one worker thread) on one core, the load on the other.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hydrant_client::Client;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::memcached::MemcachedConnection;

#[derive(Args)]
pub struct ServerArgs {
    /// Directory for the server's data file (overwritten).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Client threads, one connection each.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Distinct keys read at random (loaded one put at a time before measuring).
    #[arg(long, default_value_t = 2_000)]
    keys: usize,
    #[arg(long, default_value_t = 4096)]
    value_bytes: usize,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Core for the servers; the load runs on the others.
    #[arg(long, default_value_t = 0)]
    server_cpu: usize,
}

const MEMCACHED_PORT: u16 = 21_211;

fn memcached_address() -> String {
    format!("127.0.0.1:{MEMCACHED_PORT}")
}

/// Keep a load thread off the servers' core.
pub(crate) fn pin_current_thread_away_from(cpu: usize) {
    let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
    let mut set = CpuSet::new();
    for other in (0..cpus).filter(|&other| other != cpu || cpus == 1) {
        let _ = set.set(other);
    }
    let _ = sched_setaffinity(Pid::from_raw(0), &set);
}

fn value_of(index: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|offset| ((index * 31 + offset) % 251) as u8)
        .collect()
}

/// A connection's get: the key's index in, the value's length out.
type Getter = Box<dyn FnMut(usize) -> Result<usize, String> + Send>;

/// Run `connections` threads, each with its own connection from `connect`, getting random keys
/// for `seconds`; returns gets per second.
fn measure(
    connections: usize,
    keys: usize,
    seconds: u64,
    server_cpu: usize,
    connect: impl Fn() -> Result<Getter, String>,
) -> Result<f64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut getters = Vec::new();
    for _ in 0..connections {
        getters.push(connect()?);
    }
    let started = Instant::now();
    for (thread, mut getter) in getters.into_iter().enumerate() {
        let done = done.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            pin_current_thread_away_from(server_cpu);
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (thread as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                getter((state % keys as u64) as usize)?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle
            .join()
            .map_err(|_| "a load thread panicked".to_string())??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

fn start_memcached(cpu: usize) -> Result<Child, String> {
    let child = Command::new("taskset")
        .args([
            "-c",
            &cpu.to_string(),
            "memcached",
            "-U",
            "0",
            "-t",
            "1",
            "-m",
            "1024",
            "-l",
            "127.0.0.1",
            "-p",
        ])
        .arg(MEMCACHED_PORT.to_string())
        .args(["-u", "root"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| {
            format!("cannot start memcached (apt-get install -y memcached): {error}")
        })?;
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", MEMCACHED_PORT)).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("memcached did not start listening".into())
}

pub fn server(args: ServerArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("server-bench.hyd");
    let _ = std::fs::remove_file(&path);
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(&path, 1 << 30)]);
    engine.shards = Some(1);
    engine.format = FormatPolicy::Always;
    engine.cpus = Some(vec![args.server_cpu]);
    let server = Server::start(ServerConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        engine,
    ))?;
    let address = vec![server.address().to_string()];
    let mut memcached = start_memcached(args.server_cpu)?;

    // Load the same keys and values into both.
    let mut loader =
        Client::connect(&address, Duration::from_secs(30)).map_err(|error| error.to_string())?;
    let mut memcached_loader =
        MemcachedConnection::connect(&memcached_address(), Duration::from_secs(30))
            .map_err(|error| error.to_string())?;
    for index in 0..args.keys {
        let value = value_of(index, args.value_bytes);
        loader
            .put("bench", &format!("k{index}"), &value)
            .map_err(|error| error.to_string())?;
        memcached_loader
            .set(&format!("k{index}"), &value)
            .map_err(|error| error.to_string())?;
    }

    println!(
        "| round | memcached get/s | hydrant get/s | ratio |  ({} connections, {} keys of {} bytes, server core {})",
        args.connections, args.keys, args.value_bytes, args.server_cpu
    );
    println!("|---|---|---|---|");
    let mut ratios = Vec::new();
    let value_bytes = args.value_bytes;
    for round in 1..=args.rounds {
        let measure_memcached = || {
            measure(
                args.connections,
                args.keys,
                args.seconds,
                args.server_cpu,
                || {
                    let mut connection =
                        MemcachedConnection::connect(&memcached_address(), Duration::from_secs(30))
                            .map_err(|error| error.to_string())?;
                    Ok(Box::new(move |key| {
                        match connection.get(&format!("k{key}")) {
                            Ok(Some(value)) if value.len() == value_bytes => Ok(value.len()),
                            Ok(value) => Err(format!(
                                "memcached k{key}: {:?} bytes",
                                value.map(<[u8]>::len)
                            )),
                            Err(error) => Err(error.to_string()),
                        }
                    }))
                },
            )
        };
        let measure_hydrant = || {
            measure(
                args.connections,
                args.keys,
                args.seconds,
                args.server_cpu,
                || {
                    let mut client = Client::connect(&address, Duration::from_secs(30))
                        .map_err(|error| error.to_string())?;
                    // Into a buffer kept from get to get, as the memcached client reads into its
                    // own; the payload's checksum is still checked.
                    let mut value = vec![0u8; value_bytes];
                    Ok(Box::new(move |key| {
                        let (_, read) = client
                            .get_into("bench", &format!("k{key}"), None, &mut value)
                            .map_err(|error| error.to_string())?;
                        if read != value_bytes {
                            return Err(format!("hydrant k{key}: {read} bytes"));
                        }
                        Ok(read)
                    }))
                },
            )
        };
        // Odd rounds measure memcached first, even rounds hydrant first, so a machine whose
        // speed drifts within a round favours neither.
        let (memcached_rate, hydrant_rate) = if round % 2 == 1 {
            let memcached_rate = measure_memcached()?;
            (memcached_rate, measure_hydrant()?)
        } else {
            let hydrant_rate = measure_hydrant()?;
            (measure_memcached()?, hydrant_rate)
        };
        let ratio = hydrant_rate / memcached_rate;
        println!("| {round} | {memcached_rate:.0} | {hydrant_rate:.0} | {ratio:.2} |");
        ratios.push(ratio);
    }
    ratios.sort_by(|left, right| left.total_cmp(right));
    let _ = memcached.kill();
    let _ = memcached.wait();
    server.stop().map_err(|error| error.to_string())?;
    let _ = std::fs::remove_file(&path);
    println!("hydrant/memcached get4k={:.2}", ratios[ratios.len() / 2]);
    Ok(())
}
