//! The JSON a workload run writes with `--json FILE` and `hydrant-bench report` reads. The schema
//! is versioned: a reader refuses another schema or version instead of misreading it. Fields may
//! be added within a version (readers ignore what they do not know); renaming or removing one, or
//! changing its meaning, takes a new version. docs/benchmarks.md describes every field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::latency::LatencySummary;

pub const SCHEMA_NAME: &str = "hydrant-bench/workload";
pub const SCHEMA_VERSION: u32 = 1;

/// One workload run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub schema: String,
    pub schema_version: u32,
    /// get, put, mixed, shards or checkpoint.
    pub workload: String,
    /// The run's name in reports and plot legends (`--label`, or workload and connections).
    pub label: String,
    pub started_unix_seconds: u64,
    pub servers: Vec<String>,
    pub connections: usize,
    /// The workload's flags, as given or defaulted.
    pub parameters: BTreeMap<String, serde_json::Value>,
    /// The run was stopped by Ctrl-C before its bounds.
    pub interrupted: bool,
    pub elapsed_seconds: f64,
    pub operations: u64,
    /// Retriable errors (the server was busy), counted and not in `operations`.
    pub errors: u64,
    pub bytes: u64,
    pub operations_per_second: f64,
    pub mebibytes_per_second: f64,
    /// Every operation's latency, all kinds together, in microseconds.
    pub latency_us: LatencySummary,
    /// Per kind of operation (get, put) when the workload mixes them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_operation: BTreeMap<String, OperationSummary>,
    /// Throughput once a second (the last sample may cover less than a second).
    pub throughput_samples: Vec<ThroughputSample>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardsReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationSummary {
    pub operations: u64,
    pub bytes: u64,
    pub operations_per_second: f64,
    pub latency_us: LatencySummary,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputSample {
    /// Seconds since the measured phase started, at the end of the sample's interval.
    pub at_seconds: f64,
    pub operations_per_second: f64,
    pub mebibytes_per_second: f64,
}

/// The `shards` workload: simulated accelerators reading their shards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardsReport {
    /// Each reader must keep its accelerator at least this busy (MLPerf Storage: 90).
    pub utilisation_bar_percent: f64,
    /// Every reader met the bar; `None` without simulated compute (`--compute-ms 0`).
    pub passed: Option<bool>,
    pub readers: Vec<ReaderReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReaderReport {
    pub reader: usize,
    pub shards_read: u64,
    pub bytes: u64,
    pub mebibytes_per_second: f64,
    /// Time the simulated accelerator spent computing.
    pub compute_seconds: f64,
    /// From the reader's start until its accelerator finished the last shard.
    pub total_seconds: f64,
    /// compute / total × 100; `None` without simulated compute.
    pub accelerator_utilisation_percent: Option<f64>,
    pub passed: Option<bool>,
}

/// The `checkpoint` workload: a burst of PUTs, then FLUSH.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub objects: u64,
    pub object_bytes: u64,
    /// Until the last PUT was acknowledged.
    pub seconds_to_acknowledged: f64,
    /// Until FLUSH returned (every object durable at the origin), counted from the start of the
    /// burst; `None` when the run was interrupted before the flush.
    pub seconds_to_flushed: Option<f64>,
}

impl RunReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// Parse a report, refusing other schemas and versions and any missing required field.
    pub fn from_json(text: &str) -> Result<RunReport, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
        let schema = value["schema"].as_str().unwrap_or("(none)");
        if schema != SCHEMA_NAME {
            return Err(format!("schema is {schema}, not {SCHEMA_NAME}"));
        }
        let version = value["schema_version"].as_u64();
        if version != Some(u64::from(SCHEMA_VERSION)) {
            return Err(format!(
                "schema_version is {version:?}; this hydrant-bench reads {SCHEMA_VERSION}"
            ));
        }
        serde_json::from_value(value).map_err(|error| format!("schema {SCHEMA_NAME}: {error}"))
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn sample_report() -> RunReport {
        let latency = LatencySummary {
            p50: 50.0,
            p90: 90.0,
            p99: 120.5,
            p99_9: 400.0,
            max: 2_000.0,
            mean: 60.0,
        };
        RunReport {
            schema: SCHEMA_NAME.into(),
            schema_version: SCHEMA_VERSION,
            workload: "shards".into(),
            label: "shards-2c".into(),
            started_unix_seconds: 1_700_000_000,
            servers: vec!["127.0.0.1:7000".into()],
            connections: 2,
            parameters: BTreeMap::from([("shard_bytes".into(), serde_json::json!(4_194_304))]),
            interrupted: false,
            elapsed_seconds: 2.0,
            operations: 100,
            errors: 0,
            bytes: 400 << 20,
            operations_per_second: 50.0,
            mebibytes_per_second: 200.0,
            latency_us: latency,
            by_operation: BTreeMap::from([(
                "get".into(),
                OperationSummary {
                    operations: 100,
                    bytes: 400 << 20,
                    operations_per_second: 50.0,
                    latency_us: latency,
                },
            )]),
            throughput_samples: vec![ThroughputSample {
                at_seconds: 1.0,
                operations_per_second: 50.0,
                mebibytes_per_second: 200.0,
            }],
            shards: Some(ShardsReport {
                utilisation_bar_percent: 90.0,
                passed: Some(false),
                readers: vec![ReaderReport {
                    reader: 0,
                    shards_read: 50,
                    bytes: 200 << 20,
                    mebibytes_per_second: 100.0,
                    compute_seconds: 1.5,
                    total_seconds: 2.0,
                    accelerator_utilisation_percent: Some(75.0),
                    passed: Some(false),
                }],
            }),
            checkpoint: None,
        }
    }

    #[test]
    fn a_report_round_trips() {
        let report = sample_report();
        let parsed = RunReport::from_json(&report.to_json()).expect("parse");
        assert_eq!(parsed, report);
    }

    #[test]
    fn required_fields_are_required() {
        let text = sample_report().to_json();
        for field in [
            "workload",
            "label",
            "operations",
            "operations_per_second",
            "mebibytes_per_second",
            "latency_us",
            "throughput_samples",
        ] {
            let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
            value.as_object_mut().unwrap().remove(field);
            let error = RunReport::from_json(&value.to_string()).expect_err(field);
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn other_schemas_and_versions_are_refused() {
        let mut value: serde_json::Value =
            serde_json::from_str(&sample_report().to_json()).unwrap();
        value["schema_version"] = serde_json::json!(SCHEMA_VERSION + 1);
        assert!(RunReport::from_json(&value.to_string()).is_err());
        value["schema_version"] = serde_json::json!(SCHEMA_VERSION);
        value["schema"] = serde_json::json!("something-else");
        assert!(RunReport::from_json(&value.to_string()).is_err());
    }

    #[test]
    fn optional_sections_may_be_absent_and_unknown_fields_are_ignored() {
        let mut value: serde_json::Value =
            serde_json::from_str(&sample_report().to_json()).unwrap();
        let object = value.as_object_mut().unwrap();
        object.remove("shards");
        object.remove("by_operation");
        object.insert("added_later".into(), serde_json::json!(1));
        let parsed = RunReport::from_json(&value.to_string()).expect("parse");
        assert!(parsed.shards.is_none() && parsed.by_operation.is_empty());
    }
}
