//! Same-host writes from the writer's own memory (WRITE_MEMORY, no shared region) against the
//! real `hydrant-server` process: objects gathered from many parts land byte-exact, counted
//! once, and survive SIGKILL of the server; an address that is not mapped in the writer, at
//! the start or part-way, is refused with nothing stored; conditions hold as for WRITE.

mod common;

use std::path::PathBuf;

use common::{object_bytes, Scratch, ServerProcess};
use hydrant_client::local::{LocalClient, LocalCondition};
use hydrant_client::ClientError;
use hydrant_proto::Status;

fn socket_of(scratch: &Scratch) -> PathBuf {
    scratch.path().join("local.sock")
}

fn start(scratch: &Scratch) -> ServerProcess {
    let socket = socket_of(scratch);
    ServerProcess::start_shards(
        scratch.path(),
        2,
        512,
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

fn stored(tcp: &mut hydrant_client::Client, key: &str) -> Option<Vec<u8>> {
    match tcp.get("b", key, None) {
        Ok((_, data)) => Some(data),
        Err(error) => {
            assert_eq!(status_of(error), Status::NotFound as u8, "{key}");
            None
        }
    }
}

#[test]
fn objects_from_many_parts_of_the_writers_memory_land_byte_exact_and_survive_sigkill() {
    let scratch = Scratch::new("local-memory-writes");
    let mut server = start(&scratch);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    // Objects as a writer gathers them: one part, many small ones, parts of every size around
    // the chunk size, an empty part among them, and nothing at all.
    let shapes: Vec<Vec<usize>> = vec![
        vec![(9 << 20) + 123],
        (0..300).map(|index| 1 + index * 37).collect(),
        vec![4 << 20, 1, (4 << 20) - 1, 0, 4097, 3 << 20],
        vec![],
        vec![1],
    ];
    let mut expected = Vec::new();
    let mut total = 0;
    for (seed, shape) in shapes.iter().enumerate() {
        let parts: Vec<Vec<u8>> = shape
            .iter()
            .enumerate()
            .map(|(index, &length)| object_bytes((seed * 1000 + index) as u64, length))
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let key = format!("gathered/{seed}");
        let info = client
            .write_memory(&slices, "b", &key, LocalCondition::None)
            .unwrap();
        let whole = parts.concat();
        assert_eq!(info.bytes, whole.len() as u64);
        total += whole.len();
        expected.push((key, whole));
    }
    assert_eq!(
        server.metric("hydrant_shared_write_bytes_total"),
        total as u64
    );
    assert_eq!(
        server.metric("hydrant_shared_write_copied_bytes_total"),
        total as u64,
        "each byte is read once from the writer, into the shard's buffer"
    );
    let check = |server: &ServerProcess| {
        let mut tcp = server.client();
        for (key, whole) in &expected {
            assert_eq!(stored(&mut tcp, key).as_ref(), Some(whole), "{key}");
        }
    };
    check(&server);
    drop(client);
    server.kill();
    let server = start(&scratch);
    check(&server);
}

#[test]
fn memory_the_writer_does_not_have_is_refused_and_nothing_is_stored() {
    let scratch = Scratch::new("local-memory-refused");
    let server = start(&scratch);
    let mut tcp = server.client();
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let good = object_bytes(1, 6 << 20);
    // An address no process maps (the first page), as the only part.
    // SAFETY: never dereferenced here; the server reads it from this process and fails.
    let unmapped: &[u8] = unsafe { std::slice::from_raw_parts(4096 as *const u8, 4096) };
    let error = client
        .write_memory(&[unmapped], "b", "refused/first", LocalCondition::None)
        .unwrap_err();
    assert_eq!(status_of(error), Status::InvalidRange as u8);
    // Part-way: the first chunk reads, a later part does not; nothing becomes visible.
    let error = client
        .write_memory(
            &[&good, unmapped],
            "b",
            "refused/later",
            LocalCondition::None,
        )
        .unwrap_err();
    assert_eq!(status_of(error), Status::InvalidRange as u8);
    assert_eq!(stored(&mut tcp, "refused/first"), None);
    assert_eq!(stored(&mut tcp, "refused/later"), None);

    // Conditions, as for a WRITE from a region.
    let first = client
        .write_memory(&[&good[..5000]], "b", "cond", LocalCondition::Absent)
        .unwrap();
    let error = client
        .write_memory(&[&good[..10]], "b", "cond", LocalCondition::Absent)
        .unwrap_err();
    assert_eq!(status_of(error), Status::PreconditionFailed as u8);
    let error = client
        .write_memory(
            &[&good[..10]],
            "b",
            "cond",
            LocalCondition::Version(first.seq + 99),
        )
        .unwrap_err();
    assert_eq!(status_of(error), Status::PreconditionFailed as u8);
    assert_eq!(stored(&mut tcp, "cond"), Some(good[..5000].to_vec()));
    client
        .write_memory(
            &[&good[..10]],
            "b",
            "cond",
            LocalCondition::Version(first.seq),
        )
        .unwrap();
    assert_eq!(stored(&mut tcp, "cond"), Some(good[..10].to_vec()));
    // The connection still serves after its refusals.
    client
        .write_memory(&[&good], "b", "after", LocalCondition::None)
        .unwrap();
    assert_eq!(stored(&mut tcp, "after"), Some(good));
}
