//! The `shards` workload: N simulated accelerators, each fed by its own reader streaming its own
//! list of shard objects, the way a training job's data loaders read a dataset. With
//! `--compute-ms`, each sample of a shard keeps the accelerator busy that long, and the reader
//! reads ahead of it by at most `--prefetch-shards` shards (DLIO's prefetch). Each reader's
//! accelerator utilisation is, as MLPerf Storage defines it, the time spent computing over the
//! total time; the storage keeps up when every reader's utilisation reaches the bar (90% for
//! MLPerf Storage's UNet3D and ResNet-50).

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use hydrant_client::ClientError;
use serde::Serialize;

use super::runner::{self, ThreadBody, ThreadContext};
use super::schema::{ReaderReport, RunReport, ShardsReport};
use super::shards_origin::OriginModeArgs;
use super::{parameters_of, report_of, value_of, CommonArgs, BYTES_PER_MEBIBYTE};

/// MLPerf Storage's bar for UNet3D and ResNet-50: the accelerators are busy 90% of the time.
pub const UTILISATION_BAR_PERCENT_MLPERF: f64 = 90.0;

#[derive(clap::Args, Clone, Debug, Serialize)]
/// Each connection is one reader with one simulated accelerator.
pub struct ShardsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, default_value_t = 16)]
    pub shards_per_reader: u64,
    #[arg(long, default_value_t = 4 << 20)]
    pub shard_bytes: usize,
    /// Samples per shard, each computed for `--compute-ms`.
    #[arg(long, default_value_t = 8)]
    pub samples_per_shard: u64,
    /// Simulated compute per sample, in milliseconds; 0 measures reading alone.
    #[arg(long, default_value_t = 0.0)]
    pub compute_ms: f64,
    /// Shards a reader may hold read but not yet computed.
    #[arg(long, default_value_t = 2)]
    pub prefetch_shards: usize,
    /// Passes over each reader's list; default 1 unless `--duration` or `--ops` bounds the run.
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Skip writing the shards first (they are there from an earlier run).
    #[arg(long)]
    pub no_load: bool,
    #[arg(long, default_value_t = UTILISATION_BAR_PERCENT_MLPERF)]
    pub utilisation_bar_percent: f64,
    #[command(flatten)]
    pub origin: OriginModeArgs,
}

/// A reader's way to fetch a whole shard: its key in, the bytes read out.
pub type ShardFetch<'run> = Box<dyn FnMut(&str) -> Result<u64, ClientError> + Send + 'run>;

impl ShardsArgs {
    pub fn key(&self, reader: usize, shard: u64) -> String {
        format!("shards/reader-{reader:04}/shard-{shard:06}")
    }
}

/// Compute time over total time, in percent (MLPerf Storage's accelerator utilisation).
pub fn accelerator_utilisation_percent(compute: Duration, total: Duration) -> f64 {
    assert!(!total.is_zero(), "utilisation of an empty interval");
    assert!(
        compute <= total,
        "an accelerator cannot compute longer than it ran"
    );
    compute.as_secs_f64() / total.as_secs_f64() * 100.0
}

/// Whether a utilisation meets the bar (reaching it exactly passes).
pub fn meets_bar(utilisation_percent: f64, bar_percent: f64) -> bool {
    utilisation_percent >= bar_percent
}

/// What one reader did.
struct ReaderOutcome {
    shards_read: u64,
    bytes: u64,
    compute: Duration,
    total: Duration,
}

/// Every reader's keys, in reader order: what `load` writes and the readers read.
pub fn keys_of(args: &ShardsArgs, reader: usize) -> impl Iterator<Item = String> + '_ {
    (0..args.shards_per_reader).map(move |shard| args.key(reader, shard))
}

/// Write every reader's shards, each reader's connection its own list.
fn load(args: &ShardsArgs) -> Result<(), String> {
    let started = Instant::now();
    let value = value_of(args.shard_bytes, 0);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.common.connections)
            .map(|reader| {
                let value = &value;
                scope.spawn(move || -> Result<(), String> {
                    let mut client = args.common.connect()?;
                    for shard in 0..args.shards_per_reader {
                        let key = args.key(reader, shard);
                        client
                            .put(&args.common.bucket, &key, value)
                            .map_err(|error| format!("loading {key}: {error}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|handle| handle.join().expect("a load thread panicked"))
    })?;
    let shards = args.shards_per_reader * args.common.connections as u64;
    eprintln!(
        "loaded {shards} shards of {} bytes in {:.1} s",
        args.shard_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn shards(args: &ShardsArgs) -> Result<RunReport, String> {
    validate(args)?;
    if !args.no_load {
        load(args)?;
    }
    let common = &args.common;
    let fetchers = (0..common.connections)
        .map(|_| -> Result<ShardFetch, String> {
            let mut client = common.connect()?;
            Ok(Box::new(move |key: &str| {
                let (_, data) = client.get(&common.bucket, key, None)?;
                Ok(data.len() as u64)
            }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    read_shards(args, fetchers)
}

pub fn validate(args: &ShardsArgs) -> Result<(), String> {
    args.common.validate()?;
    if args.shards_per_reader == 0 || args.epochs == Some(0) {
        return Err("--shards-per-reader and --epochs must be at least 1".into());
    }
    if !(args.compute_ms >= 0.0 && args.compute_ms.is_finite()) {
        return Err("--compute-ms must be 0 or more".into());
    }
    Ok(())
}

/// The readers, each fetching its own list with its own `fetchers` entry and feeding its own
/// simulated accelerator, until the bounds or the epochs are done; the report of the run with
/// every reader's utilisation judged against the bar.
pub fn read_shards(args: &ShardsArgs, fetchers: Vec<ShardFetch>) -> Result<RunReport, String> {
    let common = &args.common;
    assert_eq!(fetchers.len(), common.connections, "one fetcher per reader");
    let bounds = common.bounds(None)?;
    let epochs = match args.epochs {
        Some(epochs) => epochs,
        None if bounds.duration.is_none() && bounds.operations.is_none() => 1,
        None => u64::MAX,
    };
    let compute_per_sample = Duration::from_secs_f64(args.compute_ms / 1_000.0);
    let mut bodies: Vec<ThreadBody<ReaderOutcome>> = Vec::with_capacity(common.connections);
    for (reader, mut fetch) in fetchers.into_iter().enumerate() {
        bodies.push(Box::new(move |context: &mut ThreadContext| {
            let started = Instant::now();
            std::thread::scope(|scope| {
                // The channel holds shards read and not yet computed: the prefetch bound.
                let (ready, to_compute) = mpsc::sync_channel::<()>(args.prefetch_shards);
                let accelerator = scope.spawn(move || {
                    let mut compute = Duration::ZERO;
                    while to_compute.recv().is_ok() {
                        for _ in 0..args.samples_per_shard {
                            if compute_per_sample.is_zero() {
                                break;
                            }
                            let sample = Instant::now();
                            std::thread::sleep(compute_per_sample);
                            compute += sample.elapsed();
                        }
                    }
                    (compute, started.elapsed())
                });
                let (mut shards_read, mut bytes) = (0, 0);
                'epochs: for _ in 0..epochs {
                    for key in keys_of(args, reader) {
                        if context.next().is_none() {
                            break 'epochs;
                        }
                        let read = context.measure(0, || fetch(&key))?;
                        if let Some(read) = read {
                            shards_read += 1;
                            bytes += read;
                            ready.send(()).expect("the accelerator outlives its reader");
                        }
                    }
                }
                drop(ready);
                let (compute, total) = accelerator.join().expect("an accelerator panicked");
                Ok(ReaderOutcome {
                    shards_read,
                    bytes,
                    compute,
                    total,
                })
            })
        }));
    }
    let started = SystemTime::now();
    let measured = runner::run(&["get"], bounds, bodies)?;
    let mut report = report_of("shards", common, parameters_of(args), &measured, started);
    report.shards = Some(judge(
        &measured.threads,
        !compute_per_sample.is_zero(),
        args.utilisation_bar_percent,
    ));
    Ok(report)
}

/// Each reader's throughput and utilisation against the bar; overall, every reader must pass.
fn judge(readers: &[ReaderOutcome], computed: bool, bar_percent: f64) -> ShardsReport {
    let readers: Vec<ReaderReport> = readers
        .iter()
        .enumerate()
        .map(|(reader, outcome)| {
            let utilisation = (computed && !outcome.total.is_zero())
                .then(|| accelerator_utilisation_percent(outcome.compute, outcome.total));
            ReaderReport {
                reader,
                shards_read: outcome.shards_read,
                bytes: outcome.bytes,
                mebibytes_per_second: outcome.bytes as f64
                    / BYTES_PER_MEBIBYTE
                    / outcome.total.as_secs_f64().max(f64::MIN_POSITIVE),
                compute_seconds: outcome.compute.as_secs_f64(),
                total_seconds: outcome.total.as_secs_f64(),
                accelerator_utilisation_percent: utilisation,
                passed: utilisation.map(|percent| meets_bar(percent, bar_percent)),
            }
        })
        .collect();
    let passed = computed.then(|| readers.iter().all(|reader| reader.passed == Some(true)));
    ShardsReport {
        utilisation_bar_percent: bar_percent,
        passed,
        readers,
    }
}

pub fn verdict(passed: Option<bool>) -> &'static str {
    match passed {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a (no compute)",
    }
}

pub fn print(report: &ShardsReport) {
    println!();
    println!(
        "| reader | shards | MiB/s | compute s | total s | accelerator utilisation % | vs {:.0}% |",
        report.utilisation_bar_percent
    );
    println!("|---|---|---|---|---|---|---|");
    for reader in &report.readers {
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {} | {} |",
            reader.reader,
            reader.shards_read,
            reader.mebibytes_per_second,
            reader.compute_seconds,
            reader.total_seconds,
            reader
                .accelerator_utilisation_percent
                .map_or("n/a".into(), |percent| format!("{percent:.1}")),
            verdict(reader.passed),
        );
    }
    match report.passed {
        Some(passed) => println!(
            "overall: {} (the bar: every reader's accelerator at least {:.0}% busy)",
            verdict(Some(passed)),
            report.utilisation_bar_percent
        ),
        None => println!("overall: {}", verdict(None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_is_compute_over_total() {
        let percent =
            accelerator_utilisation_percent(Duration::from_secs(9), Duration::from_secs(10));
        assert!((percent - 90.0).abs() < 1e-9);
        assert!(meets_bar(percent, UTILISATION_BAR_PERCENT_MLPERF));
        let percent =
            accelerator_utilisation_percent(Duration::from_millis(8_990), Duration::from_secs(10));
        assert!((percent - 89.9).abs() < 1e-9);
        assert!(!meets_bar(percent, UTILISATION_BAR_PERCENT_MLPERF));
        assert_eq!(
            accelerator_utilisation_percent(Duration::ZERO, Duration::from_secs(1)),
            0.0
        );
    }

    #[test]
    fn one_failing_reader_fails_the_run() {
        let outcome = |compute_ms, total_ms| ReaderOutcome {
            shards_read: 10,
            bytes: 10 << 20,
            compute: Duration::from_millis(compute_ms),
            total: Duration::from_millis(total_ms),
        };
        let report = judge(&[outcome(950, 1_000), outcome(800, 1_000)], true, 90.0);
        assert_eq!(report.readers[0].passed, Some(true));
        assert_eq!(report.readers[1].passed, Some(false));
        assert_eq!(
            report.readers[1].accelerator_utilisation_percent,
            Some(80.0)
        );
        assert_eq!(report.passed, Some(false));
        assert!((report.readers[0].mebibytes_per_second - 10.0).abs() < 1e-9);
        let report = judge(&[outcome(950, 1_000), outcome(900, 1_000)], true, 90.0);
        assert_eq!(report.passed, Some(true));
        // Without compute there is nothing to judge.
        let report = judge(&[outcome(0, 1_000)], false, 90.0);
        assert_eq!(report.passed, None);
        assert_eq!(report.readers[0].accelerator_utilisation_percent, None);
    }
}
