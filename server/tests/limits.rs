//! What a client can make the server hold or do, against the real server process: each bound
//! named in docs/architecture.md's limits table, and service that goes on at the bound.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{call, object_bytes, receive, Scratch, ServerProcess};
use hydrant_proto::message::{GetRequest, Message, ObjectName, PutRequest};
use hydrant_proto::{FrameFlags, FrameHeader, Opcode, Status};

/// A streamed PUT's frames, the payload cut in `parts`.
fn streamed_put(request_id: u64, key: &str, data: &[u8], parts: usize) -> Vec<Vec<u8>> {
    let request = PutRequest {
        name: ObjectName {
            bucket: "data".into(),
            key: key.into(),
        },
        object_bytes: data.len() as u64,
    };
    let part_bytes = data.len().div_ceil(parts);
    let pieces: Vec<&[u8]> = data.chunks(part_bytes).collect();
    pieces
        .iter()
        .enumerate()
        .map(|(index, piece)| {
            let extension = if index == 0 {
                request.encode()
            } else {
                Vec::new()
            };
            let mut header = FrameHeader::new(
                Opcode::Put,
                request_id,
                &extension,
                piece.len() as u64,
                crc32c::crc32c(piece),
            );
            if index + 1 < pieces.len() {
                header.flags = header.flags.with(FrameFlags::MORE);
            }
            let mut frame = header.encode().to_vec();
            frame.extend_from_slice(&extension);
            frame.extend_from_slice(piece);
            frame
        })
        .collect()
}

#[test]
fn a_slow_streamed_put_is_not_cut_by_the_idle_timeout_but_a_quiet_connection_is() {
    let scratch = Scratch::new("limits-idle");
    let server = ServerProcess::start(scratch.path(), 512, &["--idle-timeout", "1s"], &[]);
    let data = object_bytes(3, 600_000);
    let mut stream = server.greeted();
    // 30 frames, a trickle of bytes every 150 ms: the stream takes 4.5 s, longer than the
    // idle timeout several times over, but is never quiet for one.
    let started = Instant::now();
    for frame in streamed_put(9, "slow", &data, 30) {
        for piece in frame.chunks(frame.len().div_ceil(3)) {
            stream.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let answer = receive(&mut stream);
    assert_eq!(answer.status(), Status::Ok, "{}", answer.message());
    assert!(started.elapsed() > Duration::from_secs(3));
    let get = GetRequest {
        name: ObjectName {
            bucket: "data".into(),
            key: "slow".into(),
        },
        range_start: 0,
        range_end: None,
    };
    let read = call(&mut stream, Opcode::Get, &get.encode(), &[]);
    assert!(read.payload == data, "the slow PUT's bytes are stored");
    // Quiet for three timeouts: closed.
    std::thread::sleep(Duration::from_secs(3));
    let mut probe = [0u8; 1];
    let closed = matches!(std::io::Read::read(&mut stream, &mut probe), Ok(0) | Err(_));
    assert!(closed, "a quiet connection is closed after the idle timeout");
}
