//! The Python package's cost: GETs of 1 MiB and of 4 KiB objects by 16 threads, in the same
//! run against the same server and objects, through
//!
//! - `hydrant.Client` in Python (`bench/scripts/python_client_bench.py hydrant`: one shared
//!   client, each thread reading into its own buffer with `get_into`);
//! - the Rust client (`SharedClient::get_into`, the same number of threads) — what the Python
//!   layer adds is the difference;
//! - boto3 in Python through hydrant's S3 endpoint (the same script, `boto3`);
//! - with `--s3`, boto3 in Python reading the same objects straight from an S3 origin that
//!   answers like S3 Standard (the S3-compatible server behind hydrant-fault-proxy at 50–150 ms
//!   per request): what the user had before hydrant.
//!
//! Rounds alternate the order. The server runs in this process; every load shares the machine's
//! cores with it, so the figures are ratios.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydrant_client::{ClientConfig, SharedClient};
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};

#[derive(clap::Args)]
pub struct PythonArgs {
    /// Objects of each size.
    #[arg(long, default_value_t = 256)]
    objects: usize,
    /// Object sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1048576,4096")]
    sizes: Vec<usize>,
    /// Reader threads of each client.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 4)]
    seconds: u64,
    /// Alternating rounds; the median ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the data file goes (it is formatted).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// The Python interpreter that has the hydrant package (pip install ./python) and boto3.
    #[arg(long, default_value = "python3")]
    python: String,
    /// An S3-compatible server (e.g. `moto_server -p 5598`), HOST:PORT: boto3 also reads the
    /// objects from it through the latency proxy.
    #[arg(long)]
    s3: Option<String>,
    /// The origin's latency through the proxy, MIN-MAX milliseconds.
    #[arg(long, default_value = "50-150")]
    delay_ms: String,
}

fn python_rate(args: &PythonArgs, mode: &str, endpoint: &str, size: usize) -> Result<f64, String> {
    python_rate_bucket(args, mode, endpoint, "pybench", size)
}

fn python_rate_bucket(
    args: &PythonArgs,
    mode: &str,
    endpoint: &str,
    bucket: &str,
    size: usize,
) -> Result<f64, String> {
    crate::script::run(
        &args.python,
        "python_client_bench.py",
        &[
            mode.to_string(),
            endpoint.to_string(),
            bucket.to_string(),
            args.objects.to_string(),
            size.to_string(),
            args.threads.to_string(),
            args.seconds.to_string(),
        ],
        &format!("the Python reader ({mode})"),
        "pip install ./python boto3",
    )?
    .field("gets_per_second")
}

fn rust_rate(args: &PythonArgs, client: &SharedClient, size: usize) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let gets = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..args.threads)
        .map(|thread| {
            let (stop, gets, client) = (stop.clone(), gets.clone(), client.clone());
            let objects = args.objects;
            std::thread::spawn(move || -> Result<(), String> {
                let mut buffer = vec![0u8; size];
                let mut state = thread as u64 * 7919 + 1;
                while !stop.load(Ordering::Relaxed) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let key = format!("obj-{}", state as usize % objects);
                    let (_, read) = client
                        .get_into("pybench", &key, None, &mut buffer)
                        .map_err(|error| error.to_string())?;
                    if read != size {
                        return Err(format!("{key}: {read} bytes"));
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
        thread.join().map_err(|_| "a reader panicked")??;
    }
    Ok(gets.load(Ordering::Relaxed) as f64 / elapsed)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|left, right| left.total_cmp(right));
    values[values.len() / 2]
}

pub fn python(args: PythonArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    println!(
        "{} objects of each size, {} threads per client, {} s per measurement",
        args.objects, args.threads, args.seconds
    );
    println!("| size | round | Rust GETs/s | Python hydrant GETs/s | Python boto3 via S3 GETs/s | Python/Rust | Python/boto3 |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    // The origin: a bucket of the S3 server, read through the latency proxy.
    let origin = match &args.s3 {
        Some(s3) => {
            let bucket = format!("pybench-{}", std::process::id());
            crate::origin_bench::create_bucket(s3, &bucket)?;
            let (proxy, endpoint) = crate::origin_bench::start_slow_origin(s3, &args.delay_ms)?;
            Some((bucket, proxy, endpoint))
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let mut medians = Vec::new();
    for &size in &args.sizes {
        let path = args.dir.join("python-bench.hyd");
        let _ = std::fs::remove_file(&path);
        let data_bytes = (args.objects * (size + 8192)) as u64 * 2 + (512 << 20);
        let mut engine = EngineConfig::new(vec![DeviceConfig::create(&path, data_bytes)]);
        engine.format = FormatPolicy::Always;
        let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("address"), engine);
        config.s3 = Some(hydrant_server::s3::S3Config::new(
            "127.0.0.1:0".parse().expect("address"),
        ));
        let server = Server::start(config)?;
        let address = server.address().to_string();
        let s3 = format!("http://{}", server.s3_address().expect("an S3 endpoint"));
        let client = SharedClient::connect(
            ClientConfig::new(std::slice::from_ref(&address))
                .max_connections_per_node(args.threads),
        )
        .map_err(|error| error.to_string())?;
        let mut state = 0x9e37_79b9u64;
        let direct = match (&origin, &args.s3) {
            (Some((bucket, _, _)), Some(s3)) => Some(crate::origin_bench::s3_store(
                &format!("http://{s3}"),
                bucket,
            )?),
            _ => None,
        };
        for index in 0..args.objects {
            let data: Vec<u8> = (0..size)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if let Some(direct) = &direct {
                use object_store::ObjectStoreExt;
                runtime
                    .block_on(direct.put(
                        &object_store::path::Path::from(format!("obj-{index}")),
                        object_store::PutPayload::from(data.clone()),
                    ))
                    .map_err(|error| error.to_string())?;
            }
            client
                .put("pybench", &format!("obj-{index}"), &data)
                .map_err(|error| error.to_string())?;
        }
        let (mut python_rust, mut python_boto3) = (Vec::new(), Vec::new());
        let mut python_rates = Vec::new();
        for round in 1..=args.rounds {
            let mut rates = [0.0f64; 3];
            for turn in 0..3 {
                let which = (turn + round) % 3;
                rates[which] = match which {
                    0 => rust_rate(&args, &client, size)?,
                    1 => python_rate(&args, "hydrant", &address, size)?,
                    _ => python_rate(&args, "boto3", &s3, size)?,
                };
            }
            let [rust, python, boto3] = rates;
            python_rates.push(python);
            python_rust.push(python / rust);
            python_boto3.push(python / boto3);
            println!(
                "| {size} | {round} | {rust:.0} | {python:.0} | {boto3:.0} | {:.2} | {:.2} |",
                python / rust,
                python / boto3
            );
        }
        server.stop().map_err(|error| error.to_string())?;
        if let Some((bucket, _, endpoint)) = &origin {
            // One measurement: the origin's rate is set by its latency, not by noise.
            let from_origin = python_rate_bucket(&args, "boto3", endpoint, bucket, size)?;
            let python = median(&mut python_rates);
            println!(
                "| {size} | origin | boto3 straight from the origin: {from_origin:.0} GETs/s | Python hydrant / origin: {:.1} |",
                python / from_origin
            );
            medians.push(format!(
                "median python/origin ({size} bytes) = {:.1}",
                python / from_origin
            ));
        }
        medians.push(format!(
            "median python/rust ({size} bytes) = {:.2}\nmedian python/boto3-s3 ({size} bytes) = {:.2}",
            median(&mut python_rust),
            median(&mut python_boto3)
        ));
    }
    for line in medians {
        println!("{line}");
    }
    Ok(())
}
