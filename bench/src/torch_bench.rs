//! A PyTorch DataLoader over shard objects on an S3 origin that answers like S3 Standard
//! (50–150 ms per request through hydrant-fault-proxy), in the same run: through hydrant
//! (`hydrant.torch.ShardDataset`: a cold epoch — read through from the origin — with each
//! worker announcing its order to the server (loader-order prefetch), a cold epoch of other
//! shards of the same sizes without, then a warm epoch) against s3torchconnector's
//! `S3IterableDataset` reading the origin directly. Same shards,
//! same DataLoader workers, same simulated accelerator compute per sample
//! (`bench/scripts/torch_loader_bench.py`).

use std::path::PathBuf;

use bytes::Bytes;
use hydrant_server::Server;

use crate::origin_bench::{
    create_bucket, fill_origin, server_config_over_origin, start_slow_origin,
};

#[derive(clap::Args)]
pub struct TorchArgs {
    /// The S3-compatible server (e.g. `moto_server -p 5599`), as HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:5599")]
    s3: String,
    /// Per-request origin latency, MIN-MAX milliseconds (S3 Standard: 50-150).
    #[arg(long, default_value = "50-150")]
    delay_ms: String,
    /// Shards (one sample each).
    #[arg(long, default_value_t = 1000)]
    shards: usize,
    /// Bytes of each shard, in KiB.
    #[arg(long, default_value_t = 1024)]
    shard_kib: usize,
    /// DataLoader workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Simulated accelerator time per sample, milliseconds.
    #[arg(long, default_value_t = 1.0)]
    compute_ms: f64,
    /// Where the data file goes (it is formatted).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// MiB of a state dict saved with DCP through hydrant and straight to the origin (DCP's
    /// FileSystemWriter over boto3's transfer manager, `bench/scripts/dcp_save_bench.py`;
    /// s3torchconnector's DCP writer fails against moto's server: "Header ETag not found"), and
    /// with hydrant.torch.save against torch.save into a local file with fsync
    /// (`bench/scripts/torch_save_bench.py`); 0 (the default): no checkpoint measurement.
    #[arg(long, default_value_t = 0)]
    dcp_mib: u64,
    /// The Python interpreter with torch, s3torchconnector and the hydrant package.
    #[arg(long, default_value = "python3")]
    python: String,
}

/// (samples per second, utilisation) of one epoch.
fn epoch(args: &TorchArgs, mode: &str, endpoint: &str, prefix: &str) -> Result<(f64, f64), String> {
    let printed = crate::script::run(
        &args.python,
        "torch_loader_bench.py",
        &[
            mode.to_string(),
            endpoint.to_string(),
            prefix.to_string(),
            args.workers.to_string(),
            args.compute_ms.to_string(),
        ],
        &format!("the {mode} loader"),
        "pip install torch s3torchconnector ./python",
    )?;
    let samples: usize = printed.field("samples")?;
    if samples != args.shards {
        return Err(format!(
            "the {mode} loader read {samples} samples of {}",
            args.shards
        ));
    }
    let bytes: usize = printed.field("bytes")?;
    if bytes != args.shards * (args.shard_kib << 10) {
        return Err(format!("the {mode} loader read {bytes} bytes"));
    }
    Ok((
        printed.field("samples_per_second")?,
        printed.field("utilisation")?,
    ))
}

pub fn torch(args: TorchArgs) -> Result<(), String> {
    let bucket = format!("torch-{}", std::process::id());
    create_bucket(&args.s3, &bucket)?;
    let shard_bytes = args.shard_kib << 10;
    // Two sets of the same shards: one read cold with plans, one without.
    for prefix in ["train", "unplanned"] {
        fill_origin(
            &args.s3,
            &bucket,
            args.shards,
            move |index| format!("{prefix}/shard-{index:05}"),
            move |index| Bytes::from(vec![(index % 251) as u8; shard_bytes]),
        )?;
    }
    let (proxy, origin_endpoint) = start_slow_origin(&args.s3, &args.delay_ms)?;
    // Four checkpoints: DCP's and torch.save's, over TCP and through the same-host socket.
    let checkpoint_bytes = args.dcp_mib << 22;
    let data_bytes = (args.shards * (shard_bytes + 8192)) as u64 * 4 + checkpoint_bytes + (1 << 30);
    // Room for every checkpoint in the dirty budget: each save is acknowledged at NVMe speed
    // and drains to the origin after (what write-back is for).
    let mut config = server_config_over_origin(
        &args.dir.join("torch-bench.hyd"),
        data_bytes,
        &bucket,
        Some(checkpoint_bytes + (512 << 20)),
    )?;
    let socket = args
        .dir
        .join(format!("torch-bench-{}.sock", std::process::id()));
    config.local_socket = Some(socket.clone());
    let server = Server::start(config)?;
    let socket = socket.display().to_string();
    let address = server.address().to_string();
    println!(
        "{} shards of {} KiB, {} DataLoader workers, {} ms of compute per sample, origin at {} ms per request",
        args.shards, args.shard_kib, args.workers, args.compute_ms, args.delay_ms
    );
    let direct = epoch(
        &args,
        "s3torchconnector",
        &origin_endpoint,
        &format!("s3://{bucket}/train/"),
    )?;
    let unplanned = epoch(&args, "hydrant-unplanned", &address, "data/unplanned/")?;
    let cold = epoch(&args, "hydrant", &address, "data/train/")?;
    let warm = epoch(&args, "hydrant", &address, "data/train/")?;
    println!("| loader | samples/s | accelerator busy | vs s3torchconnector |");
    println!("|---|---:|---:|---:|");
    for (name, (rate, busy)) in [
        (
            "s3torchconnector S3IterableDataset, the origin directly",
            direct,
        ),
        (
            "hydrant ShardDataset, cold epoch, no plan (read through as asked)",
            unplanned,
        ),
        (
            "hydrant ShardDataset, cold epoch, loader-order prefetch",
            cold,
        ),
        ("hydrant ShardDataset, epoch 2 (warm)", warm),
    ] {
        println!(
            "| {name} | {rate:.1} | {:.0}% | {:.2}x |",
            busy * 100.0,
            rate / direct.0
        );
    }
    println!("hydrant warm/s3torchconnector = {:.1}", warm.0 / direct.0);
    println!("hydrant cold/s3torchconnector = {:.2}", cold.0 / direct.0);
    println!(
        "hydrant cold planned/unplanned = {:.2}",
        cold.0 / unplanned.0
    );
    if args.dcp_mib > 0 {
        let save = |mode: &str, endpoint: &str, checkpoint: &str| -> Result<f64, String> {
            crate::script::run(
                &args.python,
                "dcp_save_bench.py",
                &[
                    mode.to_string(),
                    endpoint.to_string(),
                    checkpoint.to_string(),
                    args.dcp_mib.to_string(),
                    socket.clone(),
                    // One save per process: a second would wait for the first's upload to
                    // moto, on the same two cores, and hold twice the bytes in moto's memory.
                    "1".to_string(),
                ],
                &format!("the {mode} DCP save"),
                "pip install torch boto3 ./python",
            )?
            .field("seconds")
        };
        // Each save through hydrant starts once the one before it is at the origin, so that
        // none is measured against another's upload.
        let drain = || -> Result<(), String> {
            let mut client = hydrant_client::Client::connect(
                std::slice::from_ref(&address),
                std::time::Duration::from_secs(30),
            )
            .map_err(|error| error.to_string())?;
            client
                .flush(Some("data"), "ckpt/", std::time::Duration::from_secs(3600))
                .map_err(|error| format!("waiting for the checkpoints' upload: {error}"))
        };
        let through = save("hydrant", &address, "hydrant://data/ckpt/step-1")?;
        drain()?;
        let local = save("hydrant-local", &address, "hydrant://data/ckpt/step-2")?;
        drain()?;
        let direct = save(
            "boto3",
            &origin_endpoint,
            &format!("s3://{bucket}/ckpt-direct/step-1"),
        )?;
        println!(
            "DCP save of {} MiB until it returns: hydrant {through:.2} s (same-host socket {local:.2} s), boto3 straight to the origin {direct:.2} s",
            args.dcp_mib
        );
        println!("dcp save direct/hydrant = {:.2}", direct / through);
        println!("dcp save direct/hydrant same-host = {:.2}", direct / local);
        // The same state through hydrant.torch.save, against torch.save into a local file on
        // the same disk with fsync: what a job does without hydrant.
        let torch_save = |mode: &str, endpoint: &str, target: &str| -> Result<f64, String> {
            crate::script::run(
                &args.python,
                "torch_save_bench.py",
                &[
                    mode.to_string(),
                    endpoint.to_string(),
                    target.to_string(),
                    args.dcp_mib.to_string(),
                    socket.clone(),
                    // One save per process: a second would wait for the first's upload to
                    // moto, on the same two cores, and hold twice the bytes in moto's memory.
                    "1".to_string(),
                ],
                &format!("the {mode} torch.save"),
                "pip install torch ./python",
            )?
            .field("seconds")
        };
        let local_file = args.dir.join("torch-save-bench.pt");
        let through = torch_save("hydrant", &address, "data/ckpt/torch-save.pt")?;
        drain()?;
        let same_host = torch_save("hydrant-local", &address, "data/ckpt/torch-save-2.pt")?;
        let local = torch_save("file", "-", &local_file.display().to_string())?;
        let _ = std::fs::remove_file(&local_file);
        println!(
            "torch.save of {} MiB until it returns: hydrant {through:.2} s (same-host socket {same_host:.2} s), a local file with fsync {local:.2} s",
            args.dcp_mib
        );
        println!("torch save local/hydrant = {:.2}", local / through);
        println!(
            "torch save local/hydrant same-host = {:.2}",
            local / same_host
        );
    }
    let stats = proxy.stats();
    println!(
        "origin requests seen by the proxy: {} ({} GET)",
        stats.total.requests,
        stats.method(hydrant_fault_proxy::Method::Get).requests
    );
    server.stop().map_err(|error| error.to_string())?;
    Ok(())
}
