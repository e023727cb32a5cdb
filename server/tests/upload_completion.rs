//! Multipart write-back against an S3 origin (moto's) that is slow, throttles, loses answers, or
//! whose uploader is killed midway, through hydrant's fault proxy, which counts the requests:
//! every part goes up once, a completion that takes longer than a read may is waited for, one
//! whose answer was lost is recognised at the origin rather than uploaded again, SlowDown pauses
//! rather than fails, and an upload cut by SIGKILL goes on from its parts after the restart.

mod common;

use std::time::Duration;

use common::{object_bytes, S3Server, Scratch, ServerProcess};
use hydrant_fault_proxy::{ConfigUpdate, DelayRange, Method, ProxyHandle};

const PART_BYTES: usize = 16 << 20;

/// The proxy in front of `s3`, with `settings` (a control query) in force.
fn proxy(s3: &S3Server, settings: &str) -> ProxyHandle {
    let mut config = hydrant_fault_proxy::Config::new(s3.address());
    config.settings.delay = DelayRange::NONE;
    let proxy = hydrant_fault_proxy::start(config).unwrap();
    proxy
        .set_config(ConfigUpdate::from_query(settings).unwrap())
        .unwrap();
    proxy
}

/// hydrant-server with one shard, bucket `data` written back to `s3://bucket`, reached through
/// `proxy`, on a data file of 512 MiB.
fn server(
    scratch: &Scratch,
    s3: &S3Server,
    proxy: &ProxyHandle,
    bucket: &str,
    extra: &[&str],
) -> ServerProcess {
    server_sized(scratch, s3, proxy, bucket, extra, 512)
}

fn server_sized(
    scratch: &Scratch,
    s3: &S3Server,
    proxy: &ProxyHandle,
    bucket: &str,
    extra: &[&str],
    data_mib: u64,
) -> ServerProcess {
    let mut env = s3.env();
    for (name, value) in &mut env {
        if *name == "AWS_ENDPOINT" {
            *value = format!("http://{}", proxy.addr());
        }
    }
    let origin = format!("data=s3://{bucket},write=back");
    let mut args = vec!["--origin", "none", "--bucket", &origin];
    args.extend_from_slice(extra);
    ServerProcess::start_shards(scratch.path(), 1, data_mib, &args, &env)
}

/// Write `data` as `data/big`, FLUSH it, and check the origin holds it byte-exact.
fn write_back(server: &ServerProcess, s3: &S3Server, bucket: &str, data: &[u8]) {
    let mut client = server.client();
    assert!(client.put("data", "big", data).unwrap().dirty);
    client
        .flush(Some("data"), "", Duration::from_secs(120))
        .unwrap_or_else(|error| panic!("FLUSH: {error}"));
    assert_eq!(s3.crc(bucket, "big"), crc32c::crc32c(data));
}

#[test]
fn a_completion_slower_than_a_read_may_take_is_waited_for_not_started_over() {
    let s3 = S3Server::start();
    s3.create_bucket("slow-completion");
    // Every origin request takes 1.5 s; reads may take 1 s.
    let proxy = proxy(&s3, "delay_ms=1500");
    let scratch = Scratch::new("upload-slow");
    let server = server(
        &scratch,
        &s3,
        &proxy,
        "slow-completion",
        &["--origin-timeout", "1s"],
    );
    let data = object_bytes(7, 2 * PART_BYTES + 12_345);
    write_back(&server, &s3, "slow-completion", &data);
    let stats = proxy.stats();
    assert_eq!(
        stats.method(Method::Put).requests,
        3,
        "each part once: {}",
        stats.to_json()
    );
    assert_eq!(
        stats.method(Method::Post).requests,
        2,
        "one start, one completion: {}",
        stats.to_json()
    );
    assert_eq!(server.metric("hydrant_origin_upload_retries_total"), 0);
    s3.create_bucket("slow-completion");
}

#[test]
fn a_completion_whose_answer_is_lost_is_found_at_the_origin_not_uploaded_again() {
    let s3 = S3Server::start();
    s3.create_bucket("lost-completion");
    // Every completion reaches the origin, which assembles the object, but its answer is cut.
    let proxy = proxy(
        &s3,
        "fault_rate=1&faults=reset-mid-body&fault_match=POST%20/lost-completion/big?uploadId=",
    );
    let scratch = Scratch::new("upload-lost");
    let server = server(&scratch, &s3, &proxy, "lost-completion", &[]);
    let data = object_bytes(8, 3 * PART_BYTES + 1);
    write_back(&server, &s3, "lost-completion", &data);
    let stats = proxy.stats();
    assert!(stats.faults.reset_mid_body > 0, "{}", stats.to_json());
    assert_eq!(
        stats.method(Method::Put).requests,
        4,
        "each part once: {}",
        stats.to_json()
    );
    // The object is clean: the server recorded it as at the origin.
    assert!(!server.client().head("data", "big").unwrap().dirty);
    s3.create_bucket("lost-completion");
}

#[test]
fn slow_down_answers_pause_the_upload_without_failing_it_or_sending_a_part_twice() {
    /// 503s the proxy answers. A part's request is tried three times (the store's own two
    /// retries) before the uploader sees a SlowDown, and the four parts may each have had up to
    /// two 503s when they pass, so the uploader sees between (21 - 8) / 3 = 5 and 21 / 3 = 7
    /// SlowDowns: fewer than the ten in a row after which an attempt gives up, so the attempt
    /// must wait them all out, and enough that their pauses (1.6 s after the fifth) outlast the
    /// first flush.
    const SLOW_DOWNS: u64 = 21;
    let s3 = S3Server::start();
    s3.create_bucket("slow-down");
    // The parts' first requests are answered 503 SlowDown by the proxy (not forwarded), exactly
    // SLOW_DOWNS times whatever the timing; the rest are forwarded.
    let proxy = proxy(
        &s3,
        &format!(
            "fault_rate=1&faults=503&fault_match=PUT%20/slow-down/big?&fault_limit={SLOW_DOWNS}"
        ),
    );
    let scratch = Scratch::new("upload-slow-down");
    let server = server(&scratch, &s3, &proxy, "slow-down", &[]);
    let data = object_bytes(9, 3 * PART_BYTES + 1);
    let mut client = server.client();
    assert!(client.put("data", "big", &data).unwrap().dirty);
    common::eventually("SlowDown answers reach the uploader", || {
        server.metric("hydrant_origin_slow_downs_total") >= 2
    });
    let error = client
        .flush(Some("data"), "", Duration::from_millis(500))
        .unwrap_err();
    assert!(error.to_string().contains("on their way"), "{error}");
    assert!(s3.list("slow-down").is_empty());
    client
        .flush(Some("data"), "", Duration::from_secs(120))
        .unwrap();
    assert_eq!(s3.crc("slow-down", "big"), crc32c::crc32c(&data));
    let stats = proxy.stats();
    assert_eq!(
        (
            stats.method(Method::Put).faulted,
            stats.method(Method::Put).forwarded
        ),
        (SLOW_DOWNS, 4),
        "each part reached the origin once: {}",
        stats.to_json()
    );
    let seen = server.metric("hydrant_origin_slow_downs_total");
    assert!((5..=7).contains(&seen), "{seen} SlowDowns seen");
    assert_eq!(
        server.metric("hydrant_origin_upload_retries_total"),
        0,
        "the attempt waited out the SlowDowns instead of failing"
    );
    s3.create_bucket("slow-down");
}

#[test]
fn an_upload_cut_by_sigkill_goes_on_from_its_parts_after_the_restart() {
    const PARTS: usize = 64;
    const IN_FLIGHT: usize = 2;
    let s3 = S3Server::start();
    s3.create_bucket("resume");
    // Slow enough that the kill comes midway; two parts in flight at a time.
    let proxy = proxy(&s3, "bandwidth=48MiB");
    let scratch = Scratch::new("upload-resume");
    let budget = format!("{}MiB", (IN_FLIGHT * PART_BYTES) >> 20);
    let extra = ["--upload-bytes-in-flight", budget.as_str()];
    let data = object_bytes(10, PARTS * PART_BYTES);
    let mut server = server_sized(&scratch, &s3, &proxy, "resume", &extra, 2048);
    assert!(server.client().put("data", "big", &data).unwrap().dirty);
    common::eventually("half the parts at the origin", || {
        proxy.stats().method(Method::Put).forwarded >= PARTS as u64 / 2
    });
    server.kill();
    let before = proxy.stats().method(Method::Put).requests;
    proxy
        .set_config(ConfigUpdate::from_query("bandwidth=0").unwrap())
        .unwrap();
    let server = server_sized(&scratch, &s3, &proxy, "resume", &extra, 2048);
    server
        .client()
        .flush(Some("data"), "", Duration::from_secs(300))
        .unwrap();
    assert_eq!(s3.crc("resume", "big"), crc32c::crc32c(&data));
    let stats = proxy.stats();
    let total = stats.method(Method::Put).requests as usize;
    assert!(
        total <= PARTS + IN_FLIGHT,
        "{before} parts sent before the kill, {total} in all: only those in flight at the kill may go twice ({})",
        stats.to_json()
    );
    assert_eq!(
        stats.method(Method::Post).requests,
        2,
        "one start, one completion"
    );
    s3.create_bucket("resume");
}

/// Parts whose reads wait in the shard's line for device room (one chunk read in flight at a
/// time here), with a record written after each acknowledged part: the upload never stops
/// polling its parts to wait for a record, which would hold the line behind a woken but
/// unpolled read (the upload once stalled so, for good, in CI).
#[test]
fn parts_waiting_for_device_room_never_stall_the_upload_on_its_record() {
    let s3 = S3Server::start();
    s3.create_bucket("room-line");
    let proxy = proxy(&s3, "");
    let scratch = Scratch::new("upload-room-line");
    let server = server_sized(
        &scratch,
        &s3,
        &proxy,
        "room-line",
        &["--io-bytes-in-flight", "4KiB"],
        1024,
    );
    let data = object_bytes(41, 24 * PART_BYTES + 12345);
    for round in 0..3 {
        let mut client = server.client();
        let key = format!("big-{round}");
        assert!(client.put("data", &key, &data).unwrap().dirty);
        client
            .flush(Some("data"), "", Duration::from_secs(120))
            .unwrap_or_else(|error| panic!("round {round}: FLUSH: {error}"));
        assert_eq!(
            s3.crc("room-line", &key),
            crc32c::crc32c(&data),
            "round {round}"
        );
    }
}
