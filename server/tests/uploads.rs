//! Writes the origin can never take, through the real server process on a folder origin (where
//! `x` and `x/y` cannot both exist): refused up front when the folder shows it, and otherwise
//! refused by the uploader for good: kept on NVMe, named by FLUSH, STATS and `uploads`, no
//! longer holding the dirty budget that other writers wait on, retried when asked.

mod common;

use std::time::{Duration, Instant};

use common::{object_bytes, Generated, Scratch, ServerProcess};
use hydrant_client::ClientError;
use hydrant_proto::Status;

fn status(error: &ClientError) -> Option<Status> {
    match error {
        ClientError::Status { status, .. } => Status::from_byte(*status).ok(),
        _ => None,
    }
}

#[test]
fn a_write_the_folder_origin_cannot_hold_is_refused_up_front() {
    let scratch = Scratch::new("uploads-upfront");
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let mut client = server.client();
    client.put("data", "x", b"a file").unwrap();
    client
        .flush(Some("data"), "", Duration::from_secs(30))
        .unwrap();
    let error = client.put("data", "x/y", b"under a file").unwrap_err();
    assert_eq!(status(&error), Some(Status::OriginRefused), "{error}");
    assert!(client.get("data", "x/y", None).unwrap_err().is_not_found());
    client
        .flush(Some("data"), "", Duration::from_secs(30))
        .unwrap();
}

#[test]
fn an_upload_the_origin_refuses_is_kept_named_and_stops_holding_the_budget() {
    let scratch = Scratch::new("uploads-refused");
    let args = ["--dirty-bytes-max", "16MiB"];
    let mut server = ServerProcess::start(scratch.path(), 768, &args, &[]);
    let mut client = server.client();
    // Both dirty before either is uploaded (sent together): the folder cannot show the
    // conflict yet, and one of the two uploads must fail whatever their order.
    let file = object_bytes(1, 3 << 20);
    let under = object_bytes(2, 3 << 20);
    // When one upload wins the race, the other is refused up front instead: try a new pair.
    let (parent, child) = (0..20)
        .map(|attempt| {
            (
                format!("conflict{attempt}"),
                format!("conflict{attempt}/child"),
            )
        })
        .find(|(parent, child)| {
            let mut pipeline = client.pipeline();
            pipeline.put("data", parent, &file);
            pipeline.put("data", child, &under);
            pipeline.run().unwrap().iter().all(Result::is_ok)
        })
        .expect("a pair stored before either was uploaded");
    let started = Instant::now();
    let error = client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(status(&error), Some(Status::OriginRefused), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "FLUSH answered the refusal instead of waiting for its deadline"
    );
    assert!(
        error.to_string().contains(&format!("data/{parent}")),
        "{error}"
    );
    let (refused, total) = client.uploads(Some("data"), "", false, 100).unwrap();
    assert_eq!(total, 1, "{refused:?}");
    let refused_key = refused[0].key.clone();
    assert!(
        refused_key == parent || refused_key == child,
        "{refused_key}"
    );
    assert_eq!(server.metric("hydrant_uploads_refused"), 1);
    assert_eq!(server.metric("hydrant_uploads_refused_bytes"), 3 << 20);
    assert_eq!(
        server.metric("hydrant_dirty_bytes"),
        0,
        "the budget is free again"
    );
    // Other writers are not held up: 40 MiB of write-back PUTs through a 16 MiB budget.
    let started = Instant::now();
    for index in 0..10 {
        client
            .put(
                "data",
                &format!("other/{index}"),
                &object_bytes(10 + index, 4 << 20),
            )
            .unwrap();
    }
    client
        .flush(Some("data"), "other/", Duration::from_secs(60))
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    // The refused version stays readable here, and after a restart it is still refused (tried
    // once more) and still kept.
    let expected = if refused_key == parent { &file } else { &under };
    assert!(&client.get("data", &refused_key, None).unwrap().1 == expected);
    server.kill();
    let server = ServerProcess::start(scratch.path(), 768, &args, &[]);
    let mut client = server.client();
    assert!(&client.get("data", &refused_key, None).unwrap().1 == expected);
    let error = client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(status(&error), Some(Status::OriginRefused), "{error}");
    // Retried after the conflict is gone: it reaches the origin.
    let other = if refused_key == parent {
        &child
    } else {
        &parent
    };
    client.delete("data", other).unwrap();
    let (_, queued) = client.uploads(Some("data"), "", true, 100).unwrap();
    assert_eq!(queued, 1);
    client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap();
    let at_origin = std::fs::read(scratch.path().join("origin/data").join(&refused_key)).unwrap();
    assert!(&at_origin == expected);
    assert_eq!(client.uploads(None, "", false, 100).unwrap().1, 0);
}

#[test]
fn a_flood_of_refused_writes_ends_in_a_clear_refusal() {
    let scratch = Scratch::new("uploads-flood");
    let server = ServerProcess::start(scratch.path(), 768, &["--dirty-bytes-max", "8MiB"], &[]);
    let mut client = server.client();
    let mut refused_put = None;
    'pairs: for index in 0..60 {
        // Sent together, so that both are stored before either is uploaded and one of the two
        // uploads is refused (or, when the race goes the other way, refused up front).
        let data = object_bytes(index, 1 << 20);
        let (parent, child) = (format!("d{index}"), format!("d{index}/child"));
        let mut pipeline = client.pipeline();
        pipeline.put("data", &parent, &data);
        pipeline.put("data", &child, &data);
        for result in pipeline.run().unwrap() {
            match result {
                Err(error) if error.to_string().contains("held on NVMe") => {
                    refused_put = Some(error);
                    break 'pairs;
                }
                Err(error) => assert_eq!(status(&error), Some(Status::OriginRefused), "{error}"),
                Ok(_) => {}
            }
        }
        // Let the pair's uploads run.
        let _ = client.flush(Some("data"), &parent, Duration::from_secs(30));
    }
    let error = refused_put.expect("PUTs are refused once refused writes fill their bound");
    assert_eq!(status(&error), Some(Status::OriginRefused), "{error}");
    // Nothing was lost: every refused write is listed and readable.
    let (refused, total) = client.uploads(None, "", false, 1000).unwrap();
    assert!(total >= 8, "{total}");
    for upload in refused {
        client.get(&upload.bucket, &upload.key, None).unwrap();
    }
}

#[test]
fn an_s3_origin_that_refuses_an_upload_does_not_stall_flush() {
    let s3 = common::S3Server::start();
    s3.create_bucket("uploads-present");
    let scratch = Scratch::new("uploads-s3");
    // One bucket whose origin bucket does not exist (S3 answers 404 NoSuchBucket to every
    // upload), one that works.
    let server = ServerProcess::start(
        scratch.path(),
        512,
        &[
            "--bucket",
            "gone=s3://uploads-no-such-bucket",
            "--bucket",
            "data=s3://uploads-present",
        ],
        &s3.env(),
    );
    let mut client = server.client();
    client.put("gone", "a", b"nowhere to go").unwrap();
    client.put("data", "b", b"somewhere").unwrap();
    let started = Instant::now();
    let error = client.flush(None, "", Duration::from_secs(60)).unwrap_err();
    assert_eq!(status(&error), Some(Status::OriginRefused), "{error}");
    assert!(error.to_string().contains("gone/a"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(30));
    client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap();
    assert_eq!(s3.list("uploads-present"), ["b"]);
    assert_eq!(client.get("gone", "a", None).unwrap().1, b"nowhere to go");
}

#[test]
fn a_write_back_killed_mid_upload_leaves_no_staged_file_at_a_folder_origin() {
    const LEN: u64 = 512 << 20;
    let scratch = Scratch::new("uploads-killed");
    let origin = scratch.path().join("origin/data");
    let staged = origin.join("model.pt#1");
    let mut server = ServerProcess::start_shards(scratch.path(), 1, 1536, &[], &[]);
    let mut source = std::io::BufReader::with_capacity(1 << 20, Generated::new(5, LEN));
    server
        .client()
        .put_from("data", "model.pt", &mut source, LEN, None)
        .unwrap();
    // The folder origin writes the object to a staged file and renames it when it is whole:
    // killed while that file grows, the upload leaves it behind.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !staged.exists() {
        assert!(Instant::now() < deadline, "the upload never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    server.kill();
    assert!(
        staged.exists() && !origin.join("model.pt").exists(),
        "the kill came while the upload was staged"
    );
    // After the restart the dirty object is uploaded again, and what the killed upload left
    // is gone: the folder holds the object, whole, and nothing else.
    let server = ServerProcess::start_shards(scratch.path(), 1, 1536, &[], &[]);
    server
        .client()
        .flush(Some("data"), "", Duration::from_secs(120))
        .unwrap();
    let names: Vec<String> = std::fs::read_dir(&origin)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["model.pt"]);
    let mut file = std::fs::File::open(origin.join("model.pt")).unwrap();
    let mut checked = common::Checked::new(5, 0);
    assert_eq!(std::io::copy(&mut file, &mut checked).unwrap(), LEN);
    assert_eq!(checked.mismatch, None);
}

/// The page cache's view of a file (Linux's `cachestat`, 6.5 and later): pages cached, dirty
/// (written, not yet on the disk) and under writeback.
fn cached_pages(path: &std::path::Path) -> (u64, u64, u64) {
    #[repr(C)]
    struct Range {
        offset: u64,
        length: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let range = Range {
        offset: 0,
        length: 0, // to the end
    };
    let mut stat = Stat::default();
    // SAFETY: both pointers are to live values of the layouts the system call defines.
    let result = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    assert_eq!(result, 0, "cachestat: {}", std::io::Error::last_os_error());
    (stat.cache, stat.dirty, stat.writeback)
}

#[test]
fn a_folder_origin_holds_its_objects_on_disk_when_flush_returns() {
    let scratch = Scratch::new("uploads-synced");
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let mut client = server.client();
    // One below the multipart threshold (one write), one above it (written in parts).
    let small = object_bytes(7, 1 << 20);
    let large = object_bytes(8, 24 << 20);
    client.put("data", "small.bin", &small).unwrap();
    client.put("data", "large.bin", &large).unwrap();
    client
        .flush(Some("data"), "", Duration::from_secs(60))
        .unwrap();
    // A version counts as uploaded (and may then leave NVMe) only once the folder has it
    // through a power loss: no page of it is still waiting in the page cache.
    for (name, bytes) in [("small.bin", &small), ("large.bin", &large)] {
        let path = scratch.path().join("origin/data").join(name);
        let (cached, dirty, writeback) = cached_pages(&path);
        eprintln!("{name}: {cached} pages cached, {dirty} dirty, {writeback} under writeback");
        assert_eq!((dirty, writeback), (0, 0), "{name} is not on the disk yet");
        assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    }
}
