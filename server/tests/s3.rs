//! The S3 endpoint of a real `hydrant-server` process, driven by real S3 clients (boto3), alone
//! and in front of an S3 origin (moto's server, `HYDRANT_TEST_S3_ENDPOINT` or one of its own).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{S3Server, Scratch, ServerProcess};

/// Run one of the Python scripts beside this file against `endpoint`; it asserts and exits 0.
fn run_script(script: &str, endpoint: &str) {
    run_script_with(script, &[endpoint]);
}

/// Run one of the Python scripts beside this file with `arguments`; it asserts and exits 0.
fn run_script_with(script: &str, arguments: &[&str]) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/s3/").to_string() + script;
    let output = Command::new("python3")
        .arg(&path)
        .args(arguments)
        .output()
        .expect("python3 runs (scripts/test installs boto3)");
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn boto3_serves_every_object_and_bucket_operation() {
    let scratch = Scratch::new("s3-boto3");
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    let endpoint = server.s3_endpoint();
    run_script("boto3_objects.py", &endpoint);
}

/// ETags and Last-Modified as S3 makes them (MD5s, the write's time), from every answer, and
/// the same after the server is killed (SIGKILL) and started again on its data file.
#[test]
fn boto3_sees_md5_etags_and_write_times_that_survive_a_crash() {
    let scratch = Scratch::new("s3-metadata");
    let state = scratch.path().join("seen.json");
    let state = state.to_str().expect("a UTF-8 path");
    let mut server =
        ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    run_script_with(
        "boto3_metadata.py",
        &["write", &server.s3_endpoint(), state],
    );
    server.kill();
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    run_script_with(
        "boto3_metadata.py",
        &["check", &server.s3_endpoint(), state],
    );
}

/// The checksums boto3 sends with its PUTs come back on GET and HEAD when it asks (and boto3
/// checks them against the bytes), the same after the server is killed and started again.
#[test]
fn boto3_gets_back_the_checksums_it_sent() {
    let scratch = Scratch::new("s3-checksums");
    let mut server =
        ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    run_script_with("boto3_checksums.py", &["write", &server.s3_endpoint()]);
    server.kill();
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    run_script_with("boto3_checksums.py", &["check", &server.s3_endpoint()]);
}

/// s3torchconnector (the AWS connector for PyTorch, on the CRT), unchanged: its map and
/// iterable datasets over 1,000 objects, a DataLoader with workers, and S3Checkpoint.
#[test]
fn s3torchconnector_reads_datasets_and_writes_checkpoints() {
    let scratch = Scratch::new("s3-torchconnector");
    let server = ServerProcess::start(scratch.path(), 1024, &["--s3-listen", "127.0.0.1:0"], &[]);
    let endpoint = server.s3_endpoint();
    run_script("s3torchconnector_datasets.py", &endpoint);
}

/// The origin's bucket in the S3 server, which other tests share: a name only this test uses.
const ORIGIN_BUCKET: &str = "hydrant-s3-endpoint-origin";

/// The S3 endpoint in front of an S3 origin (moto's server, reached through hydrant's fault
/// proxy): objects put straight into the origin are read through hydrant whole and by range;
/// objects put through hydrant into a write-back bucket while the origin is down are
/// acknowledged, and reach the origin byte-exact after it is back and FLUSH (the large ones in
/// parts, the others with the checksum their writer sent); deletes through hydrant delete at the origin. boto3 does the S3 side in three
/// phases; the FLUSH between the second and the third is a native-protocol request.
#[test]
fn boto3_reads_through_and_writes_back_to_an_s3_origin() {
    let s3 = S3Server::start();
    s3.create_bucket(ORIGIN_BUCKET);
    let mut proxy_config = hydrant_fault_proxy::Config::new(s3.address());
    proxy_config.settings.delay = hydrant_fault_proxy::DelayRange::NONE;
    let proxy = hydrant_fault_proxy::start(proxy_config).unwrap();
    let set_proxy = |query: &str| {
        proxy
            .set_config(hydrant_fault_proxy::ConfigUpdate::from_query(query).unwrap())
            .unwrap()
    };
    let mut env = s3.env();
    for (name, value) in &mut env {
        if *name == "AWS_ENDPOINT" {
            *value = format!("http://{}", proxy.addr());
        }
    }
    let scratch = Scratch::new("s3-origin");
    let origin_prefix = "cache";
    let bucket = "remote";
    let route = format!("{bucket}=s3://{ORIGIN_BUCKET}/{origin_prefix},write=back");
    let server = ServerProcess::start(
        scratch.path(),
        1024,
        &[
            "--s3-listen",
            "127.0.0.1:0",
            "--origin",
            "none",
            "--bucket",
            &route,
        ],
        &env,
    );
    let endpoint = server.s3_endpoint();
    // The script reaches the origin directly, never through the proxy.
    let phase = |name: &str| {
        run_script_with(
            "boto3_origin.py",
            &[
                name,
                &endpoint,
                &s3.endpoint,
                ORIGIN_BUCKET,
                origin_prefix,
                bucket,
            ],
        )
    };
    phase("read");
    let origin_gets = proxy
        .stats()
        .method(hydrant_fault_proxy::Method::Get)
        .requests;
    assert!(origin_gets > 0, "the reads reached the origin");

    // Written back: acknowledged from NVMe while every origin request fails.
    set_proxy("fault_rate=1&faults=503");
    phase("write");
    let written = [
        "written/small-default",
        "written/large-default",
        "written/large-sha256",
        "written/medium-sha256",
    ]
    .map(|key| format!("{origin_prefix}/{key}"));
    let at_origin = s3.list(ORIGIN_BUCKET);
    for key in &written {
        assert!(
            !at_origin.contains(key),
            "{key} reached an origin that refused every request: {at_origin:?}"
        );
    }
    assert!(
        proxy.stats().total.faulted > 0,
        "uploads were tried and failed"
    );
    set_proxy("fault_rate=0");
    server
        .client()
        .flush(Some(bucket), "", Duration::from_secs(120))
        .expect("FLUSH: every write-back upload of the bucket finished");
    // Seen apart from the script too: the writes are at the origin now, under the prefix.
    let at_origin = s3.list(ORIGIN_BUCKET);
    for key in &written {
        assert!(
            at_origin.contains(key),
            "{key} at the origin: {at_origin:?}"
        );
    }
    phase("flushed");
    assert_eq!(
        s3.list(ORIGIN_BUCKET),
        Vec::<String>::new(),
        "deletes through hydrant left nothing at the origin"
    );
}

/// Write-back to an S3 origin that verifies every signature and checksum (a second hydrant,
/// with credentials): the objects boto3 writes with each of S3's checksums reach it in PUTs
/// that carry that checksum and the objects' headers, signed, and it keeps them.
#[test]
fn written_back_puts_carry_their_checksums_to_an_origin_that_checks_signatures() {
    const ACCESS_KEY: &str = "write-back";
    const SECRET: &str = "a secret of sixteen bytes or more";
    let origin_scratch = Scratch::new("s3-signed-origin");
    let credentials = origin_scratch.path().join("credentials.toml");
    std::fs::write(
        &credentials,
        format!(
            "[[key]]\naccess_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET}\"\nwrite = [\"*\"]\n"
        ),
    )
    .unwrap();
    let origin = ServerProcess::start(
        origin_scratch.path(),
        512,
        &[
            "--s3-listen",
            "127.0.0.1:0",
            "--origin",
            "none",
            "--s3-credentials",
            credentials.to_str().unwrap(),
        ],
        &[],
    );
    let origin_endpoint = origin.s3_endpoint();
    let env = [
        ("AWS_ENDPOINT", origin_endpoint.clone()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    let scratch = Scratch::new("s3-signed-writer");
    let server = ServerProcess::start(
        scratch.path(),
        512,
        &[
            "--s3-listen",
            "127.0.0.1:0",
            "--origin",
            "none",
            "--bucket",
            "ckpt=s3://checkpoints,write=back",
        ],
        &env,
    );
    let endpoint = server.s3_endpoint();
    let phase = |name: &str| {
        run_script_with(
            "boto3_signed_origin.py",
            &[
                name,
                &endpoint,
                &origin_endpoint,
                "checkpoints",
                "ckpt",
                ACCESS_KEY,
                SECRET,
            ],
        )
    };
    phase("write");
    server
        .client()
        .flush(Some("ckpt"), "", Duration::from_secs(60))
        .expect("FLUSH: every upload reached the origin");
    phase("flushed");
}
