//! The benchmark harness: workloads against running servers (`get`, `put`, `mixed`,
//! `shards`, `checkpoint`), each printing a table and optionally writing a versioned JSON report,
//! and `report`, which compares such reports in a table and plots.

pub mod checkpoint;
#[cfg(test)]
mod end_to_end;
pub mod interrupt;
pub mod key_value;
pub mod latency;
pub mod report;
pub mod runner;
pub mod schema;
pub mod shards;
pub mod shards_origin;
pub mod zipf;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hydrant_client::Client;
use serde::Serialize;

use latency::LatencySummary;
use runner::{Bounds, Measured};
use schema::{OperationSummary, RunReport, SCHEMA_NAME, SCHEMA_VERSION};

const BYTES_PER_MEBIBYTE: f64 = 1_048_576.0;

/// The flags every workload takes.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct CommonArgs {
    /// The servers, HOST:PORT, comma-separated; keys are placed across them as the client does.
    /// Required, except by `shards --origin-s3`, which starts its own.
    #[arg(long = "server", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Threads, each with its own connection to every server.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many operations in all.
    #[arg(long)]
    pub ops: Option<u64>,
    #[arg(long, default_value = "bench")]
    pub bucket: String,
    /// Write the run's report here (schema hydrant-bench/workload, docs/benchmarks.md).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The run's name in reports and plots (default: workload and connections, `get-8c`).
    #[arg(long)]
    pub label: Option<String>,
    /// Seeds the key choices; each thread derives its own stream from it.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A request that takes longer than this fails the run.
    #[arg(long, default_value_t = 30)]
    pub timeout_seconds: u64,
}

impl CommonArgs {
    pub fn connect(&self) -> Result<Client, String> {
        Client::connect(&self.servers, Duration::from_secs(self.timeout_seconds))
            .map_err(|error| format!("connecting to {}: {error}", self.servers.join(",")))
    }

    /// The run's bounds; `default_duration` when neither `--duration` nor `--ops` is given.
    pub fn bounds(&self, default_duration: Option<Duration>) -> Result<Bounds, String> {
        let duration = match self.duration {
            Some(seconds) if !(seconds > 0.0 && seconds.is_finite()) => {
                return Err(format!("--duration {seconds}: give seconds above 0"));
            }
            Some(seconds) => Some(Duration::from_secs_f64(seconds)),
            None if self.ops.is_none() => default_duration,
            None => None,
        };
        Ok(Bounds {
            duration,
            operations: self.ops,
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.servers.is_empty() {
            return Err("--server HOST:PORT is required".into());
        }
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if self.ops == Some(0) {
            return Err("--ops must be at least 1".into());
        }
        Ok(())
    }

    /// The run's name: `--label`, or the workload and connections (`get-8c`).
    pub fn label_or(&self, workload: &str) -> String {
        self.label
            .clone()
            .unwrap_or_else(|| format!("{workload}-{}c", self.connections))
    }

    /// A thread's seed: the run's seed and the thread's number, mixed so that neighbouring
    /// threads' streams do not overlap.
    pub fn thread_seed(&self, thread: usize) -> u64 {
        zipf::Random::new(self.seed ^ (thread as u64).wrapping_mul(0xA24B_AED4_963E_E407))
            .next_u64()
    }
}

/// A workload's flags as the report's `parameters`: everything but where the servers are and
/// where the report goes, which the report holds elsewhere or does not need.
pub fn parameters_of(args: &impl Serialize) -> BTreeMap<String, serde_json::Value> {
    let mut flattened = BTreeMap::new();
    flatten_into(
        &serde_json::to_value(args).expect("arguments serialise"),
        &mut flattened,
    );
    for left_out in ["servers", "json", "label", "peer_json"] {
        flattened.remove(left_out);
    }
    flattened
}

fn flatten_into(value: &serde_json::Value, into: &mut BTreeMap<String, serde_json::Value>) {
    if let serde_json::Value::Object(fields) = value {
        for (name, field) in fields {
            if field.is_object() {
                flatten_into(field, into);
            } else {
                into.insert(name.clone(), field.clone());
            }
        }
    }
}

/// The report of a run, before any workload-specific section.
pub fn report_of<T>(
    workload: &str,
    common: &CommonArgs,
    parameters: BTreeMap<String, serde_json::Value>,
    measured: &Measured<T>,
    started: SystemTime,
) -> RunReport {
    let seconds = measured.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
    // Kinds are listed separately only when the run did more than one kind.
    let active = || {
        measured
            .kinds
            .iter()
            .filter(|(_, totals)| totals.operations > 0)
    };
    let by_operation = if active().count() > 1 {
        active()
            .map(|(name, totals)| {
                let summary = OperationSummary {
                    operations: totals.operations,
                    bytes: totals.bytes,
                    operations_per_second: totals.operations as f64 / seconds,
                    latency_us: totals.latencies.summary(),
                };
                (name.clone(), summary)
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    RunReport {
        schema: SCHEMA_NAME.into(),
        schema_version: SCHEMA_VERSION,
        workload: workload.into(),
        label: common.label_or(workload),
        started_unix_seconds: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs()),
        servers: common.servers.clone(),
        connections: common.connections,
        parameters,
        interrupted: measured.interrupted,
        elapsed_seconds: measured.elapsed.as_secs_f64(),
        operations: measured.all.operations,
        errors: measured.errors,
        bytes: measured.all.bytes,
        operations_per_second: measured.all.operations as f64 / seconds,
        mebibytes_per_second: measured.all.bytes as f64 / BYTES_PER_MEBIBYTE / seconds,
        latency_us: measured.all.latencies.summary(),
        by_operation,
        throughput_samples: measured.samples.clone(),
        shards: None,
        checkpoint: None,
    }
}

/// The header of the table every run prints and `report` repeats.
pub const TABLE_HEADER: &str = "| run | operation | connections | seconds | operations | ops/s | MiB/s | p50 us | p90 us | p99 us | p99.9 us | max us |\n|---|---|---|---|---|---|---|---|---|---|---|---|";

/// One row of that table.
pub fn table_row(
    report: &RunReport,
    operation: &str,
    operations: u64,
    operations_per_second: f64,
    mebibytes_per_second: f64,
    latency: &LatencySummary,
) -> String {
    format!(
        "| {} | {operation} | {} | {:.1} | {operations} | {operations_per_second:.0} | {mebibytes_per_second:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        report.label,
        report.connections,
        report.elapsed_seconds,
        latency.p50,
        latency.p90,
        latency.p99,
        latency.p99_9,
        latency.max,
    )
}

/// The report's rows: everything together, then each kind of operation when there are several.
pub fn table_rows(report: &RunReport) -> Vec<String> {
    let mut rows = vec![table_row(
        report,
        if report.by_operation.is_empty() {
            &report.workload
        } else {
            "all"
        },
        report.operations,
        report.operations_per_second,
        report.mebibytes_per_second,
        &report.latency_us,
    )];
    for (name, kind) in &report.by_operation {
        let mebibytes_per_second =
            kind.bytes as f64 / BYTES_PER_MEBIBYTE / report.elapsed_seconds.max(f64::MIN_POSITIVE);
        rows.push(table_row(
            report,
            name,
            kind.operations,
            kind.operations_per_second,
            mebibytes_per_second,
            &kind.latency_us,
        ));
    }
    rows
}

/// Print the run's table (and its workload's own section), and write its JSON when asked.
pub fn publish(report: &RunReport, json: Option<&PathBuf>) -> Result<(), String> {
    if report.interrupted {
        println!("(interrupted by Ctrl-C: the figures cover the run until then)");
    }
    println!("{TABLE_HEADER}");
    for row in table_rows(report) {
        println!("{row}");
    }
    if report.errors > 0 {
        println!(
            "{} retriable errors (server busy), not counted as operations",
            report.errors
        );
    }
    if let Some(shards) = &report.shards {
        shards::print(shards);
    }
    if let Some(checkpoint) = &report.checkpoint {
        checkpoint::print(checkpoint);
    }
    if let Some(path) = json {
        std::fs::write(path, report.to_json())
            .map_err(|error| format!("{}: {error}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}

/// A report's sibling: `dir/run.json` and `memcached` give `dir/run-memcached.json`.
pub fn json_beside(json: &Path, suffix: &str) -> PathBuf {
    let stem = json.file_stem().map_or_else(
        || "report".into(),
        |stem| stem.to_string_lossy().into_owned(),
    );
    let extension = json.extension().map_or_else(String::new, |extension| {
        format!(".{}", extension.to_string_lossy())
    });
    json.with_file_name(format!("{stem}-{suffix}{extension}"))
}

/// A value of `bytes` bytes; its content does not matter to the server, so it is a pattern.
pub fn value_of(bytes: usize, seed: u64) -> Vec<u8> {
    (0..bytes)
        .map(|offset| (offset as u64).wrapping_add(seed).wrapping_mul(31) as u8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sibling_report_keeps_the_folder_and_extension() {
        assert_eq!(
            json_beside(Path::new("runs/get.json"), "memcached"),
            PathBuf::from("runs/get-memcached.json")
        );
        assert_eq!(
            json_beside(Path::new("shards"), "hydrant-warm"),
            PathBuf::from("shards-hydrant-warm")
        );
    }
}
