//! Multipart uploads through the S3 endpoint of a real `hydrant-server` process, by real clients
//! (boto3 and the AWS CLI): parts held on NVMe across a SIGKILL and restart, the CLI's own
//! multipart upload of 1 GiB, `sync`, `ls` and `rm --recursive`.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Scratch, ServerProcess};

fn script(name: &str) -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/s3/").to_string() + name
}

fn checked(what: &str, output: Output) -> String {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The server on `directory` (its device kept across restarts), S3 on a port of its own.
fn start(directory: &Path, data_mib: u64) -> ServerProcess {
    ServerProcess::start(directory, data_mib, &["--s3-listen", "127.0.0.1:0"], &[])
}

#[test]
fn boto3_multipart_uploads_survive_a_sigkill_and_complete_after_restart() {
    let scratch = Scratch::new("s3-multipart");
    let mut server = start(scratch.path(), 1024);
    let begun = checked(
        "boto3_multipart.py begin",
        Command::new("python3")
            .args([
                &script("boto3_multipart.py"),
                &server.s3_endpoint(),
                "begin",
            ])
            .output()
            .expect("python3 runs (scripts/test installs boto3)"),
    );
    let pending = begun
        .lines()
        .last()
        .expect("the script prints the pending upload");
    server.kill();
    let server = start(scratch.path(), 1024);
    checked(
        "boto3_multipart.py finish",
        Command::new("python3")
            .args([
                &script("boto3_multipart.py"),
                &server.s3_endpoint(),
                "finish",
                pending,
            ])
            .output()
            .expect("python3 runs"),
    );
    // Counted by operation since the restart: the finishing part and the completion.
    let (_, metrics) = server.client().stats().unwrap().remove(0);
    for expected in [
        "hydrant_s3_requests_total{operation=\"UploadPart\"} 1",
        "hydrant_s3_requests_total{operation=\"CompleteMultipartUpload\"} 1",
        "hydrant_s3_requests_total{operation=\"ListMultipartUploads\"} 2",
    ] {
        assert!(
            metrics.lines().any(|line| line == expected),
            "{expected}\n{metrics}"
        );
    }
    assert!(server.metric("hydrant_s3_answers_total") >= 6);
    // The default origin (a folder beside the device, write-back) gets the completed objects
    // and nothing of the parts, before or after the restart.
    server
        .client()
        .flush(None, "", Duration::from_secs(120))
        .expect("FLUSH");
    let origin = scratch.path().join("origin");
    let mut files = Vec::new();
    collect_files(&origin, &origin, &mut files);
    files.sort();
    assert_eq!(
        files,
        [
            "s3-multipart/checkpoints/step-100/model.pt",
            "s3-multipart/datasets/shard-000.tar",
            "s3-multipart/pending/across-restart.bin",
        ]
    );
    let model = std::fs::metadata(origin.join("s3-multipart/checkpoints/step-100/model.pt"));
    assert_eq!(model.unwrap().len(), (11 << 20) + 1 + 7);
}

/// Every file under `directory`, as paths relative to `root`.
fn collect_files(root: &Path, directory: &Path, into: &mut Vec<String>) {
    for entry in std::fs::read_dir(directory).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(root, &path, into);
        } else {
            into.push(path.strip_prefix(root).unwrap().display().to_string());
        }
    }
}

/// The AWS CLI, unsigned, against `endpoint`.
fn aws(endpoint: &str, arguments: &[&str]) -> Output {
    Command::new("aws")
        .args([
            "--endpoint-url",
            endpoint,
            "--no-sign-request",
            "--region",
            "us-east-1",
        ])
        .args(arguments)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .expect("aws runs (scripts/test installs awscli)")
}

/// A file of `bytes` pseudo-random bytes made by `seed`.
fn write_generated(path: &Path, seed: u64, bytes: u64) {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut block = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < bytes {
        let length = (bytes - offset).min(block.len() as u64) as usize;
        common::generate(seed, offset, &mut block[..length]);
        file.write_all(&block[..length]).unwrap();
        offset += length as u64;
    }
    file.flush().unwrap();
}

fn same_file(left: &Path, right: &Path) -> bool {
    use std::io::Read;
    let open = |path: &Path| std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let (mut left, mut right) = (open(left), open(right));
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let got = left.read(&mut a).unwrap();
        let mut filled = 0;
        while filled < got {
            let more = right.read(&mut b[filled..got]).unwrap();
            if more == 0 {
                return false;
            }
            filled += more;
        }
        if got == 0 {
            return right.read(&mut b).unwrap() == 0;
        }
        if a[..got] != b[..got] {
            return false;
        }
    }
}

#[test]
fn the_aws_cli_copies_a_gigabyte_in_parts_syncs_lists_and_removes() {
    let scratch = Scratch::new("s3-aws-cli");
    // The device holds the staged parts and the assembled object side by side (on one shard
    // of two).
    let server = start(scratch.path(), 4096);
    let endpoint = server.s3_endpoint();
    let local = scratch.path().join("local");
    std::fs::create_dir_all(local.join("tree/a/b")).unwrap();
    let big = local.join("big.bin");
    write_generated(&big, 7, 1 << 30);
    checked(
        "aws s3 mb",
        aws(&endpoint, &["s3", "mb", "s3://cli-bucket"]),
    );
    // Above the CLI's 8 MiB threshold: uploaded as a multipart upload of 128 parts.
    checked(
        "aws s3 cp (upload)",
        aws(
            &endpoint,
            &[
                "s3",
                "cp",
                "--no-progress",
                big.to_str().unwrap(),
                "s3://cli-bucket/big.bin",
            ],
        ),
    );
    let back = scratch.path().join("back.bin");
    checked(
        "aws s3 cp (download)",
        aws(
            &endpoint,
            &[
                "s3",
                "cp",
                "--no-progress",
                "s3://cli-bucket/big.bin",
                back.to_str().unwrap(),
            ],
        ),
    );
    assert!(same_file(&big, &back), "the gigabyte came back different");
    std::fs::remove_file(&back).unwrap();
    std::fs::remove_file(&big).unwrap();

    // sync: every file once, then only what changed.
    let files = ["tree/one.txt", "tree/a/two.txt", "tree/a/b/three.bin"];
    // Written a minute ago: S3 keeps times to the second, so a file written in the second of its
    // upload looks newer than its object to the CLI (as it does against S3 itself).
    let a_minute_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for (index, name) in files.iter().enumerate() {
        let path = local.join(name);
        write_generated(&path, 100 + index as u64, 1000 * (index as u64 + 1));
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(a_minute_ago)
            .unwrap();
    }
    let tree = local.join("tree");
    let synced = checked(
        "aws s3 sync",
        aws(
            &endpoint,
            &[
                "s3",
                "sync",
                "--no-progress",
                tree.to_str().unwrap(),
                "s3://cli-bucket/tree",
            ],
        ),
    );
    assert_eq!(synced.matches("upload:").count(), 3, "{synced}");
    write_generated(&local.join("tree/a/two.txt"), 999, 1234);
    let again = checked(
        "aws s3 sync (again)",
        aws(
            &endpoint,
            &[
                "s3",
                "sync",
                "--no-progress",
                tree.to_str().unwrap(),
                "s3://cli-bucket/tree",
            ],
        ),
    );
    assert_eq!(again.matches("upload:").count(), 1, "{again}");
    assert!(again.contains("a/two.txt"), "{again}");

    let listed = checked(
        "aws s3 ls --recursive",
        aws(&endpoint, &["s3", "ls", "--recursive", "s3://cli-bucket/"]),
    );
    for expected in [
        "big.bin",
        "tree/one.txt",
        "tree/a/two.txt",
        "tree/a/b/three.bin",
    ] {
        assert!(listed.contains(expected), "{expected} not in\n{listed}");
    }
    assert!(listed.contains(&(1u64 << 30).to_string()), "{listed}");
    let top = checked(
        "aws s3 ls",
        aws(&endpoint, &["s3", "ls", "s3://cli-bucket/"]),
    );
    assert!(top.contains("PRE tree/"), "{top}");

    let down = scratch.path().join("down");
    checked(
        "aws s3 sync (download)",
        aws(
            &endpoint,
            &[
                "s3",
                "sync",
                "--no-progress",
                "s3://cli-bucket/tree",
                down.to_str().unwrap(),
            ],
        ),
    );
    for name in files {
        let relative = name.trim_start_matches("tree/");
        assert!(
            same_file(&local.join(name), &down.join(relative)),
            "{name} came back different"
        );
    }
    // Again: nothing to copy, since the objects' times are their writes' (which the CLI gave
    // the files it wrote), not the time of the listing.
    let nothing = checked(
        "aws s3 sync (download again)",
        aws(
            &endpoint,
            &[
                "s3",
                "sync",
                "--no-progress",
                "s3://cli-bucket/tree",
                down.to_str().unwrap(),
            ],
        ),
    );
    assert_eq!(nothing.matches("download:").count(), 0, "{nothing}");

    let removed = checked(
        "aws s3 rm --recursive",
        aws(&endpoint, &["s3", "rm", "--recursive", "s3://cli-bucket/"]),
    );
    assert_eq!(removed.matches("delete:").count(), 4, "{removed}");
    let empty = aws(&endpoint, &["s3", "ls", "--recursive", "s3://cli-bucket/"]);
    assert!(
        String::from_utf8_lossy(&empty.stdout).trim().is_empty(),
        "{}",
        String::from_utf8_lossy(&empty.stdout)
    );
    checked(
        "aws s3 rb",
        aws(&endpoint, &["s3", "rb", "s3://cli-bucket"]),
    );
}

/// docs/s3.md: UploadPartCopy. The AWS CLI copies an object above its multipart threshold
/// (8 MiB) from bucket to bucket within the endpoint as a multipart upload whose parts are
/// copied from ranges of the source; the copy is byte-exact and the source untouched.
#[test]
fn the_aws_cli_copies_between_buckets_with_parts_copied_from_the_source() {
    let scratch = Scratch::new("s3-part-copy");
    let server = start(scratch.path(), 512);
    let endpoint = server.s3_endpoint();
    let original = scratch.path().join("original.bin");
    write_generated(&original, 77, 40 << 20);
    let checked = |what: &str, output: Output| {
        assert!(
            output.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let source = original.to_str().unwrap();
    checked(
        "cp up",
        aws(&endpoint, &["s3", "cp", source, "s3://copy-from/big.bin"]),
    );
    let requests_before = server.metric("hydrant_s3_requests_total");
    checked(
        "cp bucket to bucket",
        aws(
            &endpoint,
            &["s3", "cp", "s3://copy-from/big.bin", "s3://copy-to/big.bin"],
        ),
    );
    let text = server.client().stats().unwrap().remove(0).1;
    let copied_parts: u64 = text
        .lines()
        .filter(|line| line.contains("operation=\"UploadPartCopy\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64;
    assert!(
        copied_parts >= 5,
        "the CLI copied parts (40 MiB in 8 MiB parts): {copied_parts}"
    );
    assert!(server.metric("hydrant_s3_requests_total") > requests_before);
    for (what, url) in [
        ("copy", "s3://copy-to/big.bin"),
        ("source", "s3://copy-from/big.bin"),
    ] {
        let back = scratch.path().join(format!("{what}.bin"));
        checked(
            what,
            aws(&endpoint, &["s3", "cp", url, back.to_str().unwrap()]),
        );
        assert!(same_file(&original, &back), "the {what} is byte-exact");
    }
}
