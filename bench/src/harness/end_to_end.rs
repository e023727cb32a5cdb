//! The workloads against a real hydrant server started in this process on a scratch file: each
//! runs for about a second and must have done something, and its JSON must parse back.

use std::path::PathBuf;

use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};

use super::checkpoint::{checkpoint, CheckpointArgs};
use super::key_value::{
    get, get_on_peer, mixed, peer_json, ratio_line, Distribution, KeyValueArgs, MixedArgs, Peer,
    PeerArgs,
};
use super::schema::RunReport;
use super::shards::{shards, ShardsArgs};
use super::shards_origin::{
    shards_against_origin, OriginModeArgs, HYDRANT_COLD, HYDRANT_WARM, ORIGIN_DIRECT,
};
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
    Server::start(ServerConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        engine,
    ))
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

/// Small shards runs: 2 readers of 4 shards of 1 MiB, 2 samples of 5 ms each.
pub(super) fn shards_args_for_tests() -> ShardsArgs {
    ShardsArgs {
        common: CommonArgs {
            servers: vec!["127.0.0.1:1".into()],
            connections: 2,
            duration: Some(1.0),
            ops: None,
            bucket: "bench".into(),
            json: None,
            label: None,
            seed: 1,
            timeout_seconds: 30,
        },
        shards_per_reader: 4,
        shard_bytes: 1 << 20,
        samples_per_shard: 2,
        compute_ms: 5.0,
        prefetch_shards: 2,
        epochs: None,
        no_load: false,
        utilisation_bar_percent: 90.0,
        origin: OriginModeArgs {
            origin_s3: None,
            origin_delay_ms: "50-150".into(),
            origin_data_dir: PathBuf::from("target/bench-scratch"),
        },
    }
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
        peer: PeerArgs::default(),
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

    let mut shards_args = shards_args_for_tests();
    shards_args.common = common(&server, &directory, "shards");
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

/// A free TCP port on loopback (the listener is closed before the port is used; a race with
/// another process taking it is possible and would fail the test loudly).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A child process killed when the test ends, passing or not.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `program` with `args` and wait until `address` accepts connections.
fn spawn_listening(program: &str, args: &[&str], address: &str, install: &str) -> Child {
    let child = std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {program} ({install}): {error}"));
    let child = Child(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{program} did not start listening on {address}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child
}

/// `get --peer-memcached`: the peer's run is the same workload against memcached, and its report
/// is in the same schema, labelled as the peer's, so `report` plots both.
#[test]
fn the_peer_runs_the_same_gets_against_memcached() {
    let directory = scratch("peer");
    let server = start_server(&directory);
    let port = free_port().to_string();
    let address = format!("127.0.0.1:{port}");
    let _memcached = spawn_listening(
        "memcached",
        &[
            "-l",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "0",
            "-t",
            "1",
            "-m",
            "64",
            "-u",
            "root",
        ],
        &address,
        "apt-get install -y memcached",
    );
    let mut args = KeyValueArgs {
        common: common(&server, &directory, "hydrant"),
        keys: 100,
        value_bytes: 4096,
        distribution: Distribution::Uniform,
        zipf_exponent: 0.99,
        key_prefix: "kv/".into(),
        no_load: false,
        peer: PeerArgs {
            peer_memcached: Some(address.clone()),
            peer_json: None,
            peer_redis: None,
        },
    };
    args.common.duration = None;
    args.common.ops = Some(500);
    let hydrant = get(&args).expect("hydrant's run");
    round_trip(&hydrant, &args.common);
    assert!(
        get_on_peer(&args, Peer::Redis).unwrap().is_none(),
        "no redis given"
    );
    let peer = get_on_peer(&args, Peer::Memcached)
        .expect("the peer's run")
        .expect("a peer");
    let peer_path = peer_json(&args, Peer::Memcached).expect("beside --json");
    assert_eq!(peer_path, directory.join("hydrant-memcached.json"));
    super::publish(&peer, Some(&peer_path)).expect("publish");
    let parsed = super::report::read(&peer_path).expect("the peer's JSON parses as v1");
    assert_eq!(parsed.label, "get-2c-memcached");
    assert_eq!(parsed.workload, "get");
    assert_eq!(parsed.servers, vec![address]);
    assert_eq!(parsed.parameters["peer"], serde_json::json!("memcached"));
    assert_eq!(parsed.connections, hydrant.connections);
    assert_eq!(parsed.parameters["keys"], hydrant.parameters["keys"]);
    assert_eq!(parsed.operations, 500);
    assert_eq!(parsed.bytes, 500 * 4096);
    assert!(parsed.latency_us.p50 > 0.0);
    // The report plots both runs' percentiles.
    let plots = directory.join("plots");
    super::report::report(&super::report::ReportArgs {
        files: vec![args.common.json.clone().unwrap(), peer_path],
        out: Some(plots.clone()),
    })
    .expect("report");
    let svg = std::fs::read_to_string(plots.join(super::report::LATENCY_PLOT)).expect("the plot");
    let lines = svg.matches("stroke-width=\"3\"").count();
    assert_eq!(lines, 2 + 2, "two runs' lines and their legend marks");
    server.stop().expect("server stops");
    let _ = std::fs::remove_dir_all(&directory);
}

/// `get --peer-redis`: the same gets against a real redis-server, its report beside hydrant's
/// (`FILE-redis.json`), and the ratio line computed from the two reports.
#[test]
fn the_peer_runs_the_same_gets_against_redis() {
    let directory = scratch("peer-redis");
    let server = start_server(&directory);
    let port = free_port().to_string();
    let address = format!("127.0.0.1:{port}");
    let _redis = spawn_listening(
        "redis-server",
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        &address,
        "apt-get install -y redis-server",
    );
    let mut args = KeyValueArgs {
        common: common(&server, &directory, "hydrant"),
        keys: 100,
        value_bytes: 4096,
        distribution: Distribution::Zipf,
        zipf_exponent: 0.99,
        key_prefix: "kv/".into(),
        no_load: false,
        peer: PeerArgs {
            peer_memcached: None,
            peer_json: None,
            peer_redis: Some(address.clone()),
        },
    };
    args.common.duration = None;
    args.common.ops = Some(400);
    let hydrant = get(&args).expect("hydrant's run");
    assert!(get_on_peer(&args, Peer::Memcached).unwrap().is_none());
    let peer = get_on_peer(&args, Peer::Redis)
        .expect("the peer's run")
        .expect("a peer");
    let peer_path = peer_json(&args, Peer::Redis).expect("beside --json");
    assert_eq!(peer_path, directory.join("hydrant-redis.json"));
    super::publish(&peer, Some(&peer_path)).expect("publish");
    let parsed = super::report::read(&peer_path).expect("the peer's JSON parses as v1");
    assert_eq!(parsed.label, "get-2c-redis");
    assert_eq!(parsed.servers, vec![address]);
    assert_eq!(parsed.parameters["peer"], serde_json::json!("redis"));
    assert_eq!(parsed.operations, 400);
    assert_eq!(parsed.bytes, 400 * 4096, "every GET found its 4 KiB value");
    let line = ratio_line(&hydrant, &parsed, "redis");
    let expected = format!(
        "ops/s {:.2}",
        hydrant.operations_per_second / parsed.operations_per_second
    );
    assert!(line.starts_with("hydrant/redis: "), "{line}");
    assert!(line.contains(&expected), "{line} has {expected}");
    server.stop().expect("server stops");
    let _ = std::fs::remove_dir_all(&directory);
}

/// `shards --origin-s3`: the three paths in one run against moto behind the latency proxy (the
/// S3 server: `HYDRANT_TEST_S3_ENDPOINT`, as CI starts it, or a `moto_server` of our own). The
/// warm epoch must not touch the origin; the cold epoch and the direct path read every shard from
/// it.
#[test]
fn shards_compare_hydrant_with_the_origin_in_one_run() {
    let directory = scratch("shards-origin");
    let (s3, _moto) = match std::env::var("HYDRANT_TEST_S3_ENDPOINT") {
        Ok(endpoint) => (
            endpoint
                .trim_end_matches('/')
                .trim_start_matches("http://")
                .to_string(),
            None,
        ),
        Err(_) => {
            let port = free_port().to_string();
            let address = format!("127.0.0.1:{port}");
            let moto = spawn_listening(
                "moto_server",
                &["-H", "127.0.0.1", "-p", &port],
                &address,
                "pip install 'moto[server]'",
            );
            (address, Some(moto))
        }
    };
    let mut args = shards_args_for_tests();
    args.common.servers.clear();
    args.common.duration = None;
    args.common.json = Some(directory.join("shards.json"));
    args.shard_bytes = 256 << 10;
    args.compute_ms = 1.0;
    args.origin = OriginModeArgs {
        origin_s3: Some(s3),
        origin_delay_ms: "1-3".into(),
        origin_data_dir: directory.clone(),
    };
    let summaries = shards_against_origin(&args).expect("the three paths");
    let paths: Vec<&str> = summaries.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, [HYDRANT_WARM, HYDRANT_COLD, ORIGIN_DIRECT]);
    let shards = 2 * 4;
    for summary in &summaries {
        assert_eq!(summary.shards_read, shards, "{summary:?}");
        assert!(summary.utilisation_percent.is_some() && summary.passed.is_some());
        let parsed = super::report::read(&directory.join(format!("shards-{}.json", summary.path)))
            .expect("each path's JSON parses as v1");
        assert_eq!(parsed.parameters["path"], serde_json::json!(summary.path));
        assert_eq!(parsed.label, format!("shards-2c-{}", summary.path));
        assert_eq!(parsed.bytes, shards * (256 << 10));
    }
    assert_eq!(
        summaries[0].origin_gets, 0,
        "the warm epoch read the origin"
    );
    assert!(summaries[1].origin_gets >= shards, "{:?}", summaries[1]);
    assert_eq!(summaries[2].origin_gets, shards);
    let _ = std::fs::remove_dir_all(&directory);
}
