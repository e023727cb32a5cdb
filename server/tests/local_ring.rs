//! Same-host read rings against the real `hydrant-server` process: many reads in flight on one
//! connection land byte-exact (on each shard's ring, and across shards), a full ring and a
//! client that stops consuming completions hold the server to the ring's size, malformed
//! entries are answered with an error and touch nothing else, and a client killed with reads in
//! flight leaves its ring and region freed and the server serving.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{eventually, object_bytes, Scratch, ServerProcess};
use hydrant_client::local::{wait_rings, LocalClient, LocalGet, LocalRing, RingDone};
use hydrant_client::ClientError;
use hydrant_proto::local_ring::{RingSubmission, LOCAL_RING_SQE_BYTES};
use hydrant_proto::Status;

const SLOT_BYTES: u64 = 1 << 20;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

fn socket_of(scratch: &Scratch) -> PathBuf {
    scratch.path().join("local.sock")
}

fn start(scratch: &Scratch, shards: usize, extra: &[&str]) -> ServerProcess {
    let socket = socket_of(scratch);
    let mut flags = vec![
        "--origin",
        "none",
        "--local-socket",
        socket.to_str().unwrap(),
    ];
    flags.extend_from_slice(extra);
    ServerProcess::start_shards(scratch.path(), shards, 768, &flags, &[])
}

fn get(slot: u64, key: &str) -> LocalGet {
    LocalGet {
        offset: slot * SLOT_BYTES,
        length: SLOT_BYTES,
        bucket: "b".into(),
        key: key.into(),
        range: None,
    }
}

fn status_of(done: &RingDone) -> u8 {
    match &done.result {
        Err(ClientError::Status { status, .. }) => *status,
        other => panic!("expected a status, got {other:?}"),
    }
}

/// Objects of sizes around the block and checksum-piece boundaries, stored over TCP.
fn store_objects(server: &ServerProcess, count: u64) -> HashMap<String, Vec<u8>> {
    let mut tcp = server.client();
    (0..count)
        .map(|index| {
            let length = match index % 4 {
                0 => 4096,
                1 => 65_536 + 1,
                2 => 300_000 + index as usize,
                _ => SLOT_BYTES as usize - 4096,
            };
            let key = format!("object-{index:03}");
            let bytes = object_bytes(index, length);
            tcp.put("b", &key, &bytes).unwrap();
            (key, bytes)
        })
        .collect()
}

#[test]
fn many_reads_in_flight_land_byte_exact_on_every_shard() {
    let scratch = Scratch::new("ring-exact");
    let server = start(&scratch, 2, &[]);
    let objects = store_objects(&server, 96);
    let mut keys: Vec<&String> = objects.keys().collect();
    keys.sort();
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let region = client.allocate(64 * SLOT_BYTES).unwrap();
    // One ring per shard, each key on its owner's ring, and one ring that is given every key
    // (those of the other shard are read there).
    let mut rings: Vec<LocalRing> = (0..2)
        .map(|shard| client.open_ring(&region, 16, Some(shard)).unwrap())
        .collect();
    assert_eq!(rings[0].shards(), 2);
    assert_eq!(server.metric("hydrant_local_rings"), 2);
    // Three passes over every key, the slots reused as completions free them.
    let mut next = 0usize;
    let total = keys.len() * 3;
    let mut free_slots: Vec<u64> = (0..64).collect();
    let mut key_of_slot: HashMap<u64, String> = HashMap::new();
    let mut checked = 0usize;
    let mut done = Vec::new();
    let mut deepest = 0u32;
    while checked < total {
        while next < total && !free_slots.is_empty() {
            let key = keys[next % keys.len()];
            let shard = rings[0].shard_for("b", key) as usize;
            let ring = &mut rings[if next.is_multiple_of(5) { 0 } else { shard }];
            if ring.room() == 0 {
                break;
            }
            let slot = free_slots.pop().unwrap();
            ring.push(&get(slot, key), slot).unwrap();
            key_of_slot.insert(slot, key.clone());
            next += 1;
        }
        deepest = deepest.max(rings.iter().map(LocalRing::in_flight).sum());
        done.clear();
        wait_rings(&mut rings, 1, &mut done, WAIT).unwrap();
        for completion in &done {
            let slot = completion.user_data;
            let key = key_of_slot.remove(&slot).unwrap();
            let info = completion.result.as_ref().unwrap();
            let expected = &objects[&key];
            assert_eq!(info.written, expected.len() as u64, "{key}");
            assert_eq!(info.object_bytes, expected.len() as u64);
            let start = (slot * SLOT_BYTES) as usize;
            assert!(
                region.as_slice()[start..start + expected.len()] == expected[..],
                "{key} in slot {slot}"
            );
            free_slots.push(slot);
            checked += 1;
        }
    }
    assert!(
        deepest >= 8,
        "reads were in flight together ({deepest} at most)"
    );
    // A range at an odd place, and a missing key, through the same ring.
    let ring = &mut rings[1];
    let key = keys[3];
    let mut ranged = get(0, key);
    ranged.offset = 7;
    ranged.range = Some((1000, Some(70_000)));
    ring.push(&ranged, 1).unwrap();
    ring.push(&get(2, "missing"), 2).unwrap();
    done.clear();
    ring.wait(2, &mut done, WAIT).unwrap();
    done.sort_by_key(|completion| completion.user_data);
    assert_eq!(done[0].result.as_ref().unwrap().written, 69_000);
    assert_eq!(
        &region.as_slice()[7..7 + 69_000],
        &objects[key][1000..70_000]
    );
    assert_eq!(status_of(&done[1]), Status::NotFound as u8);
    drop(rings);
    client.free(region).unwrap();
    assert_eq!(server.metric("hydrant_local_rings"), 0);
    assert_eq!(server.metric("hydrant_local_regions"), 0);
}

#[test]
fn a_full_ring_and_unconsumed_completions_bound_what_the_server_takes() {
    let scratch = Scratch::new("ring-bound");
    let server = start(&scratch, 1, &[]);
    let objects = store_objects(&server, 8);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let region = client.allocate(16 * SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 4, None).unwrap();
    for slot in 0..4 {
        ring.push(&get(slot, "object-001"), slot).unwrap();
    }
    let refused = ring.push(&get(5, "object-001"), 5).unwrap_err();
    assert!(matches!(refused, ClientError::Usage(_)), "{refused}");
    ring.submit();
    // Nothing consumed: the server completes the four and takes nothing more, even when the
    // client claims a hundred more entries in its submission counter.
    eventually("four completions", || {
        server.metric("hydrant_local_ring_reads_in_flight") == 0 && ring.taken_by_server() == 4
    });
    ring.publish_raw_tail(104);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ring.taken_by_server(),
        4,
        "no room for completions: nothing taken"
    );
    ring.publish_raw_tail(4);
    let mut done = Vec::new();
    ring.wait(4, &mut done, WAIT).unwrap();
    assert_eq!(done.len(), 4);
    for completion in &done {
        let written = completion.result.as_ref().unwrap().written as usize;
        let start = (completion.user_data * SLOT_BYTES) as usize;
        assert_eq!(
            &region.as_slice()[start..start + written],
            &objects["object-001"][..]
        );
    }
    // Bounds the ring's opening checks.
    for entries in [0, 3, 2048] {
        let refused = client.open_ring(&region, entries, None).err().unwrap();
        assert!(
            matches!(&refused, ClientError::Status { status, .. } if *status == Status::BadRequest as u8),
            "{entries}: {refused}"
        );
    }
    let refused = client.open_ring(&region, 4, Some(1)).err().unwrap();
    assert!(
        refused.to_string().contains("shard 1 of a server of 1"),
        "{refused}"
    );
}

#[test]
fn malformed_entries_are_answered_and_harm_nothing_else() {
    let scratch = Scratch::new("ring-malformed");
    let server = start(&scratch, 2, &[]);
    let objects = store_objects(&server, 4);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let region = client.allocate(4 * SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 16, None).unwrap();
    let good = |user_data: u64, offset: u64, length: u64| {
        let mut slot = [0u8; LOCAL_RING_SQE_BYTES];
        RingSubmission {
            user_data,
            offset,
            length,
            range_start: 0,
            range_end: u64::MAX,
            bucket: "b".into(),
            key: "object-002".into(),
        }
        .encode_into(&mut slot)
        .unwrap();
        slot
    };
    let mut cases: Vec<(u64, [u8; LOCAL_RING_SQE_BYTES], Status)> = Vec::new();
    // Outside the region, and a place whose end overflows.
    cases.push((1, good(1, 4 * SLOT_BYTES - 10, 4096), Status::InvalidRange));
    cases.push((2, good(2, u64::MAX - 5, 4096), Status::InvalidRange));
    // A key length past the slot's bound, a bucket of 0 bytes, names that are not UTF-8.
    let mut long = good(3, 0, 4096);
    long[42..44].copy_from_slice(&60_000u16.to_le_bytes());
    cases.push((3, long, Status::InvalidKey));
    let mut empty = good(4, 0, 4096);
    empty[40..42].copy_from_slice(&0u16.to_le_bytes());
    cases.push((4, empty, Status::InvalidKey));
    let mut not_utf8 = good(5, 0, 4096);
    not_utf8[48] = 0xff;
    cases.push((5, not_utf8, Status::InvalidKey));
    // Reserved bytes set; a name that escapes its bucket.
    let mut reserved = good(6, 0, 4096);
    reserved[46] = 9;
    cases.push((6, reserved, Status::BadRequest));
    let mut escaping = [0u8; LOCAL_RING_SQE_BYTES];
    RingSubmission {
        user_data: 7,
        offset: 0,
        length: 4096,
        range_start: 0,
        range_end: u64::MAX,
        bucket: "..".into(),
        key: "../etc/passwd".into(),
    }
    .encode_into(&mut escaping)
    .unwrap();
    cases.push((7, escaping, Status::InvalidKey));
    for (_, slot, _) in &cases {
        ring.push_raw(slot).unwrap();
    }
    // And one good read among them, which lands.
    ring.push_raw(&good(100, SLOT_BYTES, SLOT_BYTES)).unwrap();
    let mut done = Vec::new();
    ring.wait(cases.len() + 1, &mut done, WAIT).unwrap();
    let by_user: HashMap<u64, &RingDone> = done.iter().map(|d| (d.user_data, d)).collect();
    for (user_data, _, status) in &cases {
        assert_eq!(
            status_of(by_user[user_data]),
            *status as u8,
            "case {user_data}: {:?}",
            by_user[user_data].result
        );
    }
    let written = by_user[&100].result.as_ref().unwrap().written as usize;
    let start = SLOT_BYTES as usize;
    assert_eq!(
        &region.as_slice()[start..start + written],
        &objects["object-002"][..]
    );
    assert!(
        region.as_slice()[..SLOT_BYTES as usize]
            .iter()
            .all(|&byte| byte == 0),
        "nothing was written for the refused entries"
    );
    // The server goes on serving the same ring, and everyone else.
    ring.push(&get(0, "object-000"), 8).unwrap();
    done.clear();
    ring.wait(1, &mut done, WAIT).unwrap();
    assert_eq!(done[0].result.as_ref().unwrap().written, 4096);
    assert_eq!(
        server.client().get("b", "object-003", None).unwrap().1,
        objects["object-003"]
    );
}

/// Run by `a_client_killed_with_reads_in_flight_frees_its_ring`: keeps its ring full.
#[test]
fn child_ring_reader_for_the_kill_test() {
    let Ok(socket) = std::env::var("HYDRANT_RING_CHILD_SOCKET") else {
        return; // only meaningful as the child process
    };
    let mut client = LocalClient::connect(&socket).unwrap();
    let region = client.allocate(32 * SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 32, None).unwrap();
    println!("opened");
    let mut done = Vec::new();
    let mut next = 0u64;
    loop {
        while ring.room() > 0 {
            ring.push(&get(next % 32, "object-003"), next).unwrap();
            next += 1;
        }
        done.clear();
        ring.wait(1, &mut done, WAIT).unwrap();
    }
}

#[test]
fn a_client_killed_with_reads_in_flight_frees_its_ring() {
    let scratch = Scratch::new("ring-kill");
    let server = start(&scratch, 2, &["--dram-bytes", "0"]);
    let objects = store_objects(&server, 4);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_ring_reader_for_the_kill_test",
            "--nocapture",
        ])
        .env("HYDRANT_RING_CHILD_SOCKET", socket_of(&scratch))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("opened") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the child died");
    }
    assert_eq!(server.metric("hydrant_local_rings"), 1);
    eventually("reads in flight", || {
        server.metric("hydrant_local_ring_reads_in_flight") > 0
    });
    child.kill().unwrap();
    child.wait().unwrap();
    // The connection's teardown lowers these gauges one after another (its rings, then its
    // regions, then the connection itself): each must reach zero, none is read at an instant
    // between two of them.
    eventually(
        "the dead client's ring, reads, region and connection freed",
        || {
            server.metric("hydrant_local_rings") == 0
                && server.metric("hydrant_local_ring_reads_in_flight") == 0
                && server.metric("hydrant_local_regions") == 0
                && server.metric("hydrant_local_connections") == 0
        },
    );
    // The server serves the next client, ring and all.
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let region = client.allocate(SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 2, None).unwrap();
    ring.push(&get(0, "object-003"), 0).unwrap();
    let mut done = Vec::new();
    ring.wait(1, &mut done, WAIT).unwrap();
    let written = done[0].result.as_ref().unwrap().written as usize;
    assert_eq!(&region.as_slice()[..written], &objects["object-003"][..]);
}

/// A server of one shard whose bucket `slow` reads through from an origin (moto's S3 server)
/// behind the fault proxy, with `slow/cold` (100,000 bytes) there and `b/object-000` and
/// `b/object-001` stored; the proxy then takes `delay_ms` per request.
struct SlowOrigin {
    _s3: common::Store,
    _proxy: hydrant_fault_proxy::ProxyHandle,
    scratch: Scratch,
    server: ServerProcess,
    cold: Vec<u8>,
    objects: HashMap<String, Vec<u8>>,
}

fn slow_origin(name: &str, delay_ms: u64) -> SlowOrigin {
    let s3 = common::Store::start();
    let bucket = format!("ring-{name}");
    s3.create_bucket(&bucket);
    let cold = object_bytes(9, 100_000);
    s3.put(&bucket, "cold", &cold);
    let mut config = hydrant_fault_proxy::Config::new(s3.address());
    config.settings.delay = hydrant_fault_proxy::DelayRange::NONE;
    let proxy = hydrant_fault_proxy::start(config).unwrap();
    let scratch = Scratch::new(&bucket);
    let route = format!("slow={}", s3.url(&bucket));
    let server = ServerProcess::start_shards(
        scratch.path(),
        1,
        768,
        &[
            "--origin",
            "none",
            "--local-socket",
            socket_of(&scratch).to_str().unwrap(),
            "--bucket",
            &route,
        ],
        &s3.env_via(&proxy.addr().to_string()),
    );
    let objects = store_objects(&server, 2);
    let delay = format!("delay_ms={delay_ms}-{delay_ms}");
    proxy
        .set_config(hydrant_fault_proxy::ConfigUpdate::from_query(&delay).unwrap())
        .unwrap();
    SlowOrigin {
        _s3: s3,
        _proxy: proxy,
        scratch,
        server,
        cold,
        objects,
    }
}

#[test]
fn a_slow_read_in_flight_does_not_hold_up_entries_submitted_after_it() {
    let origin = slow_origin("slow", 1500);
    let (scratch, server, cold, objects) = (
        &origin.scratch,
        &origin.server,
        &origin.cold,
        &origin.objects,
    );
    let mut client = LocalClient::connect(socket_of(scratch)).unwrap();
    let region = client.allocate(2 * SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 4, None).unwrap();
    let mut slow = get(0, "cold");
    slow.bucket = "slow".into();
    ring.push(&slow, 1).unwrap();
    ring.submit();
    eventually("the slow read in flight", || {
        server.metric("hydrant_local_ring_reads_in_flight") == 1
    });
    // Submitted while the only read in flight waits on the origin: taken and answered first.
    ring.push(&get(1, "object-000"), 2).unwrap();
    let mut done = Vec::new();
    ring.wait(1, &mut done, WAIT).unwrap();
    assert_eq!(done[0].user_data, 2, "the fast read is answered first");
    assert_eq!(
        server.metric("hydrant_local_ring_reads_in_flight"),
        1,
        "while the slow one is still in flight"
    );
    let written = done[0].result.as_ref().unwrap().written as usize;
    let start = SLOT_BYTES as usize;
    assert_eq!(
        &region.as_slice()[start..start + written],
        &objects["object-000"][..]
    );
    done.clear();
    ring.wait(1, &mut done, WAIT).unwrap();
    assert_eq!(done[0].user_data, 1);
    let written = done[0].result.as_ref().unwrap().written as usize;
    assert_eq!(&region.as_slice()[..written], &cold[..]);
}

#[test]
fn waiting_on_several_rings_counts_the_completions_of_all() {
    // Two rings, each with two fast reads and one that waits 3 s on the origin: a wait for
    // four completions ends with the four fast ones, whichever rings they came from.
    let origin = slow_origin("several", 3000);
    let (scratch, objects) = (&origin.scratch, &origin.objects);
    let mut client = LocalClient::connect(socket_of(scratch)).unwrap();
    let region = client.allocate(8 * SLOT_BYTES).unwrap();
    let mut rings: Vec<LocalRing> = (0..2)
        .map(|_| client.open_ring(&region, 4, Some(0)).unwrap())
        .collect();
    for (index, ring) in rings.iter_mut().enumerate() {
        let base = index as u64 * 3;
        let mut slow = get(base, "cold");
        slow.bucket = "slow".into();
        ring.push(&slow, base).unwrap();
        ring.push(&get(base + 1, "object-000"), base + 1).unwrap();
        ring.push(&get(base + 2, "object-001"), base + 2).unwrap();
    }
    let mut done = Vec::new();
    let started = std::time::Instant::now();
    wait_rings(&mut rings, 4, &mut done, Some(Duration::from_millis(2000))).unwrap();
    assert!(started.elapsed() < Duration::from_millis(2000));
    let mut fast: Vec<u64> = done.iter().map(|completion| completion.user_data).collect();
    fast.sort_unstable();
    assert_eq!(fast, [1, 2, 4, 5], "the fast reads of both rings");
    for completion in &done {
        let key = if completion.user_data % 3 == 1 {
            "object-000"
        } else {
            "object-001"
        };
        let written = completion.result.as_ref().unwrap().written as usize;
        let start = (completion.user_data * SLOT_BYTES) as usize;
        assert_eq!(
            &region.as_slice()[start..start + written],
            &objects[key][..]
        );
    }
}

#[test]
fn a_ring_whose_region_is_freed_ends_its_waits_with_an_error() {
    let scratch = Scratch::new("ring-freed");
    let server = start(&scratch, 2, &[]);
    store_objects(&server, 2);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let region = client.allocate(4 * SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 4, None).unwrap();
    // Entries written but not yet submitted when the region goes: the server never takes them.
    ring.push(&get(0, "object-000"), 0).unwrap();
    ring.push(&get(1, "object-001"), 1).unwrap();
    client.release(&region).unwrap();
    assert_eq!(server.metric("hydrant_local_rings"), 0);
    assert_eq!(server.metric("hydrant_local_regions"), 0);
    assert_eq!(
        server.metric("hydrant_local_region_bytes"),
        0,
        "ring files counted back too"
    );
    let mut done = Vec::new();
    let error = ring.wait(2, &mut done, WAIT).unwrap_err();
    assert!(error.to_string().contains("closed the ring"), "{error}");
    assert!(done.is_empty());
}

#[test]
fn an_origin_object_larger_than_its_place_is_refused_without_fetching_it_whole() {
    // 12 MiB at the origin (three chunks of 4 MiB), read into a place of 1 MiB: the origin's
    // first answer tells the size, and no more of the object is fetched.
    let origin = slow_origin("oversized", 0);
    let big = object_bytes(11, 12 << 20);
    origin._s3.put("ring-oversized", "big", &big);
    let mut client = LocalClient::connect(socket_of(&origin.scratch)).unwrap();
    let region = client.allocate(SLOT_BYTES).unwrap();
    let mut ring = client.open_ring(&region, 2, None).unwrap();
    let mut oversized = get(0, "big");
    oversized.bucket = "slow".into();
    ring.push(&oversized, 1).unwrap();
    let mut done = Vec::new();
    ring.wait(1, &mut done, WAIT).unwrap();
    assert_eq!(
        status_of(&done[0]),
        Status::TooLarge as u8,
        "{:?}",
        done[0].result
    );
    let path = origin._s3.request_path("/ring-oversized/big");
    assert_eq!(
        origin._proxy.stats().gets_of(&path),
        1,
        "only the GET that told the object's size"
    );
    // The same object with a range that fits is read, byte-exact.
    let mut ranged = get(0, "big");
    ranged.bucket = "slow".into();
    ranged.range = Some((5 << 20, Some((5 << 20) + 70_000)));
    ring.push(&ranged, 2).unwrap();
    done.clear();
    ring.wait(1, &mut done, WAIT).unwrap();
    let written = done[0].result.as_ref().unwrap().written as usize;
    assert_eq!(written, 70_000);
    assert_eq!(
        &region.as_slice()[..written],
        &big[5 << 20..(5 << 20) + 70_000]
    );
}
