//! The S3 endpoint of a real `hydrant-server` process, driven by real S3 clients (boto3).

mod common;

use std::process::Command;

use common::{Scratch, ServerProcess};

/// Run one of the Python scripts beside this file against `endpoint`; it asserts and exits 0.
fn run_script(script: &str, endpoint: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/s3/").to_string() + script;
    let output = Command::new("python3")
        .arg(&path)
        .arg(endpoint)
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
    let endpoint = format!(
        "http://{}",
        server
            .s3_address
            .as_deref()
            .expect("the server says where S3 listens")
    );
    run_script("boto3_objects.py", &endpoint);
}
