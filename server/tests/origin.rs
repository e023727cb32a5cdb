//! Origins through their real APIs: the `hydrant-server` process in front of a local S3 server
//! (moto's), an Azure Blob emulator (Azurite) and a GCS emulator, reached through hydrant's
//! fault-injecting proxy, which counts every origin request and can slow, throttle, fail or cut
//! them. Each behaviour is one test body, run once per kind of origin.
//!
//! The servers: those CI started (`HYDRANT_TEST_S3_ENDPOINT`, `HYDRANT_TEST_AZURE_ENDPOINT`), or
//! else ones the tests start. The GCS runs are ignored unless asked for (`--run-ignored`), with
//! `HYDRANT_TEST_GCS_ENDPOINT` naming an emulator that speaks the XML API object_store uses for
//! GCS (fake-gcs-server does; the emulator on PyPI, gcp-storage-emulator, answers PUTs without
//! an ETag, percent-encoded names, HEAD, listings and multipart uploads with errors, so nothing
//! can run against it). Each test uses buckets of its own.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, object_bytes, Kind, Store};
use hydrant_client::{Client, ClientConfig, ClientError};
use hydrant_fault_proxy::{ConfigUpdate, DelayRange, Method, ProxyHandle, Stats};
use hydrant_proto::Status;

const CHUNK_BYTES: u64 = 4 << 20;

/// One test per kind of origin for a behaviour written once as `fn behaviour(kind: Kind)`.
macro_rules! per_origin_kind {
    ($behaviour:ident) => {
        mod $behaviour {
            #[test]
            fn s3() {
                super::$behaviour(super::Kind::S3)
            }
            #[test]
            #[ignore = "needs a GCS emulator that speaks the XML API: set HYDRANT_TEST_GCS_ENDPOINT"]
            fn gcs() {
                super::$behaviour(super::Kind::Gcs)
            }
            #[test]
            fn azure() {
                super::$behaviour(super::Kind::Azure)
            }
        }
    };
}

/// A bucket of the origin's server, reached directly (not through hydrant, not through the
/// proxy), to put objects in and check what reached it.
struct Origin<'a> {
    store: &'a Store,
    bucket: String,
}

impl Origin<'_> {
    fn new<'a>(store: &'a Store, bucket: &str) -> Origin<'a> {
        store.create_bucket(bucket);
        Origin {
            store,
            bucket: bucket.to_string(),
        }
    }

    fn put(&self, key: &str, data: &[u8]) {
        self.store.put(&self.bucket, key, data);
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.store.get(&self.bucket, key)
    }
}

/// Whether the requests between two snapshots of the proxy's counters include a multipart
/// upload: S3 and GCS create and complete one with POSTs; Azure puts blocks, then the block
/// list, all with PUTs.
fn uploaded_in_parts(kind: Kind, before: &Stats, after: &Stats) -> bool {
    let more = |method| after.method(method).requests - before.method(method).requests;
    match kind {
        Kind::S3 | Kind::Gcs => more(Method::Post) >= 2,
        Kind::Azure => more(Method::Put) >= 3,
    }
}

/// The proxy in front of the origin's server, without delay unless a test asks for one.
fn proxy(s3: &Store) -> ProxyHandle {
    let mut config = hydrant_fault_proxy::Config::new(s3.address());
    config.settings.delay = DelayRange::NONE;
    hydrant_fault_proxy::start(config).unwrap()
}

fn set_proxy(proxy: &ProxyHandle, query: &str) {
    proxy
        .set_config(ConfigUpdate::from_query(query).unwrap())
        .unwrap();
}

struct ServerProcess {
    child: Child,
    address: String,
    directory: PathBuf,
    keep_directory: bool,
}

impl ServerProcess {
    /// hydrant-server on `directory` with its origin, `store`, reached through `proxy`.
    fn start(
        directory: &Path,
        store: &Store,
        proxy: &ProxyHandle,
        extra: &[&str],
    ) -> ServerProcess {
        ServerProcess::start_with_shards(directory, store, proxy, extra, 2)
    }

    fn start_with_shards(
        directory: &Path,
        store: &Store,
        proxy: &ProxyHandle,
        extra: &[&str],
        shards: usize,
    ) -> ServerProcess {
        ServerProcess::start_sized(directory, store, proxy, extra, shards, 768)
    }

    fn start_sized(
        directory: &Path,
        store: &Store,
        proxy: &ProxyHandle,
        extra: &[&str],
        shards: usize,
        data_mib: u64,
    ) -> ServerProcess {
        let mut command = ServerProcess::command(directory, extra, shards, data_mib);
        command.envs(store.env_via(&proxy.addr().to_string()));
        ServerProcess::spawn(command, directory)
    }

    /// The command line of a hydrant-server on `directory`, with no origin but those `extra`
    /// configures.
    fn command(directory: &Path, extra: &[&str], shards: usize, data_mib: u64) -> Command {
        std::fs::create_dir_all(directory).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_hydrant-server"));
        command
            .args(["--listen", "127.0.0.1:0", "--shards", &shards.to_string()])
            .arg("--data")
            .arg(format!(
                "{}:{data_mib}MiB",
                directory.join("data.hyd").display()
            ))
            .args(["--origin", "none"])
            .args(extra);
        command
    }

    fn spawn(mut command: Command, directory: &Path) -> ServerProcess {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start hydrant-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("the server prints where it listens, got {line:?}"))
            .to_string();
        ServerProcess {
            child,
            address,
            directory: directory.to_path_buf(),
            keep_directory: false,
        }
    }

    /// A client that does not retry, so that each call sees the server's own answer (an origin
    /// fault the server gives up on is ORIGIN_UNAVAILABLE at once, not after the client's
    /// retries).
    fn client(&self) -> Client {
        let config = ClientConfig::new(std::slice::from_ref(&self.address))
            .connect_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_secs(60))
            .retries_max(0);
        Client::with_config(config).unwrap()
    }

    fn kill(mut self) {
        self.keep_directory = true;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// A gauge or counter summed over the server's metrics.
    fn metric(&self, name: &str) -> u64 {
        let mut client = self.client();
        let (_, text) = client.stats().unwrap().remove(0);
        text.lines()
            .filter(|line| line.split([' ', '{']).next() == Some(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.keep_directory {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }
}

/// An empty folder of this test's own: unique per call, so that the per-kind runs of one
/// behaviour never share one when a test runner runs them as threads of one process.
fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("origin-{name}-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    directory
}

fn status_of(error: &ClientError) -> Option<u8> {
    match error {
        ClientError::Status { status, .. } => Some(*status),
        _ => None,
    }
}

fn read_through_serves_origin_objects_once_and_coalesces_cold_readers(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "read-through");
    let proxy = proxy(&s3);
    let small: Vec<Vec<u8>> = (0..3).map(|index| object_bytes(index, 100_000)).collect();
    for (index, data) in small.iter().enumerate() {
        origin.put(&format!("small/{index}"), data);
    }
    let cold = object_bytes(99, 1 << 20);
    origin.put("cold/one", &cold);
    let server = ServerProcess::start(
        &scratch("read-through"),
        &s3,
        &proxy,
        &["--bucket", &format!("data={}", s3.url("read-through"))],
    );
    let mut client = server.client();
    for round in 0..2 {
        for (index, data) in small.iter().enumerate() {
            let (_, read) = client.get("data", &format!("small/{index}"), None).unwrap();
            assert_eq!(&read, data, "round {round}, object {index}");
        }
    }
    for index in 0..3 {
        assert_eq!(
            proxy
                .stats()
                .gets_of(&s3.request_path(&format!("/read-through/small/{index}"))),
            1,
            "the second read of small/{index} is a hit"
        );
    }
    assert!(client
        .get("data", "small/missing", None)
        .unwrap_err()
        .is_not_found());
    let (info, empty) = client
        .get("data", "small/1", Some((500, Some(500))))
        .unwrap();
    assert!(empty.is_empty());
    assert_eq!(info.object_bytes, 100_000);
    let listed: Vec<String> = client
        .list("data", "small/", None, 100)
        .unwrap()
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    assert_eq!(listed, ["small/0", "small/1", "small/2"]);
    let info = client.head("data", "cold/one").unwrap();
    assert_eq!(info.object_bytes, 1 << 20);

    // 100 readers of one cold object, all at once, behind an origin that takes 300 ms.
    set_proxy(&proxy, "delay_ms=300-300");
    let start = Arc::new(std::sync::Barrier::new(100));
    let readers: Vec<_> = (0..100)
        .map(|_| {
            let address = server.address.clone();
            let start = start.clone();
            let expected = cold.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(&[address], Duration::from_secs(60)).unwrap();
                start.wait();
                let (_, read) = client.get("data", "cold/one", None).unwrap();
                assert_eq!(read, expected);
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    assert_eq!(
        proxy
            .stats()
            .gets_of(&s3.request_path("/read-through/cold/one")),
        1,
        "100 concurrent readers of a cold object make one origin GET"
    );
}

per_origin_kind!(read_through_serves_origin_objects_once_and_coalesces_cold_readers);

fn range_reads_of_a_large_object_cache_only_the_chunks_touched(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "ranges");
    let proxy = proxy(&s3);
    let large = object_bytes(7, 256 << 20);
    origin.put("big", &large);
    let server = ServerProcess::start(
        &scratch("ranges"),
        &s3,
        &proxy,
        &[
            "--bucket",
            &format!("data={}", s3.url("ranges,revalidate=immutable")),
        ],
    );
    let mut client = server.client();
    let stored_before = server.metric("hydrant_object_bytes");
    // Inside chunk 10, and across the boundary of chunks 40 and 41.
    let ranges = [
        (10 * CHUNK_BYTES + 100, 10 * CHUNK_BYTES + 5_000),
        (41 * CHUNK_BYTES - 1_000, 41 * CHUNK_BYTES + 1_000),
    ];
    for (start, end) in ranges {
        let (info, read) = client.get("data", "big", Some((start, Some(end)))).unwrap();
        assert_eq!(info.object_bytes, 256 << 20);
        assert_eq!(read, &large[start as usize..end as usize]);
    }
    // Let admission and the read-ahead after 41 (a range read across a chunk boundary is two
    // sequential chunk reads) finish.
    std::thread::sleep(Duration::from_millis(500));
    let gets_after_first = proxy.stats().gets_of(&s3.request_path("/ranges/big"));
    // The first chunk (which told the size), chunk 10, chunks 40 and 41, and perhaps the 8
    // chunks read ahead after 41: never the whole object (64 chunks).
    assert!(
        (4..=12).contains(&gets_after_first),
        "{gets_after_first} origin GETs"
    );
    let stored = server.metric("hydrant_object_bytes") - stored_before;
    assert!(
        (4 * CHUNK_BYTES..=12 * CHUNK_BYTES).contains(&stored),
        "{stored} bytes cached for four chunks touched (plus readahead)"
    );
    for (start, end) in ranges {
        let (_, read) = client.get("data", "big", Some((start, Some(end)))).unwrap();
        assert_eq!(read, &large[start as usize..end as usize]);
    }
    assert_eq!(
        proxy.stats().gets_of(&s3.request_path("/ranges/big")),
        gets_after_first,
        "the second read of the same ranges is served from NVMe"
    );
}

per_origin_kind!(range_reads_of_a_large_object_cache_only_the_chunks_touched);

fn revalidation_follows_each_buckets_rule(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "revalidate");
    let proxy = proxy(&s3);
    origin.put("ttl/object", b"first version");
    origin.put("immutable/object", b"first version");
    let server = ServerProcess::start(
        &scratch("revalidate"),
        &s3,
        &proxy,
        &[
            "--bucket",
            &format!("fresh={}", s3.url("revalidate/ttl,revalidate=ttl=2s")),
            "--bucket",
            &format!(
                "fixed={}",
                s3.url("revalidate/immutable,revalidate=immutable")
            ),
        ],
    );
    let mut client = server.client();
    for bucket in ["fresh", "fixed"] {
        assert_eq!(
            client.get(bucket, "object", None).unwrap().1,
            b"first version"
        );
    }
    let started = Instant::now();
    origin.put("ttl/object", b"second version");
    origin.put("immutable/object", b"second version");
    let immutable_gets = proxy
        .stats()
        .gets_of(&s3.request_path("/revalidate/immutable/object"));
    // Before the TTL: the cached copy.
    assert_eq!(
        client.get("fresh", "object", None).unwrap().1,
        b"first version"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the test itself was too slow"
    );
    std::thread::sleep(Duration::from_millis(2_200));
    assert_eq!(
        client.get("fresh", "object", None).unwrap().1,
        b"second version"
    );
    assert_eq!(
        client.get("fresh", "object", None).unwrap().1,
        b"second version"
    );
    assert_eq!(
        client.get("fixed", "object", None).unwrap().1,
        b"first version"
    );
    assert_eq!(
        proxy
            .stats()
            .gets_of(&s3.request_path("/revalidate/immutable/object")),
        immutable_gets,
        "an immutable bucket never asks the origin again"
    );
    // After another TTL with no change, the conditional GET keeps the copy (304).
    std::thread::sleep(Duration::from_millis(2_200));
    let before = proxy
        .stats()
        .gets_of(&s3.request_path("/revalidate/ttl/object"));
    assert_eq!(
        client.get("fresh", "object", None).unwrap().1,
        b"second version"
    );
    assert_eq!(
        proxy
            .stats()
            .gets_of(&s3.request_path("/revalidate/ttl/object")),
        before + 1
    );
}

per_origin_kind!(revalidation_follows_each_buckets_rule);

fn write_back_write_through_multipart_and_read_only(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "writes");
    let proxy = proxy(&s3);
    // One shard, so that a 100 MiB object fits beside the others in 768 MiB.
    let server = ServerProcess::start_with_shards(
        &scratch("writes"),
        &s3,
        &proxy,
        &[
            "--bucket",
            &format!("back={}", s3.url("writes/back,write=back")),
            "--bucket",
            &format!("through={}", s3.url("writes/through,write=through")),
            "--bucket",
            &format!("frozen={}", s3.url("writes/frozen,write=read-only")),
        ],
        1,
    );
    let mut client = server.client();
    // Write-through: at the origin as soon as the PUT is answered.
    let data = object_bytes(1, 300_000);
    client.put("through", "a", &data).unwrap();
    assert_eq!(origin.get("through/a").as_deref(), Some(&data[..]));
    // Write-back: acknowledged from NVMe, at the origin after FLUSH.
    let objects: Vec<Vec<u8>> = (0..10)
        .map(|index| object_bytes(100 + index, 50_000))
        .collect();
    for (index, data) in objects.iter().enumerate() {
        let info = client
            .put("back", &format!("step-1/{index}"), data)
            .unwrap();
        assert!(info.dirty);
    }
    // LIST shows dirty objects even before they reach the origin.
    assert_eq!(client.list("back", "step-1/", None, 100).unwrap().len(), 10);
    client
        .flush(Some("back"), "step-1/", Duration::from_secs(60))
        .unwrap();
    for (index, data) in objects.iter().enumerate() {
        assert_eq!(
            origin.get(&format!("back/step-1/{index}")).as_deref(),
            Some(&data[..])
        );
    }
    assert!(!client.head("back", "step-1/0").unwrap().dirty);
    // A 100 MiB object goes up in parts.
    let before = proxy.stats();
    let big = object_bytes(5, 100 << 20);
    client.put("back", "checkpoint.bin", &big).unwrap();
    client.flush(None, "", Duration::from_secs(120)).unwrap();
    assert!(
        uploaded_in_parts(kind, &before, &proxy.stats()),
        "a 100 MiB object goes up in parts: {}",
        proxy.stats().to_json()
    );
    assert!(origin.get("back/checkpoint.bin").unwrap() == big);
    // Keys an object store cannot name apart are refused before anything is stored.
    for key in ["dir/", "a//b"] {
        let error = client.put("back", key, b"x").unwrap_err();
        assert_eq!(
            status_of(&error),
            Some(Status::InvalidKey as u8),
            "{key}: {error}"
        );
    }
    // Read-only: refused, nothing stored.
    let error = client.put("frozen", "x", b"no").unwrap_err();
    assert_eq!(status_of(&error), Some(Status::ReadOnly as u8), "{error}");
    assert!(origin.get("frozen/x").is_none());
    // DELETE reaches the origin.
    client.delete("through", "a").unwrap();
    assert!(origin.get("through/a").is_none());
}

per_origin_kind!(write_back_write_through_multipart_and_read_only);

fn a_crash_during_uploads_loses_nothing_acknowledged(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "crash");
    let proxy = proxy(&s3);
    // A slow origin, so that uploads are in flight when the server dies.
    set_proxy(&proxy, "delay_ms=200-400&bandwidth=1MiB");
    let directory = scratch("crash");
    let bucket = format!("ckpt={}", s3.url("crash,write=back"));
    let arguments = ["--bucket", bucket.as_str()];
    let server = ServerProcess::start(&directory, &s3, &proxy, &arguments);
    let mut client = server.client();
    let objects: Vec<Vec<u8>> = (0..24)
        .map(|index| object_bytes(1000 + index, 500_000 + index as usize * 1000))
        .collect();
    for (index, data) in objects.iter().enumerate() {
        client.put("ckpt", &format!("shard-{index}"), data).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let uploaded_before_crash = (0..objects.len())
        .filter(|index| origin.get(&format!("shard-{index}")).is_some())
        .count();
    server.kill();
    assert!(
        uploaded_before_crash < objects.len(),
        "the crash came after every upload; slow the origin more"
    );
    set_proxy(&proxy, "delay_ms=0-0&bandwidth=0");
    let restarted = ServerProcess::start(&directory, &s3, &proxy, &arguments);
    restarted
        .client()
        .flush(None, "", Duration::from_secs(120))
        .unwrap();
    for (index, data) in objects.iter().enumerate() {
        assert_eq!(
            origin.get(&format!("shard-{index}")).as_deref(),
            Some(&data[..]),
            "acknowledged object shard-{index} reached the origin byte-exact"
        );
    }
}

per_origin_kind!(a_crash_during_uploads_loses_nothing_acknowledged);

fn origin_faults_lose_no_write_and_reads_are_correct_or_clear_errors(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "faults");
    let proxy = proxy(&s3);
    let readable: Vec<Vec<u8>> = (0..40)
        .map(|index| object_bytes(200 + index, 20_000))
        .collect();
    for (index, data) in readable.iter().enumerate() {
        origin.put(&format!("in/{index}"), data);
    }
    let server = ServerProcess::start(
        &scratch("faults"),
        &s3,
        &proxy,
        &["--bucket", &format!("data={}", s3.url("faults,write=back"))],
    );
    let mut client = server.client();
    set_proxy(&proxy, "fault_rate=0.2&faults=503,reset");
    let written: Vec<Vec<u8>> = (0..40)
        .map(|index| object_bytes(300 + index, 30_000))
        .collect();
    for (index, data) in written.iter().enumerate() {
        client.put("data", &format!("out/{index}"), data).unwrap();
    }
    let (mut correct, mut refused) = (0, 0);
    for (index, data) in readable.iter().enumerate() {
        match client.get("data", &format!("in/{index}"), None) {
            Ok((_, read)) => {
                assert_eq!(&read, data, "a read under faults is correct or an error");
                correct += 1;
            }
            Err(error) => {
                assert_eq!(
                    status_of(&error),
                    Some(Status::OriginUnavailable as u8),
                    "{error}"
                );
                refused += 1;
            }
        }
    }
    assert!(proxy.stats().total.faulted > 0, "faults were injected");
    assert!(correct > 0, "{refused} reads refused, none served");
    client.flush(None, "", Duration::from_secs(120)).unwrap();
    set_proxy(&proxy, "fault_rate=0");
    for (index, data) in written.iter().enumerate() {
        assert_eq!(
            origin.get(&format!("out/{index}")).as_deref(),
            Some(&data[..]),
            "out/{index}"
        );
    }
}

per_origin_kind!(origin_faults_lose_no_write_and_reads_are_correct_or_clear_errors);

fn with_the_origin_down_hits_are_served_misses_fail_clearly_and_writes_wait(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "down");
    let proxy = proxy(&s3);
    origin.put("cached", b"warm bytes");
    origin.put("uncached", b"cold bytes");
    let server = ServerProcess::start(
        &scratch("down"),
        &s3,
        &proxy,
        &["--bucket", &format!("data={}", s3.url("down,write=back"))],
    );
    let mut client = server.client();
    assert_eq!(client.get("data", "cached", None).unwrap().1, b"warm bytes");
    set_proxy(&proxy, "fault_rate=1&faults=503");
    assert_eq!(client.get("data", "cached", None).unwrap().1, b"warm bytes");
    let error = client.get("data", "uncached", None).unwrap_err();
    assert_eq!(
        status_of(&error),
        Some(Status::OriginUnavailable as u8),
        "{error}"
    );
    assert!(error.is_retriable());
    client
        .put("data", "written", b"waits for the origin")
        .unwrap();
    let error = client
        .flush(Some("data"), "", Duration::from_millis(1_500))
        .unwrap_err();
    assert_eq!(status_of(&error), Some(Status::Timeout as u8), "{error}");
    assert!(
        origin.get("written").is_none(),
        "{}",
        proxy.stats().to_json()
    );
    set_proxy(&proxy, "fault_rate=0");
    client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        origin.get("written").as_deref(),
        Some(&b"waits for the origin"[..])
    );
}

per_origin_kind!(with_the_origin_down_hits_are_served_misses_fail_clearly_and_writes_wait);

/// A bucket's own `endpoint=` and `settings=FILE` reach its origin with none of the store's
/// environment variables set, and a setting the store does not know stops the start with an
/// error that names it.
fn a_buckets_own_endpoint_and_settings_reach_its_origin(kind: Kind) {
    let s3 = Store::of(kind);
    let origin = Origin::new(&s3, "own-settings");
    let proxy = proxy(&s3);
    origin.put("in/a", b"from the origin");
    let settings_directory = scratch("own-settings-file");
    std::fs::create_dir_all(&settings_directory).unwrap();
    let settings = settings_directory.join("origin.env");
    std::fs::write(&settings, s3.settings_file()).unwrap();
    let spec = format!(
        "data={},write=through,endpoint={},settings={}",
        s3.url("own-settings"),
        s3.endpoint_via(&proxy.addr().to_string()),
        settings.display()
    );
    let without_environment = |mut command: Command| {
        for (name, _) in std::env::vars() {
            if ["AWS_", "AZURE_", "AZURITE_", "GOOGLE_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                command.env_remove(name);
            }
        }
        command
    };
    let directory = scratch("own-settings");
    let server = ServerProcess::spawn(
        without_environment(ServerProcess::command(
            &directory,
            &["--bucket", &spec],
            1,
            256,
        )),
        &directory,
    );
    let mut client = server.client();
    assert_eq!(
        client.get("data", "in/a", None).unwrap().1,
        b"from the origin"
    );
    client.put("data", "out/b", b"to the origin").unwrap();
    assert_eq!(origin.get("out/b").as_deref(), Some(&b"to the origin"[..]));
    assert_eq!(
        proxy
            .stats()
            .gets_of(&s3.request_path("/own-settings/in/a")),
        1,
        "the read went to the bucket's endpoint"
    );

    std::fs::write(
        &settings,
        format!(
            "{}\n# a comment\nshade_of_blue = \"navy\"\n",
            s3.settings_file()
        ),
    )
    .unwrap();
    let refused_directory = scratch("own-settings-refused");
    let output = without_environment(ServerProcess::command(
        &refused_directory,
        &["--bucket", &spec],
        1,
        256,
    ))
    .output()
    .unwrap();
    let _ = std::fs::remove_dir_all(&refused_directory);
    let _ = std::fs::remove_dir_all(&settings_directory);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("unknown setting \"shade_of_blue\""),
        "{stderr}"
    );
}

per_origin_kind!(a_buckets_own_endpoint_and_settings_reach_its_origin);

#[test]
fn backpressure_keeps_dirty_bytes_within_the_budget() {
    let s3 = Store::start();
    let origin = Origin::new(&s3, "pressure");
    let proxy = proxy(&s3);
    // The origin takes 10 MiB/s; the writer pushes 2 GiB through a 256 MiB budget (about
    // 3.5 minutes, most of this suite's time).
    set_proxy(&proxy, "bandwidth=10MiB");
    const BUDGET: u64 = 256 << 20;
    const OBJECT: usize = 1 << 20;
    const OBJECTS: u64 = 2048;
    let server = ServerProcess::start_sized(
        &scratch("pressure"),
        &s3,
        &proxy,
        &[
            "--bucket",
            &format!("data={}", s3.url("pressure,write=back")),
            "--dirty-bytes-max",
            "256MiB",
        ],
        2,
        1536,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let highest = Arc::new(AtomicU64::new(0));
    let sampler = {
        let stop = stop.clone();
        let highest = highest.clone();
        let address = server.address.clone();
        std::thread::spawn(move || {
            let mut client = Client::connect(&[address], Duration::from_secs(60)).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let (_, text) = client.stats().unwrap().remove(0);
                let dirty = text
                    .lines()
                    .find_map(|line| line.strip_prefix("hydrant_dirty_bytes "))
                    .and_then(|value| value.trim().parse::<u64>().ok())
                    .expect("the dirty gauge is exported");
                highest.fetch_max(dirty, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut client = server.client();
    let mut busy = 0;
    for index in 0..OBJECTS {
        let data = object_bytes(index, OBJECT);
        loop {
            match client.put("data", &format!("part-{index}"), &data) {
                Ok(_) => break,
                Err(error) if status_of(&error) == Some(Status::Busy as u8) => busy += 1,
                Err(error) => panic!("put part-{index}: {error}"),
            }
        }
    }
    client.flush(None, "", Duration::from_secs(120)).unwrap();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let highest = highest.load(Ordering::Relaxed);
    assert!(
        highest <= BUDGET,
        "dirty bytes reached {highest}, above {BUDGET}"
    );
    assert!(
        highest >= BUDGET / 2,
        "the writer never filled the budget ({highest})"
    );
    for index in 0..OBJECTS {
        assert!(
            origin.get(&format!("part-{index}")).unwrap() == object_bytes(index, OBJECT),
            "part-{index} reached the origin byte-exact"
        );
    }
    eprintln!("{busy} PUTs were answered BUSY and retried; dirty bytes peaked at {highest}");
}

#[test]
fn prefetch_warms_a_prefix_so_that_reads_do_not_reach_the_origin() {
    let s3 = Store::start();
    let origin = Origin::new(&s3, "prefetch");
    let proxy = proxy(&s3);
    let objects: Vec<Vec<u8>> = (0..6)
        .map(|index| object_bytes(500 + index, 70_000))
        .collect();
    for (index, data) in objects.iter().enumerate() {
        origin.put(&format!("train/{index}"), data);
    }
    origin.put("other/x", b"not under the prefix");
    let server = ServerProcess::start(
        &scratch("prefetch"),
        &s3,
        &proxy,
        &["--bucket", &format!("data={}", s3.url("prefetch"))],
    );
    let mut client = server.client();
    let (warmed, bytes) = client.prefetch("data", "train/").unwrap();
    assert_eq!((warmed, bytes), (6, 6 * 70_000));
    std::thread::sleep(Duration::from_millis(300)); // admissions finish
    let gets_after_prefetch = proxy.stats().method(Method::Get).requests;
    for (index, data) in objects.iter().enumerate() {
        assert_eq!(
            &client
                .get("data", &format!("train/{index}"), None)
                .unwrap()
                .1,
            data
        );
    }
    assert_eq!(
        proxy.stats().method(Method::Get).requests,
        gets_after_prefetch,
        "reads after PREFETCH are served from NVMe"
    );
    assert_eq!(
        proxy.stats().gets_of(&s3.request_path("/prefetch/other/x")),
        0
    );
}

/// The order in which `keys` of a loader-order plan are read: a fixed shuffle.
fn shuffled(count: usize, seed: u64) -> Vec<String> {
    let mut keys: Vec<String> = (0..count)
        .map(|index| format!("epoch/{index:03}"))
        .collect();
    let mut state = seed | 1;
    for index in (1..keys.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        keys.swap(index, (state % (index as u64 + 1)) as usize);
    }
    keys
}

#[test]
fn a_plan_reads_ahead_of_its_reader_in_its_order_within_its_window() {
    const OBJECTS: usize = 40;
    const OBJECT_BYTES: usize = 1 << 20;
    let s3 = Store::start();
    let origin = Origin::new(&s3, "plan");
    let proxy = proxy(&s3);
    for index in 0..OBJECTS {
        origin.put(
            &format!("epoch/{index:03}"),
            &object_bytes(900 + index as u64, OBJECT_BYTES),
        );
    }
    let server = ServerProcess::start(
        &scratch("plan"),
        &s3,
        &proxy,
        &["--bucket", &format!("data={}", s3.url("plan"))],
    );
    let mut client = server.client();
    let order = shuffled(OBJECTS, 7);
    let origin_gets = |key: &str| {
        proxy
            .stats()
            .gets_of(&s3.request_path(&format!("/plan/{key}")))
    };
    // Out of bounds: refused, nothing planned.
    let error = client
        .plan("data", 1, &order, 0, Duration::from_secs(30))
        .unwrap_err();
    assert_eq!(status_of(&error), Some(Status::BadRequest as u8), "{error}");
    assert_eq!(server.metric("hydrant_plans"), 0);

    // A window of 8 MiB over two shards: each reads ahead 4 MiB of its own keys (4 objects,
    // and its reads in flight), in the plan's order, before any reader comes.
    let window = 8 * OBJECT_BYTES as u64;
    let planned = client
        .plan("data", 1, &order, window, Duration::from_secs(30))
        .unwrap();
    assert_eq!(planned, OBJECTS as u64);
    let settled = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = server.metric("hydrant_plan_prefetched_total");
        loop {
            assert!(
                Instant::now() < deadline,
                "the plan read nothing ahead in 30 s"
            );
            std::thread::sleep(Duration::from_millis(300));
            let now = server.metric("hydrant_plan_prefetched_total");
            if now == last && now > 0 {
                return now;
            }
            last = now;
        }
    };
    let ahead = settled();
    assert!(
        (8..=16).contains(&ahead),
        "read {ahead} objects ahead with a window of 8"
    );
    for key in &order[..4] {
        assert_eq!(
            origin_gets(key),
            1,
            "{key}, among the first planned, is read ahead"
        );
    }
    for key in &order[OBJECTS * 3 / 4..] {
        assert_eq!(
            origin_gets(key),
            0,
            "{key}, late in the plan, waits for the readers"
        );
    }
    assert_eq!(server.metric("hydrant_plans"), 2, "one per shard");

    // The reader follows the plan: every object arrives whole, the window moves with it, and
    // each is read from the origin once, mostly before the reader asks for it.
    for key in &order {
        let index: u64 = key.trim_start_matches("epoch/").parse().unwrap();
        let (_, data) = client.get("data", key, None).unwrap();
        assert!(data == object_bytes(900 + index, OBJECT_BYTES), "{key}");
    }
    for key in &order {
        assert_eq!(origin_gets(key), 1, "{key} is read from the origin once");
    }
    let hits = server.metric("hydrant_plan_hits_total");
    eprintln!(
        "read ahead before the reader came: {ahead}; reads that hit the plan: {hits} of {OBJECTS}"
    );
    assert!(
        hits >= OBJECTS as u64 / 2,
        "{hits} reads found their object read ahead"
    );
    // Its readers passed its end: the plan is over, and nothing it read was wasted.
    eventually("the finished plan to end", || {
        server.metric("hydrant_plans") == 0
    });
    assert_eq!(server.metric("hydrant_plan_wasted_total"), 0);

    // A plan no reader follows ends after its idle time, and what it read is wasted.
    let others: Vec<String> = (0..4).map(|index| format!("other/{index}")).collect();
    for key in &others {
        origin.put(key, &object_bytes(1, 1000));
    }
    client
        .plan("data", 2, &others, window, Duration::from_millis(500))
        .unwrap();
    eventually("the idle plan to end", || {
        server.metric("hydrant_plans_idle_ended_total") >= 1 && server.metric("hydrant_plans") == 0
    });
    assert_eq!(server.metric("hydrant_plan_wasted_total"), 4);
}
