//! Same-host writes (WRITE from a shared region) against the real `hydrant-server` process:
//! objects of every shape land byte-exact from any place in the region (written from where they
//! lie but for a chunk's last partial block, copies counted) and survive SIGKILL of the server; conditions and bad requests are refused with
//! nothing written; a writer killed mid-object leaves nothing visible; a client that changes
//! its bytes mid-write costs no other key anything, across a restart too.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, object_bytes, Scratch, ServerProcess};
use hydrant_client::local::{LocalClient, LocalCondition, Region};
use hydrant_client::ClientError;
use hydrant_proto::local::{local_message, LocalHeader, LocalOpcode, LOCAL_HEADER_BYTES};
use hydrant_proto::Status;

fn socket_of(scratch: &Scratch) -> PathBuf {
    scratch.path().join("local.sock")
}

fn start(scratch: &Scratch, shards: usize, data_mib: u64) -> ServerProcess {
    let socket = socket_of(scratch);
    ServerProcess::start_shards(
        scratch.path(),
        shards,
        data_mib,
        &[
            "--origin",
            "none",
            "--local-socket",
            socket.to_str().unwrap(),
        ],
        &[],
    )
}

fn status_of(error: ClientError) -> u8 {
    match error {
        ClientError::Status { status, .. } => status,
        other => panic!("expected a status, got {other}"),
    }
}

/// The whole of `bucket/key` over TCP.
fn get(tcp: &mut hydrant_client::Client, key: &str) -> Vec<u8> {
    tcp.get("b", key, None).unwrap().1
}

/// Whether `b/key` is stored: its size, or `None` when HEAD answers NOT_FOUND.
fn head(tcp: &mut hydrant_client::Client, key: &str) -> Option<u64> {
    match tcp.head("b", key) {
        Ok(info) => Some(info.object_bytes),
        Err(error) => {
            assert_eq!(status_of(error), Status::NotFound as u8);
            None
        }
    }
}

/// Put `data` at `offset` of `region` (the rest of the region keeps what it had).
fn place(region: &mut Region, offset: usize, data: &[u8]) {
    region.as_mut_slice()[offset..offset + data.len()].copy_from_slice(data);
}

#[test]
fn writes_land_byte_exact_from_aligned_and_unaligned_places_and_survive_sigkill() {
    let scratch = Scratch::new("local-writes-exact");
    let mut server = start(&scratch, 2, 768);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let mut region = client.allocate(32 << 20).unwrap();
    // Whatever follows an object in the region must never be read back as its data.
    region.as_mut_slice().fill(0xab);
    // (offset, length): empty, within a block, a block short, one block, several, one chunk,
    // three chunks with a short last one; then places off a block boundary.
    let aligned = [
        (0usize, 0usize),
        (0, 1),
        (4096, 4095),
        (8192, 4096),
        (16384, 100_000),
        (1 << 20, 4 << 20),
        (8 << 20, (9 << 20) + 123),
    ];
    let unaligned = [(1000usize, (5 << 20) + 7), (4097, 10)];
    let mut written = Vec::new();
    for (seed, &(offset, length)) in aligned.iter().chain(&unaligned).enumerate() {
        let data = object_bytes(seed as u64 + 1, length);
        place(&mut region, offset, &data);
        let key = format!("shaped/{seed}");
        let info = client
            .write_from(
                &region,
                offset as u64,
                length as u64,
                "b",
                &key,
                LocalCondition::None,
            )
            .unwrap();
        assert_eq!(info.bytes, length as u64);
        assert!(!info.dirty, "no origin: nothing to write back");
        written.push((key, data));
    }
    let aligned_bytes: usize = aligned.iter().map(|(_, length)| length).sum();
    let unaligned_bytes: usize = unaligned.iter().map(|(_, length)| length).sum();
    assert_eq!(
        server.metric("hydrant_shared_write_bytes_total"),
        (aligned_bytes + unaligned_bytes) as u64
    );
    // A chunk that starts aligned is written from where it lies but for its last partial
    // block; one that does not is copied whole (the server's chunks are 4 MiB).
    let partial_blocks: usize = aligned
        .iter()
        .flat_map(|&(_, length)| {
            (0..length)
                .step_by(4 << 20)
                .map(move |start| (length - start).min(4 << 20))
        })
        .map(|chunk| chunk % 4096)
        .sum();
    assert_eq!(partial_blocks, 1 + 4095 + 1696 + 123);
    assert_eq!(
        server.metric("hydrant_shared_write_copied_bytes_total"),
        (partial_blocks + unaligned_bytes) as u64,
        "only the last partial block of an aligned chunk is copied, and unaligned ones whole"
    );
    let check = |server: &ServerProcess| {
        let mut tcp = server.client();
        let mut reader = LocalClient::connect(socket_of(&scratch)).unwrap();
        let mut into = reader.allocate(16 << 20).unwrap();
        for (key, data) in &written {
            assert_eq!(&get(&mut tcp, key), data, "{key} over TCP");
            let info = reader.read_into(&mut into, 0, "b", key, None).unwrap();
            assert_eq!(
                &into.as_slice()[..info.written as usize],
                &data[..],
                "{key} through the same-host path"
            );
        }
    };
    check(&server);
    drop(region);
    drop(client);
    server.kill();
    let server = start(&scratch, 2, 768);
    check(&server);
}

#[test]
fn conditions_and_bad_writes_are_refused_and_write_nothing() {
    let scratch = Scratch::new("local-writes-refused");
    let server = start(&scratch, 2, 512);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let mut region = client.allocate(1 << 20).unwrap();
    let first = object_bytes(1, 5000);
    place(&mut region, 0, &first);
    let version = client
        .write_from(&region, 0, 5000, "b", "k", LocalCondition::Absent)
        .unwrap()
        .seq;

    let second = object_bytes(2, 6000);
    place(&mut region, 8192, &second);
    let refused = |client: &mut LocalClient, region: &Region, offset, length, key, condition| {
        status_of(
            client
                .write_from(region, offset, length, "b", key, condition)
                .unwrap_err(),
        )
    };
    let precondition_failed = Status::PreconditionFailed as u8;
    assert_eq!(
        refused(
            &mut client,
            &region,
            8192,
            6000,
            "k",
            LocalCondition::Absent
        ),
        precondition_failed
    );
    assert_eq!(
        refused(
            &mut client,
            &region,
            8192,
            6000,
            "k",
            LocalCondition::Version(version + 1000)
        ),
        precondition_failed
    );
    assert_eq!(
        refused(
            &mut client,
            &region,
            (1 << 20) - 10,
            11,
            "k",
            LocalCondition::None
        ),
        Status::InvalidRange as u8
    );
    assert_eq!(
        refused(&mut client, &region, u64::MAX, 2, "k", LocalCondition::None),
        Status::InvalidRange as u8
    );
    assert_eq!(
        refused(
            &mut client,
            &region,
            0,
            10,
            "../escape",
            LocalCondition::None
        ),
        Status::InvalidKey as u8
    );
    assert_eq!(get(&mut server.client(), "k"), first, "unchanged");

    // The version it names is the stored one: written.
    let replaced = client
        .write_from(
            &region,
            8192,
            6000,
            "b",
            "k",
            LocalCondition::Version(version),
        )
        .unwrap();
    assert!(replaced.seq > version);
    assert_eq!(get(&mut server.client(), "k"), second);

    // A region of another connection is not this connection's to name.
    let mut other = LocalClient::connect(socket_of(&scratch)).unwrap();
    assert!(matches!(
        other.write_from(&region, 0, 10, "b", "x", LocalCondition::None),
        Err(ClientError::Usage(_))
    ));

    // Raw requests: an unknown region, and a body that does not decode, answered with a
    // status on a connection that goes on serving.
    let mut raw = UnixStream::connect(socket_of(&scratch)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut ask = |body: &[u8]| -> u8 {
        raw.write_all(&local_message(LocalOpcode::Write, 0, 7, body))
            .unwrap();
        let mut header = [0u8; LOCAL_HEADER_BYTES];
        raw.read_exact(&mut header).unwrap();
        let header = LocalHeader::decode(&header).unwrap();
        let mut answer = vec![0u8; header.body_len as usize];
        raw.read_exact(&mut answer).unwrap();
        header.status
    };
    let unknown_region = hydrant_proto::local::LocalWrite {
        region: 99,
        offset: 0,
        length: 10,
        condition: LocalCondition::None,
        bucket: "b".into(),
        key: "x".into(),
    }
    .encode();
    assert_eq!(ask(&unknown_region), Status::NotFound as u8);
    let mut bad_condition = unknown_region.clone();
    bad_condition[20] = 9;
    assert_eq!(ask(&bad_condition), Status::BadRequest as u8);
    assert_eq!(ask(&[1, 2, 3]), Status::BadRequest as u8);
    assert!(head(&mut server.client(), "x").is_none());
    assert_eq!(server.metric("hydrant_shared_write_bytes_total"), 11_000);
}

/// A key and the bytes written under it.
type Written = (String, Vec<u8>);

#[test]
fn acknowledged_same_host_writes_survive_sigkill_of_the_server() {
    let scratch = Scratch::new("local-writes-kill");
    let mut server = start(&scratch, 2, 1024);
    for round in 0..3u64 {
        let acknowledged: Arc<Mutex<Vec<Written>>> = Arc::default();
        let in_flight: Arc<Mutex<Option<Written>>> = Arc::default();
        let writer = {
            let acknowledged = acknowledged.clone();
            let in_flight = in_flight.clone();
            let socket = socket_of(&scratch);
            std::thread::spawn(move || {
                let mut client = LocalClient::connect(&socket).unwrap();
                let mut region = client.allocate(16 << 20).unwrap();
                for object in 0u64.. {
                    // Sizes from a block to three chunks, at aligned and unaligned places.
                    let length = [4096usize, 70_000, 4 << 20, (9 << 20) + 1][object as usize % 4];
                    let offset = if object % 3 == 0 { 512 } else { 0 };
                    let key = format!("round-{round}/{object}");
                    let data = object_bytes(round * 1000 + object, length);
                    place(&mut region, offset, &data);
                    *in_flight.lock().unwrap() = Some((key.clone(), data.clone()));
                    let written = client.write_from(
                        &region,
                        offset as u64,
                        length as u64,
                        "b",
                        &key,
                        LocalCondition::None,
                    );
                    if written.is_err() {
                        return; // the server is gone
                    }
                    acknowledged.lock().unwrap().push((key, data));
                }
            })
        };
        eventually("some writes", || acknowledged.lock().unwrap().len() >= 3);
        std::thread::sleep(Duration::from_millis(150 * round));
        server.kill();
        writer.join().unwrap();
        server = start(&scratch, 2, 1024);
        let mut tcp = server.client();
        let acknowledged = acknowledged.lock().unwrap();
        for (key, data) in acknowledged.iter() {
            assert_eq!(&get(&mut tcp, key), data, "{key} was acknowledged");
        }
        // The write in flight at the kill is whole or absent, never a mix.
        let last = in_flight.lock().unwrap().take();
        if let Some((key, data)) = last {
            if let Some(found) = head(&mut tcp, &key) {
                assert_eq!(found, data.len() as u64);
                assert_eq!(get(&mut tcp, &key), data, "{key} in flight");
            }
        }
    }
}

/// Run by `a_writer_killed_mid_object_leaves_nothing_visible`: sends one large WRITE and
/// waits for an answer that its parent does not let it see.
#[test]
fn child_writer_for_the_kill_test() {
    let Ok(socket) = std::env::var("HYDRANT_LOCAL_WRITER_SOCKET") else {
        return; // only meaningful as the child process
    };
    let length = CHILD_OBJECT_BYTES;
    let mut client = LocalClient::connect(&socket).unwrap();
    let mut region = client.allocate(length as u64).unwrap();
    region.as_mut_slice().fill(0x5a);
    println!("filled");
    std::io::stdout().flush().unwrap();
    let _ = client.write_from(&region, 0, length as u64, "b", "big", LocalCondition::None);
}

/// Far more than a drive writes in the moment between the WRITE and the kill.
const CHILD_OBJECT_BYTES: usize = 192 << 20;

#[test]
fn a_writer_killed_mid_object_leaves_nothing_visible() {
    let scratch = Scratch::new("local-writes-writer-killed");
    let mut server = start(&scratch, 1, 1024);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer_for_the_kill_test", "--nocapture"])
        .env("HYDRANT_LOCAL_WRITER_SOCKET", socket_of(&scratch))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("filled") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the child died");
    }
    // The WRITE is sent right after the line; the server is then writing the object, which
    // takes far longer than this.
    std::thread::sleep(Duration::from_millis(30));
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("the dead writer's region freed", || {
        server.metric("hydrant_local_regions") == 0
    });
    let mut tcp = server.client();
    assert!(
        head(&mut tcp, "big").is_none(),
        "an abandoned write left its object visible"
    );
    // The server goes on taking writes, and a restart does not bring the object back.
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let mut region = client.allocate(1 << 20).unwrap();
    place(&mut region, 0, b"after");
    client
        .write_from(&region, 0, 5, "b", "after", LocalCondition::None)
        .unwrap();
    drop(region);
    drop(client);
    server.kill();
    let server = start(&scratch, 1, 1024);
    let mut tcp = server.client();
    assert!(head(&mut tcp, "big").is_none());
    assert_eq!(get(&mut tcp, "after"), b"after");
}

/// The region's memory, for a thread that scribbles on it while a write reads it (what a
/// careless client does: the test's own `Region` stays with the writing thread).
struct Scribbler(*mut u8, usize);

// SAFETY: the mapping outlives the scribbling thread (joined before the region is dropped), and
// the bytes are plain memory whose changes the server must tolerate.
unsafe impl Send for Scribbler {}

#[test]
fn a_client_that_changes_its_bytes_mid_write_costs_only_that_object() {
    let scratch = Scratch::new("local-writes-scribbled");
    let mut server = start(&scratch, 2, 1024);
    let mut tcp = server.client();
    let keep = object_bytes(9, 3 << 20);
    tcp.put("b", "kept", &keep).unwrap();
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let length = 96usize << 20;
    let mut region = client.allocate(length as u64).unwrap();
    place(&mut region, 0, &object_bytes(10, length));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scribbler = {
        let memory = Scribbler(region.as_mut_slice().as_mut_ptr(), length);
        let stop = stop.clone();
        std::thread::spawn(move || {
            let memory = memory;
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round = round.wrapping_add(1);
                for offset in (0..memory.1).step_by(4096) {
                    // SAFETY: within the mapping (see `Scribbler`).
                    unsafe { memory.0.add(offset).write_volatile(round) };
                }
            }
        })
    };
    let written = client.write_from(
        &region,
        0,
        length as u64,
        "b",
        "scribbled",
        LocalCondition::None,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    scribbler.join().unwrap();
    // Written from where the bytes lay while they changed: acknowledged, and then either whole
    // (the device read them as the checksums were computed) or failing its checksum when read.
    written.unwrap();
    let damaged =
        |tcp: &mut hydrant_client::Client, when: &str| match tcp.get("b", "scribbled", None) {
            Ok((info, data)) => {
                assert_eq!(info.object_bytes, length as u64, "{when}");
                assert_eq!(data.len(), length, "{when}");
                false
            }
            Err(error) => {
                let status = status_of(error);
                assert!(
                    status == Status::DataCorrupt as u8 || status == Status::NotFound as u8,
                    "{when}: status {status}"
                );
                true
            }
        };
    let damaged_before = damaged(&mut tcp, "before the restart");
    // Everything else is as it was, now and after a restart, and writes go on: acknowledged
    // writes after the damaged entries, on both shards, survive SIGKILL (recovery voids the
    // damaged version instead of ending the log at it).
    assert_eq!(get(&mut tcp, "kept"), keep);
    let later: Vec<(String, Vec<u8>)> = (0..8u64)
        .map(|index| {
            (
                format!("later/{index}"),
                object_bytes(20 + index, 5000 + index as usize),
            )
        })
        .collect();
    for (key, data) in &later {
        place(&mut region, 0, data);
        client
            .write_from(
                &region,
                0,
                data.len() as u64,
                "b",
                key,
                LocalCondition::None,
            )
            .unwrap();
    }
    drop(region);
    drop(client);
    server.kill();
    let server = start(&scratch, 2, 1024);
    let mut tcp = server.client();
    assert_eq!(get(&mut tcp, "kept"), keep);
    for (key, data) in &later {
        assert_eq!(&get(&mut tcp, key), data, "{key} after the restart");
    }
    let damaged_after = damaged(&mut tcp, "after the restart");
    eprintln!("scribbled: damaged before the restart {damaged_before}, after {damaged_after}");
}
