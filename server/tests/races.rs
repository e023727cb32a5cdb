//! Writes and deletes racing read-throughs, through the real server process on a folder origin:
//! once a DELETE or PUT is acknowledged, no read ever returns the bytes it replaced, before or
//! after a restart.

mod common;

use std::collections::HashMap;
use std::net::TcpStream;
use std::path::Path;

use common::{object_bytes, receive, send, Response, Scratch, ServerProcess};
use hydrant_proto::message::{GetRequest, Message, ObjectName, PutRequest};
use hydrant_proto::{Opcode, Status};

const KEYS: u64 = 100;
const OBJECT_BYTES: usize = 4 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Mutation {
    Delete,
    Put,
}

fn key(index: u64) -> String {
    format!("cold/{index:03}")
}

fn name(index: u64) -> ObjectName {
    ObjectName {
        bucket: "data".into(),
        key: key(index),
    }
}

fn get_request(index: u64) -> Vec<u8> {
    GetRequest {
        name: name(index),
        range_start: 0,
        range_end: None,
    }
    .encode()
}

/// What the origin holds before the test (the old bytes) and what a PUT writes (the new).
fn old_bytes(index: u64) -> Vec<u8> {
    object_bytes(index, OBJECT_BYTES)
}

fn new_bytes(index: u64) -> Vec<u8> {
    object_bytes(1000 + index, OBJECT_BYTES)
}

fn start(directory: &Path) -> ServerProcess {
    ServerProcess::start(directory, 1024, &[], &[])
}

/// Send the mutation of key `index` as request `id`.
fn send_mutation(stream: &mut TcpStream, mutation: Mutation, index: u64, id: u64) {
    match mutation {
        Mutation::Delete => send(stream, Opcode::Delete, id, &name(index).encode(), &[]),
        Mutation::Put => {
            let data = new_bytes(index);
            let request = PutRequest {
                name: name(index),
                object_bytes: data.len() as u64,
            };
            // Above the frame limit: streamed as MORE frames.
            let part_bytes = 1 << 20;
            let parts = data.len().div_ceil(part_bytes);
            for (part, bytes) in data.chunks(part_bytes).enumerate() {
                let extension = if part == 0 {
                    request.encode()
                } else {
                    Vec::new()
                };
                let crc = crc32c::crc32c(bytes);
                let mut header = hydrant_proto::FrameHeader::new(
                    Opcode::Put,
                    id,
                    &extension,
                    bytes.len() as u64,
                    crc,
                );
                if part + 1 < parts {
                    header.flags = header.flags.with(hydrant_proto::FrameFlags::MORE);
                }
                let mut frame = header.encode().to_vec();
                frame.extend_from_slice(&extension);
                frame.extend_from_slice(bytes);
                std::io::Write::write_all(stream, &frame).unwrap();
            }
        }
    }
}

/// Read `count` answers from `stream`, by request id.
fn answers(stream: &mut TcpStream, count: usize) -> HashMap<u64, Response> {
    (0..count)
        .map(|_| {
            let response = receive(stream);
            (response.header.request_id, response)
        })
        .collect()
}

/// After every mutation was acknowledged: no key gives its old bytes.
fn check_after(server: &ServerProcess, mutation: Mutation, when: &str) {
    let mut stream = server.greeted();
    for index in 0..KEYS {
        send(
            &mut stream,
            Opcode::Get,
            10 + index,
            &get_request(index),
            &[],
        );
    }
    let mut resurrected = Vec::new();
    for (id, response) in answers(&mut stream, KEYS as usize) {
        let index = id - 10;
        match (mutation, response.status()) {
            (Mutation::Delete, Status::NotFound) => {}
            (Mutation::Put, Status::Ok) if response.payload == new_bytes(index) => {}
            (_, Status::Ok) if response.payload == old_bytes(index) => resurrected.push(index),
            (_, status) => panic!("{when}: key {index}: {status:?} {}", response.message()),
        }
    }
    assert!(
        resurrected.is_empty(),
        "{when}: {} keys served their bytes from before the acknowledged {} (first {:?})",
        resurrected.len(),
        if mutation == Mutation::Delete {
            "DELETE"
        } else {
            "PUT"
        },
        &resurrected[..resurrected.len().min(8)]
    );
}

/// Every cold key read through (GET) and, pipelined right behind it, deleted or overwritten:
/// on one connection, or the GETs on one and the mutations on another.
fn race(name: &str, mutation: Mutation, two_connections: bool) {
    let scratch = Scratch::new(name);
    let origin = scratch.path().join("origin/data/cold");
    std::fs::create_dir_all(&origin).unwrap();
    for index in 0..KEYS {
        std::fs::write(origin.join(format!("{index:03}")), old_bytes(index)).unwrap();
    }
    let mut server = start(scratch.path());
    let mut readers = server.greeted();
    let mut writers = if two_connections {
        Some(server.greeted())
    } else {
        None
    };
    // Sent from a thread of their own, so that the answers are read while PUTs are still
    // being sent.
    let mut read_side = readers.try_clone().unwrap();
    let mut write_side = writers.as_ref().map(|stream| stream.try_clone().unwrap());
    let sender = std::thread::spawn(move || {
        for index in 0..KEYS {
            send(
                &mut read_side,
                Opcode::Get,
                2 * index,
                &get_request(index),
                &[],
            );
            let stream = write_side.as_mut().unwrap_or(&mut read_side);
            send_mutation(stream, mutation, index, 2 * index + 1);
        }
    });
    let mut answered = answers(
        &mut readers,
        if two_connections { KEYS } else { 2 * KEYS } as usize,
    );
    if let Some(writers) = writers.as_mut() {
        answered.extend(answers(writers, KEYS as usize));
    }
    sender.join().unwrap();
    for index in 0..KEYS {
        let read = &answered[&(2 * index)];
        // The GETs raced the mutations: either version (or none) is a right answer to them.
        let fine = match read.status() {
            Status::Ok => read.payload == old_bytes(index) || read.payload == new_bytes(index),
            Status::NotFound => mutation == Mutation::Delete,
            _ => false,
        };
        assert!(fine, "GET {index}: {:?} {}", read.status(), read.message());
        let write = &answered[&(2 * index + 1)];
        assert_eq!(
            write.status(),
            Status::Ok,
            "mutation {index}: {}",
            write.message()
        );
    }
    check_after(&server, mutation, "right after the acknowledgements");
    // Once every read-through has finished admitting what it read.
    std::thread::sleep(std::time::Duration::from_secs(1));
    check_after(&server, mutation, "a second later");
    server.kill();
    let server = start(scratch.path());
    check_after(&server, mutation, "after a restart");
}

#[test]
fn a_delete_racing_a_read_through_on_one_connection_is_never_undone() {
    race("race-delete-one", Mutation::Delete, false);
}

#[test]
fn a_delete_racing_a_read_through_on_another_connection_is_never_undone() {
    race("race-delete-two", Mutation::Delete, true);
}

#[test]
fn a_put_racing_a_read_through_is_never_undone() {
    race("race-put-one", Mutation::Put, false);
    race("race-put-two", Mutation::Put, true);
}

/// A DELETE acknowledged while the write-back upload of the version it deletes is finishing
/// (the origin has it, the node is recording it clean) leaves nothing behind: no HEAD or GET
/// finds the object afterwards, at the node or at the origin. The uploader used to remember the
/// uploaded version as the origin's after the delete had removed it from there, and HEAD then
/// answered for a deleted object.
#[test]
fn a_delete_racing_the_end_of_its_write_back_upload_is_never_undone() {
    let scratch = Scratch::new("race-delete-upload");
    let server = start(scratch.path());
    let mut client = server.client();
    let origin = scratch.path().join("origin").join("racing");
    for round in 0..200 {
        let key = format!("object-{round:03}");
        client
            .put("racing", &key, &object_bytes(round, 300_000))
            .unwrap();
        // The upload starts at once; the delete lands at any moment of it.
        if round % 4 != 0 {
            std::thread::sleep(std::time::Duration::from_micros(round * 37 % 3000));
        }
        client.delete("racing", &key).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let head = client.head("racing", &key);
        assert!(
            head.as_ref().is_err_and(|error| error.is_not_found()),
            "round {round}: HEAD after an acknowledged DELETE: {head:?}"
        );
        let get = client.get("racing", &key, None);
        assert!(
            get.as_ref().is_err_and(|error| error.is_not_found()),
            "round {round}: GET after an acknowledged DELETE found it"
        );
    }
    client
        .flush(None, "", std::time::Duration::from_secs(60))
        .unwrap();
    let left: Vec<_> = std::fs::read_dir(&origin)
        .map(|entries| entries.filter_map(|entry| entry.ok()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "deleted objects at the origin: {left:?}");
}
