//! hydrant in front of an S3 origin that answers like S3 Standard (50–150 ms per request, through
//! hydrant-fault-proxy in front of a local S3-compatible server), against the same origin used
//! directly, in the same run:
//!
//! - checkpoint: a burst of large PUTs by several writers; hydrant in write-back (time until
//!   every PUT is acknowledged, and until FLUSH returns) vs the same PUTs straight to the origin;
//! - dataset: shard objects read by N readers, first epoch (cold) and second (warm) through
//!   hydrant vs straight from the origin.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hydrant_client::Client;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{
    BucketOrigin, EngineConfig, FormatPolicy, OriginConfig, Revalidate, WriteMode,
};
use hydrant_fault_proxy::{DelayRange, ProxyHandle};
use hydrant_server::{Server, ServerConfig};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};

#[derive(clap::Args)]
pub struct OriginArgs {
    /// The S3-compatible server (e.g. `moto_server -p 5599`), as HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:5599")]
    s3: String,
    /// Per-request origin latency, MIN-MAX milliseconds (S3 Standard: 50-150).
    #[arg(long, default_value = "50-150")]
    delay_ms: String,
    /// Checkpoint: total bytes, written as objects of `--checkpoint-object-mib`.
    #[arg(long, default_value_t = 1024)]
    checkpoint_mib: u64,
    #[arg(long, default_value_t = 64)]
    checkpoint_object_mib: u64,
    /// Dataset: total bytes, as shard objects of `--shard-mib`.
    #[arg(long, default_value_t = 1024)]
    dataset_mib: u64,
    #[arg(long, default_value_t = 4)]
    shard_mib: u64,
    /// Concurrent writers and readers (simulated GPU data loaders).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Where the data file goes (it is formatted).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Cap the proxy's bandwidth (both paths cross it) at this many bytes per second (`40MiB`):
    /// the checkpoint then also reports hydrant's upload rate against the cap. Default: none.
    #[arg(long)]
    bandwidth: Option<String>,
}

pub(crate) fn s3_store(endpoint: &str, bucket: &str) -> Result<AmazonS3, String> {
    AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("bench")
        .with_secret_access_key("bench")
        .build()
        .map_err(|error| error.to_string())
}

pub(crate) fn create_bucket(s3: &str, bucket: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(s3).map_err(|error| format!("{s3}: {error}"))?;
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {s3}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|error| error.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|error| error.to_string())?;
    if answer.starts_with("HTTP/1.1 200") || answer.contains("BucketAlreadyOwnedByYou") {
        Ok(())
    } else {
        Err(format!("cannot create bucket {bucket}: {answer}"))
    }
}

fn payload(seed: u64, bytes: usize) -> Bytes {
    let mut data = vec![0u8; bytes];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for word in data.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
    Bytes::from(data)
}

async fn put_direct(store: &AmazonS3, key: &str, data: Bytes) -> Result<(), String> {
    let path = Path::from(key);
    if data.len() <= 16 << 20 {
        store
            .put(&path, PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    } else {
        let upload = store
            .put_multipart(&path)
            .await
            .map_err(|error| error.to_string())?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, 16 << 20);
        writer.put(data);
        writer
            .finish()
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    }
}

/// Run `work(client_index)` on `clients` threads at once; the wall time of the slowest.
fn parallel<F>(clients: usize, work: F) -> Result<Duration, String>
where
    F: Fn(usize) -> Result<(), String> + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|index| {
            let work = work.clone();
            std::thread::spawn(move || work(index))
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a client thread panicked")??;
    }
    Ok(started.elapsed())
}

/// Put `count` objects into `bucket` of the S3 server at `s3` directly (not through the slow
/// proxy: loading is not what is measured), 8 at a time: object `index` is named `name(index)`
/// and holds `make(index)`.
pub(crate) fn fill_origin(
    s3: &str,
    bucket: &str,
    count: usize,
    name: impl Fn(usize) -> String + Send + Sync + 'static,
    make: impl Fn(usize) -> Bytes + Send + Sync + 'static,
) -> Result<(), String> {
    let store = Arc::new(s3_store(&format!("http://{s3}"), bucket)?);
    let (name, make) = (Arc::new(name), Arc::new(make));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let (store, name, make) = (store.clone(), name.clone(), make.clone());
            tasks.push(tokio::spawn(async move {
                for index in (worker..count).step_by(8) {
                    store
                        .put(&Path::from(name(index)), PutPayload::from(make(index)))
                        .await
                        .map_err(|error| error.to_string())?;
                }
                Ok::<(), String>(())
            }));
        }
        for task in tasks {
            task.await.map_err(|error| error.to_string())??;
        }
        Ok::<(), String>(())
    })
}

/// A server (with an S3 endpoint) whose bucket `data` reads through from and writes back to
/// `s3://{bucket}` at the origin `start_slow_origin` pointed this process at; its data file is
/// `file`, formatted with `data_bytes`; the dirty budget holds `dirty_bytes_max` when given.
pub(crate) fn server_over_origin(
    file: &std::path::Path,
    data_bytes: u64,
    bucket: &str,
    dirty_bytes_max: Option<u64>,
) -> Result<Server, String> {
    Server::start(server_config_over_origin(
        file,
        data_bytes,
        bucket,
        dirty_bytes_max,
    )?)
}

/// The configuration `server_over_origin` starts, for a bench that adds to it.
pub(crate) fn server_config_over_origin(
    file: &std::path::Path,
    data_bytes: u64,
    bucket: &str,
    dirty_bytes_max: Option<u64>,
) -> Result<ServerConfig, String> {
    if let Some(directory) = file.parent() {
        std::fs::create_dir_all(directory).map_err(|error| error.to_string())?;
    }
    let _ = std::fs::remove_file(file);
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(file, data_bytes)]);
    engine.format = FormatPolicy::Always;
    let mut origins = OriginConfig::new();
    if let Some(bytes) = dirty_bytes_max {
        origins.dirty_bytes_max = bytes;
        origins.dirty_bytes_low = bytes / 4 * 3;
    }
    origins.buckets.insert(
        "data".into(),
        BucketOrigin {
            url: format!("s3://{bucket}"),
            write: WriteMode::Back,
            revalidate: Revalidate::Immutable,
            settings: Default::default(),
        },
    );
    engine.origins = Some(origins);
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("address"), engine);
    config.s3 = Some(hydrant_server::s3::S3Config::new(
        "127.0.0.1:0".parse().expect("address"),
    ));
    Ok(config)
}

/// Start hydrant-fault-proxy in front of the S3 server at `s3`, delaying every request by
/// `delay_ms` (MIN-MAX milliseconds), and point this process's AWS variables at it: an in-process
/// hydrant server's origin client reads them, as in production. Returns the proxy and its
/// endpoint URL, which direct clients use too, so both paths cross the same proxy.
pub(crate) fn start_slow_origin(s3: &str, delay_ms: &str) -> Result<(ProxyHandle, String), String> {
    let mut config = hydrant_fault_proxy::Config::new(s3.to_string());
    config.settings.delay = DelayRange::parse(delay_ms).map_err(|error| error.message)?;
    let proxy: ProxyHandle =
        hydrant_fault_proxy::start(config).map_err(|error| error.to_string())?;
    let endpoint = format!("http://{}", proxy.addr());
    for (name, value) in [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "bench"),
        ("AWS_SECRET_ACCESS_KEY", "bench"),
        ("AWS_REGION", "us-east-1"),
    ] {
        std::env::set_var(name, value);
    }
    Ok((proxy, endpoint))
}

pub fn origin(args: OriginArgs) -> Result<(), String> {
    let bucket = format!("bench-{}", std::process::id());
    create_bucket(&args.s3, &bucket)?;
    let (proxy, endpoint) = start_slow_origin(&args.s3, &args.delay_ms)?;
    let cap = match &args.bandwidth {
        Some(text) => {
            let update =
                hydrant_fault_proxy::ConfigUpdate::from_query(&format!("bandwidth={text}"))
                    .map_err(|error| error.to_string())?;
            let cap = update.bandwidth_bytes_per_second;
            proxy
                .set_config(update)
                .map_err(|error| error.to_string())?;
            cap
        }
        None => None,
    };
    let data_bytes = (args.checkpoint_mib + args.dataset_mib) * 3 / 2 * (1 << 20) + (1 << 30);
    let server = server_over_origin(
        &args.dir.join("origin-bench.hyd"),
        data_bytes,
        &bucket,
        Some((args.checkpoint_mib << 20) + (256 << 20)),
    )?;
    let address = vec![server.address().to_string()];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let direct = Arc::new(s3_store(&endpoint, &bucket)?);
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;

    // ----- checkpoint -----
    let object_bytes = (args.checkpoint_object_mib << 20) as usize;
    let objects = (args.checkpoint_mib / args.checkpoint_object_mib).max(1) as usize;
    let total = (objects * object_bytes) as u64;
    println!(
        "checkpoint: {objects} objects of {} MiB by {} writers, origin at {} ms per request",
        args.checkpoint_object_mib, args.clients, args.delay_ms
    );
    // When the first PUT was acknowledged (write-back can start uploading from then).
    let first_ack = Arc::new(std::sync::Mutex::new(None::<Duration>));
    let hydrant_acked = {
        let address = address.clone();
        let clients = args.clients;
        let first_ack = first_ack.clone();
        let started = Instant::now();
        parallel(args.clients, move |writer| {
            let mut client = Client::connect(&address, Duration::from_secs(600))
                .map_err(|error| error.to_string())?;
            for index in (writer..objects).step_by(clients) {
                let data = payload(index as u64, object_bytes);
                client
                    .put("data", &format!("ckpt/hydrant/{index}"), &data)
                    .map_err(|error| error.to_string())?;
                let mut first = first_ack.lock().expect("first ack");
                let now = started.elapsed();
                *first = Some(first.map_or(now, |first| first.min(now)));
            }
            Ok(())
        })?
    };
    let first_ack = first_ack
        .lock()
        .expect("first ack")
        .unwrap_or(Duration::ZERO);
    let flush_started = Instant::now();
    Client::connect(&address, Duration::from_secs(600))
        .and_then(|mut client| client.flush(Some("data"), "ckpt/", Duration::from_secs(3600)))
        .map_err(|error| error.to_string())?;
    let hydrant_flushed = hydrant_acked + flush_started.elapsed();
    let direct_time = {
        let started = Instant::now();
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for writer in 0..args.clients {
                let direct = direct.clone();
                let clients = args.clients;
                tasks.push(tokio::spawn(async move {
                    for index in (writer..objects).step_by(clients) {
                        let data = payload(index as u64, object_bytes);
                        put_direct(&direct, &format!("ckpt/direct/{index}"), data).await?;
                    }
                    Ok::<(), String>(())
                }));
            }
            for task in tasks {
                task.await.map_err(|error| error.to_string())??;
            }
            Ok::<(), String>(())
        })?;
        started.elapsed()
    };
    println!("| path | seconds | MiB/s | vs origin |");
    println!("|---|---:|---:|---:|");
    for (name, time) in [
        ("hydrant write-back, all PUTs acknowledged", hydrant_acked),
        ("hydrant write-back, FLUSH returned", hydrant_flushed),
        ("origin directly", direct_time),
    ] {
        println!(
            "| {name} | {:.2} | {:.0} | {:.2}x |",
            time.as_secs_f64(),
            mib(total) / time.as_secs_f64(),
            direct_time.as_secs_f64() / time.as_secs_f64()
        );
    }

    if let Some(cap) = cap {
        // The upload runs from the first acknowledgement to FLUSH's return.
        let rate = total as f64 / (hydrant_flushed - first_ack).as_secs_f64();
        let direct_rate = total as f64 / direct_time.as_secs_f64();
        println!(
            "upload rate against the cap of {:.1} MiB/s: hydrant {:.2} ({:.1} MiB/s), origin directly {:.2}",
            mib(cap),
            rate / cap as f64,
            mib(rate as u64),
            direct_rate / cap as f64
        );
    }

    // ----- dataset -----
    let shard_bytes = (args.shard_mib << 20) as usize;
    let shards = (args.dataset_mib / args.shard_mib).max(1) as usize;
    println!(
        "\ndataset: {shards} shards of {} MiB read by {} readers",
        args.shard_mib, args.clients
    );
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for loader in 0..args.clients {
            let direct = direct.clone();
            let clients = args.clients;
            tasks.push(tokio::spawn(async move {
                for index in (loader..shards).step_by(clients) {
                    let data = payload(10_000 + index as u64, shard_bytes);
                    put_direct(&direct, &format!("train/shard-{index:05}"), data).await?;
                }
                Ok::<(), String>(())
            }));
        }
        for task in tasks {
            task.await.map_err(|error| error.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    let read_epoch = |label: &str| -> Result<Duration, String> {
        let address = address.clone();
        let clients = args.clients;
        let time = parallel(args.clients, move |reader| {
            let mut client = Client::connect(&address, Duration::from_secs(600))
                .map_err(|error| error.to_string())?;
            for index in (reader..shards).step_by(clients) {
                let (_, data) = client
                    .get("data", &format!("train/shard-{index:05}"), None)
                    .map_err(|error| error.to_string())?;
                if data.len() != shard_bytes {
                    return Err(format!("shard {index}: {} bytes", data.len()));
                }
            }
            Ok(())
        })?;
        eprintln!("{label}: {:.2} s", time.as_secs_f64());
        Ok(time)
    };
    let cold = read_epoch("hydrant epoch 1")?;
    let warm = read_epoch("hydrant epoch 2")?;
    let direct_read = {
        let started = Instant::now();
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for reader in 0..args.clients {
                let direct = direct.clone();
                let clients = args.clients;
                tasks.push(tokio::spawn(async move {
                    for index in (reader..shards).step_by(clients) {
                        let bytes = direct
                            .get(&Path::from(format!("train/shard-{index:05}")))
                            .await
                            .map_err(|error| error.to_string())?
                            .bytes()
                            .await
                            .map_err(|error| error.to_string())?;
                        if bytes.len() != shard_bytes {
                            return Err(format!("shard {index}: {} bytes", bytes.len()));
                        }
                    }
                    Ok::<(), String>(())
                }));
            }
            for task in tasks {
                task.await.map_err(|error| error.to_string())??;
            }
            Ok::<(), String>(())
        })?;
        started.elapsed()
    };
    let dataset = (shards * shard_bytes) as u64;
    println!("| path | seconds | MiB/s | vs origin |");
    println!("|---|---:|---:|---:|");
    for (name, time) in [
        ("hydrant, epoch 1 (cold)", cold),
        ("hydrant, epoch 2 (warm)", warm),
        ("origin directly", direct_read),
    ] {
        println!(
            "| {name} | {:.2} | {:.0} | {:.2}x |",
            time.as_secs_f64(),
            mib(dataset) / time.as_secs_f64(),
            direct_read.as_secs_f64() / time.as_secs_f64()
        );
    }
    let stats = proxy.stats();
    println!(
        "\norigin requests seen by the proxy: {} ({} GET, {} PUT, {} POST)",
        stats.total.requests,
        stats.method(hydrant_fault_proxy::Method::Get).requests,
        stats.method(hydrant_fault_proxy::Method::Put).requests,
        stats.method(hydrant_fault_proxy::Method::Post).requests
    );
    server.stop().map_err(|error| error.to_string())?;
    Ok(())
}
