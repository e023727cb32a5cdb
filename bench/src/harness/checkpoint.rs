//! The `checkpoint` workload: a burst of `--objects` PUTs of `--object-bytes` each by
//! `--connections` writers, the way a training job's ranks write a checkpoint at once; then FLUSH,
//! which returns when every object is durable at the origin. The times that matter to the job are
//! until every PUT is acknowledged (training resumes) and until FLUSH returns (the checkpoint
//! survives the node).

use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use super::runner::{self, Bounds, ThreadBody, ThreadContext};
use super::schema::{CheckpointReport, RunReport};
use super::{parameters_of, report_of, value_of, CommonArgs};

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, default_value_t = 64)]
    pub objects: u64,
    #[arg(long, default_value_t = 64 << 20)]
    pub object_bytes: usize,
    /// Objects are named PREFIX + their number.
    #[arg(long, default_value = "checkpoint/")]
    pub prefix: String,
    /// FLUSH gives up after this long.
    #[arg(long, default_value_t = 600)]
    pub flush_timeout_seconds: u64,
    /// Measure the burst only.
    #[arg(long)]
    pub no_flush: bool,
}

pub fn checkpoint(args: &CheckpointArgs) -> Result<RunReport, String> {
    let common = &args.common;
    common.validate()?;
    if args.objects == 0 {
        return Err("--objects must be at least 1".into());
    }
    if common.ops.is_some() {
        return Err("checkpoint writes --objects objects; --ops does not apply".into());
    }
    // The burst is bounded by its object count; --duration, when given, cuts it short.
    let bounds = Bounds {
        duration: common.bounds(None)?.duration,
        operations: Some(args.objects),
    };
    let mut bodies: Vec<ThreadBody<()>> = Vec::with_capacity(common.connections);
    for thread in 0..common.connections {
        let mut client = common.connect()?;
        let value = value_of(args.object_bytes, thread as u64);
        bodies.push(Box::new(move |context: &mut ThreadContext| {
            while let Some(object) = context.next() {
                let key = format!("{}object-{object:06}", args.prefix);
                context.measure(0, || {
                    client.put(&common.bucket, &key, &value)?;
                    Ok(value.len() as u64)
                })?;
            }
            Ok(())
        }));
    }
    let started = SystemTime::now();
    let measured = runner::run(&["put"], bounds, bodies)?;
    let seconds_to_acknowledged = measured.elapsed.as_secs_f64();
    let seconds_to_flushed = if measured.interrupted || args.no_flush {
        None
    } else {
        let flushing = Instant::now();
        common
            .connect()?
            .flush(
                Some(&common.bucket),
                &args.prefix,
                Duration::from_secs(args.flush_timeout_seconds),
            )
            .map_err(|error| format!("FLUSH: {error}"))?;
        Some(seconds_to_acknowledged + flushing.elapsed().as_secs_f64())
    };
    let mut report = report_of(
        "checkpoint",
        common,
        parameters_of(args),
        &measured,
        started,
    );
    report.checkpoint = Some(CheckpointReport {
        objects: measured.all.operations,
        object_bytes: args.object_bytes as u64,
        seconds_to_acknowledged,
        seconds_to_flushed,
    });
    Ok(report)
}

pub fn print(report: &CheckpointReport) {
    let gibibytes = (report.objects * report.object_bytes) as f64 / (1u64 << 30) as f64;
    println!();
    println!(
        "checkpoint: {} objects of {} bytes ({gibibytes:.2} GiB): every PUT acknowledged after {:.2} s ({:.2} GiB/s)",
        report.objects,
        report.object_bytes,
        report.seconds_to_acknowledged,
        gibibytes / report.seconds_to_acknowledged.max(f64::MIN_POSITIVE),
    );
    match report.seconds_to_flushed {
        Some(seconds) => println!("checkpoint: FLUSH returned after {seconds:.2} s from the start"),
        None => println!("checkpoint: not flushed"),
    }
}
