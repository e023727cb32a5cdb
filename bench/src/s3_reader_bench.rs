//! The S3 user's view: a boto3 reader of a dataset of objects through hydrant's S3 endpoint
//! (warm: from NVMe and DRAM) against the same boto3 reader of the same objects straight from
//! an S3 origin that answers like S3 Standard (50–150 ms per request, hydrant-fault-proxy in
//! front of a local S3-compatible server), in the same run, rounds alternated.
//!
//! The reader is `bench/scripts/boto3_reader.py` (one boto3 client per thread, every object
//! read once, its bytes checked by CRC32 against the origin's).

use std::path::PathBuf;

use bytes::Bytes;

use crate::origin_bench::{create_bucket, fill_origin, server_over_origin, start_slow_origin};

#[derive(clap::Args)]
pub struct S3ReaderArgs {
    /// The S3-compatible server (e.g. `moto_server -p 5599`), as HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:5599")]
    s3: String,
    /// Per-request origin latency, MIN-MAX milliseconds (S3 Standard: 50-150).
    #[arg(long, default_value = "50-150")]
    delay_ms: String,
    /// Objects in the dataset.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Bytes of each object, in KiB.
    #[arg(long, default_value_t = 1024)]
    object_kib: usize,
    /// boto3 reader threads (one client each).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Alternating rounds of the warm read and the origin's; the median ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the data file goes (it is formatted).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// The Python interpreter that has boto3.
    #[arg(long, default_value = "python3")]
    python: String,
}

/// One pass of the boto3 reader: (seconds, bytes, crc).
fn read_all(
    args: &S3ReaderArgs,
    endpoint: &str,
    bucket: &str,
) -> Result<(f64, u64, String), String> {
    let printed = crate::script::run(
        &args.python,
        "boto3_reader.py",
        &[
            endpoint.to_string(),
            bucket.to_string(),
            "train/sample-".to_string(),
            args.objects.to_string(),
            args.threads.to_string(),
        ],
        &format!("the boto3 reader against {endpoint}"),
        "pip install boto3",
    )?;
    Ok((
        printed.field("seconds")?,
        printed.field("bytes")?,
        printed.field("crc")?,
    ))
}

fn sample(index: usize, bytes: usize) -> Bytes {
    let mut data = vec![0u8; bytes];
    let mut state = (index as u64 + 77).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for word in data.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
    Bytes::from(data)
}

pub fn s3_reader(args: S3ReaderArgs) -> Result<(), String> {
    let bucket = format!("reader-{}", std::process::id());
    create_bucket(&args.s3, &bucket)?;
    let object_bytes = args.object_kib << 10;
    fill_origin(
        &args.s3,
        &bucket,
        args.objects,
        |index| format!("train/sample-{index:05}"),
        move |index| sample(index, object_bytes),
    )?;
    let (proxy, origin_endpoint) = start_slow_origin(&args.s3, &args.delay_ms)?;
    let data_bytes = (args.objects * (object_bytes + 8192)) as u64 * 2 + (1 << 30);
    let server = server_over_origin(
        &args.dir.join("s3-reader-bench.hyd"),
        data_bytes,
        &bucket,
        None,
    )?;
    let hydrant_endpoint = format!("http://{}", server.s3_address().expect("an S3 endpoint"));

    println!(
        "{} objects of {} KiB, {} boto3 reader thread(s); origin at {} ms per request",
        args.objects, args.object_kib, args.threads, args.delay_ms
    );
    let (cold, cold_bytes, cold_crc) = read_all(&args, &hydrant_endpoint, "data")?;
    println!("| round | origin directly, s | hydrant warm, s | warm vs origin |");
    println!("|---|---:|---:|---:|");
    let mut ratios = Vec::new();
    let mut origin_times = Vec::new();
    for round in 1..=args.rounds {
        let pass = |endpoint: &str, bucket: &str| -> Result<f64, String> {
            let (seconds, bytes, crc) = read_all(&args, endpoint, bucket)?;
            if bytes != cold_bytes || crc != cold_crc {
                return Err(format!(
                    "{endpoint} answered {bytes} bytes (crc {crc}), the first pass {cold_bytes} (crc {cold_crc})"
                ));
            }
            Ok(seconds)
        };
        let (origin, warm) = if round % 2 == 1 {
            let origin = pass(&origin_endpoint, &bucket)?;
            (origin, pass(&hydrant_endpoint, "data")?)
        } else {
            let warm = pass(&hydrant_endpoint, "data")?;
            (pass(&origin_endpoint, &bucket)?, warm)
        };
        ratios.push(origin / warm);
        origin_times.push(origin);
        println!(
            "| {round} | {origin:.2} | {warm:.2} | {:.1}x |",
            origin / warm
        );
    }
    ratios.sort_by(|left, right| left.total_cmp(right));
    origin_times.sort_by(|left, right| left.total_cmp(right));
    let origin_median = origin_times[origin_times.len() / 2];
    println!(
        "hydrant cold (read through): {cold:.2} s, {:.2}x the origin's median",
        origin_median / cold
    );
    println!("median boto3 warm/origin = {:.1}", ratios[ratios.len() / 2]);
    let stats = proxy.stats();
    println!(
        "origin requests seen by the proxy: {} ({} GET)",
        stats.total.requests,
        stats.method(hydrant_fault_proxy::Method::Get).requests
    );
    server.stop().map_err(|error| error.to_string())?;
    Ok(())
}
