//! The workloads against a real hydrant server started in this process on a scratch file: each
//! runs for about a second and must have done something, and its JSON must parse back.

use std::path::PathBuf;

use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_proto::Limits;
use hydrant_server::{Server, ServerConfig};

use super::checkpoint::{checkpoint, CheckpointArgs};
use super::key_value::{get, mixed, Distribution, KeyValueArgs, MixedArgs};
use super::schema::RunReport;
use super::shards::{shards, ShardsArgs};
use super::CommonArgs;

const DATA_FILE_BYTES: u64 = 512 << 20;

/// A scratch folder beside the test binary: inside the target directory, on a real file system
/// (O_DIRECT is refused on tmpfs).
fn scratch(name: &str) -> PathBuf {
    let directory = std::env::current_exe()
        .expect("test binary")
        .parent()
        .expect("its folder")
        .join(format!("harness-{name}"));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).expect("scratch folder");
    directory
}

fn start_server(directory: &std::path::Path) -> Server {
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(
        directory.join("data.hyd"),
        DATA_FILE_BYTES,
    )]);
    engine.shards = Some(1);
    engine.format = FormatPolicy::Always;
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        engine,
        limits: Limits::default(),
        token: None,
        allow_remote_without_token: false,
        metrics: None,
        local_socket: None,
    })
    .expect("server starts")
}

fn common(server: &Server, directory: &std::path::Path, name: &str) -> CommonArgs {
    CommonArgs {
        servers: vec![server.address().to_string()],
        connections: 2,
        duration: Some(1.0),
        ops: None,
        bucket: "bench".into(),
        json: Some(directory.join(format!("{name}.json"))),
        label: None,
        seed: 1,
        timeout_seconds: 30,
    }
}

/// Write the report as `main` does, read it back and check that it says the same. Rates are
/// compared within a relative 1e-12: serde_json's default parser may be off in the last digit.
fn round_trip(report: &RunReport, common: &CommonArgs) {
    super::publish(report, common.json.as_ref()).expect("publish");
    let parsed = super::report::read(common.json.as_ref().unwrap()).expect("the JSON parses");
    let close = |left: f64, right: f64| (left - right).abs() <= 1e-12 * left.abs().max(1.0);
    assert_eq!(
        (
            &parsed.workload,
            &parsed.label,
            parsed.operations,
            parsed.bytes
        ),
        (
            &report.workload,
            &report.label,
            report.operations,
            report.bytes
        )
    );
    assert!(close(
        parsed.operations_per_second,
        report.operations_per_second
    ));
    assert!(close(
        parsed.mebibytes_per_second,
        report.mebibytes_per_second
    ));
    assert!(close(parsed.latency_us.p99, report.latency_us.p99));
    assert_eq!(
        parsed.throughput_samples.len(),
        report.throughput_samples.len()
    );
    assert_eq!(parsed.shards.is_some(), report.shards.is_some());
    assert_eq!(parsed.checkpoint.is_some(), report.checkpoint.is_some());
}

#[test]
fn workloads_run_against_a_real_server() {
    let directory = scratch("end-to-end");
    let server = start_server(&directory);

    let key_value = KeyValueArgs {
        common: common(&server, &directory, "get"),
        keys: 200,
        value_bytes: 4096,
        distribution: Distribution::Zipf,
        zipf_exponent: 0.99,
        key_prefix: "kv/".into(),
        no_load: false,
    };
    let report = get(&key_value).expect("get");
    assert!(report.operations > 0);
    assert_eq!(report.bytes, report.operations * 4096);
    assert!(report.latency_us.p50 > 0.0);
    assert!(!report.throughput_samples.is_empty());
    round_trip(&report, &key_value.common);

    let mut mixed_args = MixedArgs {
        key_value: key_value.clone(),
        read_fraction: 0.5,
    };
    mixed_args.key_value.no_load = true;
    mixed_args.key_value.common.json = Some(directory.join("mixed.json"));
    mixed_args.key_value.common.duration = None;
    mixed_args.key_value.common.ops = Some(400);
    let report = mixed(&mixed_args).expect("mixed");
    assert_eq!(report.operations, 400);
    assert_eq!(
        report.by_operation["get"].operations + report.by_operation["put"].operations,
        400
    );

    let shards_args = ShardsArgs {
        common: common(&server, &directory, "shards"),
        shards_per_reader: 4,
        shard_bytes: 1 << 20,
        samples_per_shard: 2,
        compute_ms: 5.0,
        prefetch_shards: 2,
        epochs: None,
        no_load: false,
        utilisation_bar_percent: 90.0,
    };
    let report = shards(&shards_args).expect("shards");
    assert!(report.operations > 0);
    let judged = report.shards.as_ref().expect("the shards section");
    assert_eq!(judged.readers.len(), 2);
    for reader in &judged.readers {
        assert!(reader.shards_read > 0);
        let percent = reader.accelerator_utilisation_percent.expect("computed");
        assert!(percent > 0.0 && percent <= 100.0);
        assert_eq!(reader.passed, Some(percent >= 90.0));
    }
    assert!(judged.passed.is_some());
    round_trip(&report, &shards_args.common);

    let mut checkpoint_args = CheckpointArgs {
        common: common(&server, &directory, "checkpoint"),
        objects: 8,
        object_bytes: 1 << 20,
        prefix: "checkpoint/".into(),
        flush_timeout_seconds: 30,
        no_flush: false,
    };
    checkpoint_args.common.duration = None;
    let report = checkpoint(&checkpoint_args).expect("checkpoint");
    let written = report.checkpoint.as_ref().expect("the checkpoint section");
    assert_eq!(written.objects, 8);
    assert!(written.seconds_to_flushed.expect("flushed") >= written.seconds_to_acknowledged);
    round_trip(&report, &checkpoint_args.common);

    server.stop().expect("server stops");
    let _ = std::fs::remove_dir_all(&directory);
}
