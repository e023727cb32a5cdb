//! `shards --origin-s3 HOST:PORT`: the same readers and simulated accelerators, in one run,
//! against hydrant cold, hydrant warm and the origin itself.
//!
//! The shards go straight into a new bucket on the S3-compatible server, behind
//! hydrant-fault-proxy adding S3's latency (`--origin-delay-ms`, 50–150 ms per request). A hydrant
//! server started in this process maps `--bucket` to that S3 bucket through the proxy (read-only,
//! immutable objects). The readers read their lists through hydrant once (cold: every shard is a
//! miss fetched from the origin and stored), a second time (warm: from NVMe), then straight from
//! the origin through the same proxy with `object_store`, the client hydrant's own origin reads
//! use. Every path has the same readers, the same prefetch and the same compute per sample, so the
//! three utilisations differ only by where the bytes come from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hydrant_client::ClientError;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{
    BucketOrigin, EngineConfig, FormatPolicy, OriginConfig, Revalidate, WriteMode,
};
use hydrant_fault_proxy::{Method, ProxyHandle};
use hydrant_server::{Server, ServerConfig};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::Serialize;

use super::schema::RunReport;
use super::shards::{
    accelerator_utilisation_percent, keys_of, read_shards, shards, validate, verdict, ShardFetch,
    ShardsArgs,
};
use super::{interrupt, json_beside, publish, value_of, BYTES_PER_MEBIBYTE};
use crate::origin_bench::{create_bucket, s3_store, start_slow_origin};

/// The paths, in the order the table shows them (they run cold, warm, then direct).
pub const HYDRANT_WARM: &str = "hydrant-warm";
pub const HYDRANT_COLD: &str = "hydrant-cold";
pub const ORIGIN_DIRECT: &str = "origin-direct";

/// Room in the data file beyond the dataset: the engine's metadata and regions not yet reclaimed.
const DATA_FILE_SLACK_BYTES: u64 = 1 << 30;

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct OriginModeArgs {
    /// Compare hydrant warm, hydrant cold and the origin directly in one run: the S3-compatible
    /// server, HOST:PORT (e.g. `moto_server -p 5599`). The shards go into a new bucket there; a
    /// hydrant server in this process reads it through the latency proxy. Replaces --server.
    #[arg(long)]
    pub origin_s3: Option<String>,
    /// Latency the proxy adds to every origin request, MIN-MAX milliseconds (S3 Standard: 50-150).
    #[arg(long, default_value = "50-150")]
    pub origin_delay_ms: String,
    /// Folder for that hydrant's data file (formatted).
    #[arg(long, default_value = "target/bench-scratch")]
    pub origin_data_dir: PathBuf,
}

/// One path's line of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct PathSummary {
    pub path: String,
    pub readers: usize,
    pub shards_read: u64,
    pub seconds: f64,
    pub mebibytes_per_second: f64,
    /// All accelerators together: their compute time over their total time.
    pub utilisation_percent: Option<f64>,
    pub lowest_reader_percent: Option<f64>,
    /// Every reader met the bar (MLPerf Storage's rule); `None` without compute.
    pub passed: Option<bool>,
    /// GETs the origin saw while this path ran.
    pub origin_gets: u64,
}

/// A path's line from its run's report.
pub fn summarise(path: &str, report: &RunReport, origin_gets: u64) -> PathSummary {
    let shards = report
        .shards
        .as_ref()
        .expect("a shards run has its shards section");
    let compute: f64 = shards.readers.iter().map(|r| r.compute_seconds).sum();
    let total: f64 = shards.readers.iter().map(|r| r.total_seconds).sum();
    let utilisation_percent = (shards.passed.is_some() && total > 0.0).then(|| {
        let total = Duration::from_secs_f64(total);
        // Each reader's compute lies within its total; the sums can differ only by rounding.
        accelerator_utilisation_percent(Duration::from_secs_f64(compute).min(total), total)
    });
    PathSummary {
        path: path.into(),
        readers: shards.readers.len(),
        shards_read: shards.readers.iter().map(|r| r.shards_read).sum(),
        seconds: report.elapsed_seconds,
        mebibytes_per_second: report.mebibytes_per_second,
        utilisation_percent,
        lowest_reader_percent: shards
            .readers
            .iter()
            .filter_map(|r| r.accelerator_utilisation_percent)
            .reduce(f64::min),
        passed: shards.passed,
        origin_gets,
    }
}

/// The comparison as a markdown table, one row per path.
pub fn table(summaries: &[PathSummary], bar_percent: f64) -> String {
    let percent = |value: Option<f64>| value.map_or("n/a".into(), |p| format!("{p:.1}"));
    let mut table = format!(
        "| path | readers | shards read | seconds | MiB/s | accelerator utilisation % (all readers) | lowest reader % | vs {bar_percent:.0}% (every reader) | origin GETs |\n|---|---:|---:|---:|---:|---:|---:|---|---:|\n"
    );
    for summary in summaries {
        table.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.1} | {} | {} | {} | {} |\n",
            summary.path,
            summary.readers,
            summary.shards_read,
            summary.seconds,
            summary.mebibytes_per_second,
            percent(summary.utilisation_percent),
            percent(summary.lowest_reader_percent),
            verdict(summary.passed),
            summary.origin_gets,
        ));
    }
    table
}

fn refuse_flags_of_other_modes(args: &ShardsArgs) -> Result<(), String> {
    let common = &args.common;
    let refused = [
        (
            !common.servers.is_empty(),
            "--server (it starts its own hydrant)",
        ),
        (
            common.duration.is_some(),
            "--duration (each path reads every shard once)",
        ),
        (
            common.ops.is_some(),
            "--ops (each path reads every shard once)",
        ),
        (
            args.epochs.is_some(),
            "--epochs (each path reads every shard once)",
        ),
        (args.no_load, "--no-load (the shards go into a new bucket)"),
    ];
    match refused.iter().find(|(given, _)| *given) {
        Some((_, flag)) => Err(format!("--origin-s3 takes no {flag}")),
        None => Ok(()),
    }
}

/// The arguments of one path's run: its server (for the report), its label, one epoch.
fn path_args(args: &ShardsArgs, path: &str, server: String) -> ShardsArgs {
    let mut path_args = args.clone();
    path_args.common.servers = vec![server];
    path_args.common.label = Some(format!("{}-{path}", args.common.label_or("shards")));
    path_args.common.json = None;
    path_args.epochs = Some(1);
    path_args.no_load = true;
    path_args
}

/// Put every reader's shards straight into the origin, one task per reader.
fn load_origin(
    args: &ShardsArgs,
    runtime: &tokio::runtime::Runtime,
    store: &Arc<object_store::aws::AmazonS3>,
) -> Result<(), String> {
    let started = Instant::now();
    let value = Bytes::from(value_of(args.shard_bytes, 0));
    runtime.block_on(async {
        let tasks: Vec<_> = (0..args.common.connections)
            .map(|reader| {
                let (store, value) = (store.clone(), value.clone());
                let keys: Vec<String> = keys_of(args, reader).collect();
                tokio::spawn(async move {
                    for key in keys {
                        store
                            .put(&Path::from(key.as_str()), PutPayload::from(value.clone()))
                            .await
                            .map_err(|error| format!("putting {key} into the origin: {error}"))?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        for task in tasks {
            task.await.map_err(|error| error.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    eprintln!(
        "put {} shards of {} bytes into the origin in {:.1} s",
        args.shards_per_reader * args.common.connections as u64,
        args.shard_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A hydrant server in this process whose `--bucket` reads `s3://bucket` (through the proxy the
/// AWS variables point at).
fn start_hydrant(args: &ShardsArgs, bucket: &str) -> Result<Server, String> {
    let directory = &args.origin.origin_data_dir;
    std::fs::create_dir_all(directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?;
    let path = directory.join("shards-origin.hyd");
    let _ = std::fs::remove_file(&path);
    let dataset_bytes =
        args.shards_per_reader * args.common.connections as u64 * args.shard_bytes as u64;
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(
        &path,
        dataset_bytes * 3 / 2 + DATA_FILE_SLACK_BYTES,
    )]);
    engine.format = FormatPolicy::Always;
    let mut origins = OriginConfig::new();
    origins.buckets.insert(
        args.common.bucket.clone(),
        BucketOrigin {
            url: format!("s3://{bucket}"),
            write: WriteMode::ReadOnly,
            revalidate: Revalidate::Immutable,
            settings: Default::default(),
        },
    );
    engine.origins = Some(origins);
    Server::start(ServerConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        engine,
    ))
}

/// One reader's fetch straight from the origin: a whole-object GET, the reader's thread blocked
/// on it as it is on hydrant's blocking client. A failure ends the run (object_store has retried).
fn direct_fetch<'run>(
    runtime: &'run tokio::runtime::Runtime,
    store: Arc<object_store::aws::AmazonS3>,
) -> ShardFetch<'run> {
    Box::new(move |key: &str| {
        runtime
            .block_on(async {
                let data = store.get(&Path::from(key)).await?.bytes().await?;
                Ok::<u64, object_store::Error>(data.len() as u64)
            })
            .map_err(|error| ClientError::Usage(format!("origin GET {key}: {error}")))
    })
}

fn origin_gets(proxy: &ProxyHandle) -> u64 {
    proxy.stats().method(Method::Get).requests
}

/// Run the three paths and print their comparison; each path's report goes beside `--json`.
pub fn shards_against_origin(args: &ShardsArgs) -> Result<Vec<PathSummary>, String> {
    let s3 = args.origin.origin_s3.as_deref().expect("origin mode");
    refuse_flags_of_other_modes(args)?;
    validate(&path_args(args, ORIGIN_DIRECT, s3.into()))?;
    let bucket = format!("shards-{}", std::process::id());
    create_bucket(s3, &bucket)?;
    let (proxy, endpoint) = start_slow_origin(s3, &args.origin.origin_delay_ms)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let store = Arc::new(s3_store(&endpoint, &bucket)?);
    load_origin(args, &runtime, &store)?;
    let server = start_hydrant(args, &bucket)?;
    let hydrant = server.address().to_string();
    eprintln!(
        "hydrant {hydrant}: bucket {} -> s3://{bucket} via {endpoint} ({} ms per request)",
        args.common.bucket, args.origin.origin_delay_ms
    );

    let mut runs: Vec<(&str, RunReport, u64)> = Vec::new();
    for path in [HYDRANT_COLD, HYDRANT_WARM] {
        if interrupt::interrupted() {
            break;
        }
        let gets_before = origin_gets(&proxy);
        let report = shards(&path_args(args, path, hydrant.clone()))?;
        runs.push((path, report, origin_gets(&proxy) - gets_before));
    }
    if !interrupt::interrupted() {
        let direct_args = path_args(args, ORIGIN_DIRECT, format!("{endpoint}/{bucket}"));
        let fetchers = (0..args.common.connections)
            .map(|_| direct_fetch(&runtime, store.clone()))
            .collect();
        let gets_before = origin_gets(&proxy);
        let report = read_shards(&direct_args, fetchers)?;
        runs.push((ORIGIN_DIRECT, report, origin_gets(&proxy) - gets_before));
    }
    server.stop().map_err(|error| error.to_string())?;

    for (path, report, _) in &mut runs {
        report
            .parameters
            .insert("path".into(), serde_json::json!(path));
        println!("\n{path}:");
        let json = args
            .common
            .json
            .as_ref()
            .map(|json| json_beside(json, path));
        publish(report, json.as_ref())?;
    }
    let mut summaries: Vec<PathSummary> = runs
        .iter()
        .map(|(path, report, gets)| summarise(path, report, *gets))
        .collect();
    let order = |path: &str| {
        [HYDRANT_WARM, HYDRANT_COLD, ORIGIN_DIRECT]
            .iter()
            .position(|p| *p == path)
    };
    summaries.sort_by_key(|summary| order(&summary.path));
    let dataset_mib = (args.shards_per_reader * args.common.connections as u64) as f64
        * args.shard_bytes as f64
        / BYTES_PER_MEBIBYTE;
    println!(
        "\n{} readers, {} shards of {} bytes each ({dataset_mib:.0} MiB), {} samples x {} ms of compute per shard, prefetch {}; origin {s3} + {} ms per request",
        args.common.connections,
        args.shards_per_reader,
        args.shard_bytes,
        args.samples_per_shard,
        args.compute_ms,
        args.prefetch_shards,
        args.origin.origin_delay_ms,
    );
    print!("{}", table(&summaries, args.utilisation_bar_percent));
    Ok(summaries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::schema::tests::sample_report;
    use crate::harness::schema::ReaderReport;

    fn reader(reader: usize, compute_seconds: f64, total_seconds: f64, bar: f64) -> ReaderReport {
        let percent = compute_seconds / total_seconds * 100.0;
        ReaderReport {
            reader,
            shards_read: 16,
            bytes: 64 << 20,
            mebibytes_per_second: 64.0 / total_seconds,
            compute_seconds,
            total_seconds,
            accelerator_utilisation_percent: Some(percent),
            passed: Some(percent >= bar),
        }
    }

    fn run_of(readers: Vec<ReaderReport>) -> RunReport {
        let mut report = sample_report();
        let shards = report.shards.as_mut().unwrap();
        shards.passed = Some(readers.iter().all(|r| r.passed == Some(true)));
        shards.readers = readers;
        report
    }

    #[test]
    fn a_paths_utilisation_is_all_compute_over_all_time() {
        // 9.5 + 8.5 s of compute in 10 + 10 s: 90% together, yet one reader fails the bar.
        let report = run_of(vec![reader(0, 9.5, 10.0, 90.0), reader(1, 8.5, 10.0, 90.0)]);
        let summary = summarise(HYDRANT_WARM, &report, 0);
        assert!((summary.utilisation_percent.unwrap() - 90.0).abs() < 1e-6);
        assert!((summary.lowest_reader_percent.unwrap() - 85.0).abs() < 1e-9);
        assert_eq!(summary.passed, Some(false));
        assert_eq!((summary.readers, summary.shards_read), (2, 32));
        // Unequal totals weigh by time: (1 + 9) / (2 + 10) = 83.3%.
        let report = run_of(vec![reader(0, 1.0, 2.0, 50.0), reader(1, 9.0, 10.0, 50.0)]);
        let summary = summarise(ORIGIN_DIRECT, &report, 32);
        assert!((summary.utilisation_percent.unwrap() - 1000.0 / 12.0).abs() < 1e-6);
        assert_eq!(summary.passed, Some(true));
    }

    #[test]
    fn without_compute_nothing_is_judged() {
        let mut report = run_of(vec![reader(0, 0.0, 1.0, 90.0)]);
        let shards = report.shards.as_mut().unwrap();
        shards.passed = None;
        shards.readers[0].accelerator_utilisation_percent = None;
        shards.readers[0].passed = None;
        let summary = summarise(HYDRANT_COLD, &report, 16);
        assert_eq!(summary.utilisation_percent, None);
        assert_eq!(summary.passed, None);
        let table = table(&[summary], 90.0);
        assert!(
            table.contains(
                "| hydrant-cold | 1 | 16 | 2.00 | 200.0 | n/a | n/a | n/a (no compute) | 16 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn the_table_has_a_row_per_path_with_its_verdict() {
        let passing = summarise(
            HYDRANT_WARM,
            &run_of(vec![reader(0, 9.5, 10.0, 90.0), reader(1, 9.2, 10.0, 90.0)]),
            0,
        );
        let failing = summarise(
            ORIGIN_DIRECT,
            &run_of(vec![reader(0, 4.0, 10.0, 90.0), reader(1, 3.0, 10.0, 90.0)]),
            32,
        );
        let table = table(&[passing, failing], 90.0);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 4, "{table}");
        assert!(rows[0].contains("vs 90% (every reader)"));
        assert_eq!(
            rows[2],
            "| hydrant-warm | 2 | 32 | 2.00 | 200.0 | 93.5 | 92.0 | PASS | 0 |"
        );
        assert_eq!(
            rows[3],
            "| origin-direct | 2 | 32 | 2.00 | 200.0 | 35.0 | 30.0 | FAIL | 32 |"
        );
    }

    #[test]
    fn flags_of_the_other_modes_are_refused() {
        let mut args = crate::harness::end_to_end::shards_args_for_tests();
        args.origin.origin_s3 = Some("127.0.0.1:1".into());
        args.common.servers.clear();
        args.common.duration = None;
        assert!(refuse_flags_of_other_modes(&args).is_ok());
        let mut with_server = args.clone();
        with_server.common.servers = vec!["127.0.0.1:2".into()];
        assert!(refuse_flags_of_other_modes(&with_server)
            .unwrap_err()
            .contains("--server"));
        let mut with_epochs = args.clone();
        with_epochs.epochs = Some(2);
        assert!(refuse_flags_of_other_modes(&with_epochs)
            .unwrap_err()
            .contains("--epochs"));
        let labelled = path_args(&args, HYDRANT_COLD, "h:1".into());
        assert_eq!(
            labelled.common.label.as_deref(),
            Some("shards-2c-hydrant-cold")
        );
        assert_eq!(labelled.epochs, Some(1));
        assert!(labelled.no_load && labelled.common.json.is_none());
    }
}
