//! hydrant-server against nginx, GETs on loopback, in the same run, through both of hydrant's
//! front doors: its S3 endpoint (the same HTTP GETs, by the same load tool, as nginx gets) and its
//! native protocol:
//!
//! - from the device: hydrant's NVMe tier (DRAM tier off; every read is O_DIRECT through
//!   io_uring) against nginx serving the same bytes from files on the same disk with `directio`
//!   and `aio threads` (O_DIRECT reads in nginx's thread pool);
//! - from memory: hydrant's DRAM tier against nginx serving from the page cache (`sendfile`).
//!
//! For each object size (1 MiB and 4 KiB by default). Both servers (hydrant's shard and its S3
//! gateway) on one core, the load on the other: wrk for nginx and for the S3 endpoint (16
//! connections, a random object per request), the same number of threads with a blocking
//! hydrant-client each for the native protocol, one request at a time per connection.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydrant_client::Client;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};

const NGINX_PORT: u16 = 21_280;

#[derive(clap::Args)]
pub struct NginxArgs {
    /// Objects of each size served by all three.
    #[arg(long, default_value_t = 512)]
    objects: usize,
    /// Object sizes in bytes, comma-separated; each is measured in both tiers.
    #[arg(long, value_delimiter = ',', default_value = "1048576,4096")]
    sizes: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Alternating rounds; the median ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Client connections (wrk's, and hydrant-client threads).
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// The core both servers run on; the load runs on the others.
    #[arg(long, default_value_t = 0)]
    server_cpu: usize,
    /// Where the files and hydrant's data file go (on the disk to measure).
    #[arg(long, default_value = "target/bench-scratch/nginx")]
    dir: PathBuf,
    /// hydrant's bound on device bytes in flight per shard (the server's
    /// --io-bytes-in-flight). Default: the server's default, 8 MiB.
    #[arg(long)]
    io_bytes_in_flight: Option<u64>,
}

fn object_bytes(index: usize, size: usize) -> Vec<u8> {
    let mut data = vec![0u8; size];
    let mut state = (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ size as u64 | 1;
    for word in data.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
    data
}

fn io_error(error: std::io::Error) -> String {
    error.to_string()
}

/// nginx on `server_cpu`, serving `www` from the device (`direct`) or the page cache.
fn start_nginx(dir: &Path, www: &Path, direct: bool, server_cpu: usize) -> Result<Child, String> {
    let location = if direct {
        "directio 4k; directio_alignment 4k; aio threads; sendfile off; output_buffers 2 1m;"
    } else {
        "sendfile on; aio off; tcp_nopush on;"
    };
    let config = format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; keepalive_requests 1000000;\n\
           server {{ listen 127.0.0.1:{NGINX_PORT}; root {www};\n\
             location / {{ {location} }} }} }}\n",
        dir = dir.display(),
        www = www.display(),
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, config).map_err(io_error)?;
    let child = Command::new("taskset")
        .args(["-c", &server_cpu.to_string(), "nginx", "-c"])
        .arg(&path)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| format!("cannot start nginx (apt-get install -y nginx): {error}"))?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", NGINX_PORT)).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("nginx did not start listening".into())
}

/// wrk against `http://127.0.0.1:port/{prefix}obj-N` for `seconds`; GETs per second.
fn run_wrk(
    args: &NginxArgs,
    load_cpus: &str,
    port: u16,
    prefix: &str,
    size: usize,
) -> Result<f64, String> {
    let script = args.dir.join("random.lua");
    std::fs::write(
        &script,
        format!(
            "math.randomseed(os.time())\nrequest = function()\n  return wrk.format(\"GET\", \"/{prefix}obj-\" .. math.random(0, {}))\nend\n",
            args.objects - 1
        ),
    )
    .map_err(io_error)?;
    let output = Command::new("taskset")
        .args(["-c", load_cpus, "wrk", "-t2"])
        .arg(format!("-c{}", args.connections))
        .arg(format!("-d{}s", args.seconds))
        .arg("-s")
        .arg(&script)
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .map_err(|error| format!("cannot run wrk (apt-get install -y wrk): {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let requests: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix("Requests/sec:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| format!("wrk printed no rate:\n{text}"))?;
    if text.contains("Non-2xx") || text.contains("Socket errors") {
        return Err(format!("127.0.0.1:{port} answered errors:\n{text}"));
    }
    // wrk counts responses, not bytes of bodies: check that each was a whole object.
    let transfer = text
        .lines()
        .find_map(|line| line.strip_prefix("Transfer/sec:"))
        .and_then(parse_wrk_bytes)
        .ok_or_else(|| format!("wrk printed no transfer rate:\n{text}"))?;
    if transfer < requests * size as f64 * 0.99 {
        return Err(format!(
            "127.0.0.1:{port} sent {transfer:.0} bytes/s for {requests:.0} GETs/s of {size} bytes"
        ));
    }
    Ok(requests)
}

/// wrk's "1.23GB" / "456.78MB" / "9.1KB" as bytes.
fn parse_wrk_bytes(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let scale = match unit {
        "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// hydrant-client threads against hydrant's native protocol for `seconds`; GETs per second.
fn run_native(args: &NginxArgs, address: &str, size: usize) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let gets = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..args.connections)
        .map(|thread| {
            let stop = stop.clone();
            let gets = gets.clone();
            let address = address.to_string();
            let objects = args.objects;
            let server_cpu = args.server_cpu;
            std::thread::spawn(move || -> Result<(), String> {
                crate::server_bench::pin_current_thread_away_from(server_cpu);
                let mut client = Client::connect(&[address], Duration::from_secs(30))
                    .map_err(|error| error.to_string())?;
                let mut state = thread as u64 * 7919 + 1;
                // One buffer for every get, as wrk reads every body into its own buffer; the
                // payload's checksum is still checked.
                let mut object = vec![0u8; size];
                while !stop.load(Ordering::Relaxed) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let index = state as usize % objects;
                    let (_, read) = client
                        .get_into("www", &format!("obj-{index}"), None, &mut object)
                        .map_err(|error| error.to_string())?;
                    if read != size {
                        return Err(format!("hydrant obj-{index}: {read} bytes"));
                    }
                    gets.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for thread in threads {
        thread.join().map_err(|_| "a load thread panicked")??;
    }
    Ok(gets.load(Ordering::Relaxed) as f64 / elapsed)
}

/// hydrant with one shard and its S3 gateway on `server_cpu`.
fn start_hydrant(args: &NginxArgs, size: usize, dram_bytes: u64) -> Result<Server, String> {
    let path = args.dir.join("nginx-bench.hyd");
    let _ = std::fs::remove_file(&path);
    let data_bytes = (args.objects as u64 * (size as u64 + 8192)) * 2 + (512 << 20);
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(&path, data_bytes)]);
    engine.shards = Some(1);
    engine.format = FormatPolicy::Always;
    engine.cpus = Some(vec![args.server_cpu]);
    engine.dram_bytes = dram_bytes;
    if let Some(bytes) = args.io_bytes_in_flight {
        engine.io_bytes_in_flight_max = bytes;
    }
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("address"), engine);
    let mut s3 = hydrant_server::s3::S3Config::new("127.0.0.1:0".parse().expect("address"));
    s3.cpus = vec![args.server_cpu];
    config.s3 = Some(s3);
    Server::start(config)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|left, right| left.total_cmp(right));
    values[values.len() / 2]
}

/// "1 MiB", "4 KiB", "100 B".
fn size_name(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

/// The three contenders of one round.
#[derive(Clone, Copy)]
enum Contender {
    Nginx,
    S3,
    Native,
}

pub fn nginx(mut args: NginxArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(io_error)?;
    // nginx resolves relative paths against its prefix, not our working directory.
    args.dir = args.dir.canonicalize().map_err(io_error)?;
    let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
    let load_cpus: Vec<String> = (0..cpus)
        .filter(|&cpu| cpu != args.server_cpu || cpus == 1)
        .map(|cpu| cpu.to_string())
        .collect();
    let load_cpus = load_cpus.join(",");
    println!(
        "{} objects of each size; servers on core {}, load on {load_cpus}; {} connections; {} s per measurement",
        args.objects, args.server_cpu, args.connections, args.seconds
    );
    println!("| case | round | nginx GETs/s | hydrant S3 GETs/s | hydrant native GETs/s | S3/nginx | S3/native | native/nginx |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for size in args.sizes.clone() {
        let www = args.dir.join(format!("www-{size}"));
        std::fs::create_dir_all(&www).map_err(io_error)?;
        for index in 0..args.objects {
            let path = www.join(format!("obj-{index}"));
            if std::fs::metadata(&path).map_or(true, |meta| meta.len() != size as u64) {
                let mut file = std::fs::File::create(&path).map_err(io_error)?;
                file.write_all(&object_bytes(index, size))
                    .map_err(io_error)?;
                file.sync_all().map_err(io_error)?;
            }
        }
        for (tier, direct, dram_bytes) in [
            (
                "device: NVMe tier vs nginx directio + aio threads",
                true,
                0u64,
            ),
            ("memory: DRAM tier vs nginx page cache", false, 4 << 30),
        ] {
            let case = format!("{}, {tier}", size_name(size));
            let server = start_hydrant(&args, size, dram_bytes)?;
            let address = server.address().to_string();
            let s3_port = server.s3_address().expect("an S3 endpoint").port();
            let mut loader =
                Client::connect(std::slice::from_ref(&address), Duration::from_secs(60))
                    .map_err(|error| error.to_string())?;
            for index in 0..args.objects {
                loader
                    .put("www", &format!("obj-{index}"), &object_bytes(index, size))
                    .map_err(|error| error.to_string())?;
            }
            if !direct {
                // Warm both memories: the page cache and the DRAM tier (a read admits, a
                // second hits).
                for index in 0..args.objects {
                    let _ = std::fs::read(www.join(format!("obj-{index}")));
                    for _ in 0..2 {
                        loader
                            .get("www", &format!("obj-{index}"), None)
                            .map_err(|error| error.to_string())?;
                    }
                }
            }
            let mut nginx = start_nginx(&args.dir, &www, direct, args.server_cpu)?;
            let (mut s3_nginx, mut s3_native, mut native_nginx) = (vec![], vec![], vec![]);
            for round in 1..=args.rounds {
                // Each round starts with another of the three, so that a disk whose rate
                // drifts within a round favours none.
                let mut order = [Contender::Nginx, Contender::S3, Contender::Native];
                order.rotate_left(round % 3);
                let (mut nginx_rate, mut s3_rate, mut native_rate) = (0.0, 0.0, 0.0);
                for contender in order {
                    match contender {
                        Contender::Nginx => {
                            nginx_rate = run_wrk(&args, &load_cpus, NGINX_PORT, "", size)?
                        }
                        Contender::S3 => {
                            s3_rate = run_wrk(&args, &load_cpus, s3_port, "www/", size)?
                        }
                        Contender::Native => native_rate = run_native(&args, &address, size)?,
                    }
                }
                s3_nginx.push(s3_rate / nginx_rate);
                s3_native.push(s3_rate / native_rate);
                native_nginx.push(native_rate / nginx_rate);
                println!(
                    "| {case} | {round} | {nginx_rate:.0} | {s3_rate:.0} | {native_rate:.0} | {:.2} | {:.2} | {:.2} |",
                    s3_rate / nginx_rate,
                    s3_rate / native_rate,
                    native_rate / nginx_rate
                );
            }
            let _ = nginx.kill();
            let _ = nginx.wait();
            server.stop().map_err(io_error)?;
            medians.push(format!(
                "median hydrant/nginx ({case}) = {:.2}\nmedian hydrant-s3/nginx ({case}) = {:.2}\nmedian hydrant-s3/native ({case}) = {:.2}",
                median(&mut native_nginx),
                median(&mut s3_nginx),
                median(&mut s3_native)
            ));
        }
    }
    for line in medians {
        println!("{line}");
    }
    Ok(())
}
