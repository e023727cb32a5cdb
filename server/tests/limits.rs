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
            common::frame_of_stream(
                Opcode::Put,
                request_id,
                &extension,
                piece,
                index + 1 < pieces.len(),
            )
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
    assert!(
        closed,
        "a quiet connection is closed after the idle timeout"
    );
}

const MIB: u64 = 1 << 20;

#[test]
fn batch_items_waiting_on_a_slow_origin_hold_bounded_memory() {
    let s3 = common::S3Server::start();
    s3.create_bucket("limits-batch");
    s3.put("limits-batch", "small", &object_bytes(1, 1000));
    let mut config = hydrant_fault_proxy::Config::new(s3.address());
    config.settings.delay = hydrant_fault_proxy::DelayRange::NONE;
    let proxy = hydrant_fault_proxy::start(config).unwrap();
    proxy
        .set_config(hydrant_fault_proxy::ConfigUpdate::from_query("delay_ms=4000-4000").unwrap())
        .unwrap();
    let scratch = Scratch::new("limits-batch");
    let mut env = s3.env();
    env[0].1 = format!("http://{}", proxy.addr());
    let server = ServerProcess::start(
        scratch.path(),
        512,
        &["--bucket", "data=s3://limits-batch"],
        &env,
    );
    // 400 batches of 2,000 items each (as many as a 64 KiB extension holds), all of one cold
    // key whose origin answers after 4 s: the items wait, and none may become a task before it
    // can run.
    const ITEMS: u32 = 2000;
    const BATCHES: u64 = 400;
    let item = GetRequest {
        name: ObjectName {
            bucket: "data".into(),
            key: "small".into(),
        },
        range_start: 0,
        range_end: None,
    };
    let mut batch = hydrant_proto::codec::Writer::new();
    batch.u32(ITEMS);
    for _ in 0..ITEMS {
        item.encode_into(&mut batch);
    }
    let batch = batch.finish();
    let mut stream = server.greeted();
    let ((), growth) = common::rss_growth_during(&server, server.resident_bytes(), || {
        let mut frames = Vec::new();
        for id in 0..BATCHES {
            frames.extend(common::frame(Opcode::BatchGet, 100 + id, &batch, &[]));
        }
        stream.write_all(&frames).unwrap();
        std::thread::sleep(Duration::from_millis(3000));
    });
    eprintln!(
        "RSS growth with 800,000 batch items waiting: {} MiB",
        growth / MIB
    );
    assert!(
        growth < 256 * MIB,
        "800,000 waiting batch items grew the server by {} MiB",
        growth / MIB
    );
    // Every item is answered once the origin is.
    let mut answered = 0;
    while answered < BATCHES * ITEMS as u64 {
        let answer = receive(&mut stream);
        assert_eq!(answer.status(), Status::Ok, "{}", answer.message());
        answered += 1;
    }
}

#[test]
fn pipelined_gets_read_through_from_the_origin_reserve_room_before_they_read() {
    let scratch = Scratch::new("limits-through");
    let origin = scratch.path().join("origin/data");
    std::fs::create_dir_all(&origin).unwrap();
    let data = object_bytes(5, 128 << 20);
    std::fs::write(origin.join("large"), &data).unwrap();
    let server = ServerProcess::start(scratch.path(), 1024, &[], &[]);
    let get = GetRequest {
        name: ObjectName {
            bucket: "data".into(),
            key: "large".into(),
        },
        range_start: 0,
        range_end: None,
    };
    let mut stream = server.greeted();
    let ((), growth) = common::rss_growth_during(&server, server.resident_bytes(), || {
        for id in 0..8 {
            common::send(&mut stream, Opcode::Get, 10 + id, &get.encode(), &[]);
        }
        // Answers come in parts, possibly between each other's: gathered by request id.
        let mut partial: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        let mut answered = 0;
        while answered < 8 {
            let answer = receive(&mut stream);
            assert_eq!(answer.status(), Status::Ok, "{}", answer.message());
            let read = partial.entry(answer.header.request_id).or_default();
            read.extend_from_slice(&answer.payload);
            if !answer.header.flags.contains(FrameFlags::MORE) {
                assert!(partial.remove(&answer.header.request_id).unwrap() == data);
                answered += 1;
            }
        }
    });
    eprintln!(
        "RSS growth with 8 pipelined cold GETs of 128 MiB: {} MiB",
        growth / MIB
    );
    assert!(
        growth < 448 * MIB,
        "8 pipelined cold GETs of 128 MiB grew the server by {} MiB",
        growth / MIB
    );
}

#[test]
fn frames_before_hello_are_refused_before_their_bytes_are_held() {
    let scratch = Scratch::new("limits-hello");
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let payload = vec![7u8; 16 << 20];
    let frame = common::frame(Opcode::Ping, 5, &[], &payload);
    let ((), growth) = common::rss_growth_during(&server, server.resident_bytes(), || {
        let senders: Vec<_> = (0..24)
            .map(|_| {
                let mut stream = server.connect();
                let frame = frame.clone();
                std::thread::spawn(move || {
                    // The server may close before all of it is sent.
                    let _ = stream.write_all(&frame);
                    std::thread::sleep(Duration::from_millis(500));
                    let mut rest = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut stream, &mut rest);
                })
            })
            .collect();
        for sender in senders {
            sender.join().unwrap();
        }
    });
    eprintln!(
        "RSS growth with 24 connections sending 16 MiB before HELLO: {} MiB",
        growth / MIB
    );
    assert!(
        growth < 64 * MIB,
        "24 connections sending 16 MiB frames before HELLO grew the server by {} MiB",
        growth / MIB
    );
    // Frames refused for a bad payload checksum count among the 16 allowed before HELLO.
    let mut stream = server.connect();
    let mut bad = common::frame(Opcode::Ping, 6, &[], b"four");
    let last = bad.len() - 1;
    bad[last] ^= 1;
    for _ in 0..40 {
        if stream.write_all(&bad).is_err() {
            break;
        }
    }
    let mut answers = 0;
    let closed = loop {
        let mut header = [0u8; hydrant_proto::FRAME_HEADER_BYTES];
        match std::io::Read::read_exact(&mut stream, &mut header) {
            Ok(()) => {
                let header =
                    FrameHeader::decode(&header, &hydrant_proto::Limits::default()).unwrap();
                let mut rest =
                    vec![0u8; header.extension_len as usize + header.payload_len as usize];
                std::io::Read::read_exact(&mut stream, &mut rest).unwrap();
                answers += 1;
            }
            Err(_) => break true,
        }
    };
    assert!(
        closed && answers <= 16,
        "{answers} refusals before the close"
    );
    // A streamed PUT before HELLO: refused at its first frame, the connection closed.
    let mut stream = server.connect();
    let frames = streamed_put(8, "early", &object_bytes(4, 30_000), 10);
    let _ = stream.write_all(&frames.concat());
    let answer = receive(&mut stream);
    assert_eq!(answer.status(), Status::Unauthenticated);
    let mut probe = [0u8; 1];
    let closed = matches!(std::io::Read::read(&mut stream, &mut probe), Ok(0) | Err(_));
    assert!(
        closed,
        "a streamed request before HELLO closes the connection"
    );
}

#[test]
fn naming_buckets_creates_nothing_at_the_origin() {
    let scratch = Scratch::new("limits-routes");
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let mut client = server.client();
    for index in 0..3000 {
        let bucket = format!("b{index}");
        assert!(client.head(&bucket, "nothing").is_err());
        assert!(client.get(&bucket, "nothing", None).is_err());
    }
    let origin = scratch.path().join("origin");
    let created: Vec<_> = std::fs::read_dir(&origin)
        .map(|entries| entries.map(|entry| entry.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        created.is_empty(),
        "the origin folder holds {} entries",
        created.len()
    );
}

#[test]
fn a_streamed_put_larger_than_its_shard_holds_is_refused_as_too_large_and_leaves_nothing() {
    // One shard on 256 MiB: it holds at most half a region of one object.
    let scratch = Scratch::new("limits-too-large");
    let server = ServerProcess::start_shards(scratch.path(), 1, 256, &["--origin", "none"], &[]);
    let size = 200 << 20;
    let mut client = server.client();
    let mut source = common::Generated::new(5, size);
    let error = client
        .put_from("data", "huge", &mut source, size, None)
        .unwrap_err();
    match &error {
        hydrant_client::ClientError::Status { status, message } => {
            assert_eq!(*status, Status::TooLarge as u8, "{message}");
            assert!(message.contains("does not fit"), "{message}");
        }
        other => panic!("expected TOO_LARGE, got {other:?}"),
    }
    assert!(client.head("data", "huge").unwrap_err().is_not_found());
    assert_eq!(server.metric("hydrant_objects"), 0);
    // The connection and the shard go on.
    client.put("data", "small", b"fits").unwrap();
    assert_eq!(client.get("data", "small", None).unwrap().1, b"fits");
}

/// Send a streamed PUT's `frames` with the last payload byte of frame `damaged` changed after
/// its checksum was taken, and check that it is refused with CHECKSUM_MISMATCH.
fn put_damaged(stream: &mut std::net::TcpStream, mut frames: Vec<Vec<u8>>, damaged: usize) {
    let end = frames[damaged].len() - 1;
    frames[damaged][end] ^= 0x40;
    stream.write_all(&frames.concat()).unwrap();
    let answer = receive(stream);
    assert_eq!(
        answer.status(),
        Status::ChecksumMismatch,
        "{}",
        answer.message()
    );
}

/// A streamed PUT's stored checksums are computed in the pass that checks its frames': frames
/// of any size (checksum pieces and chunks cut by frame boundaries; bytes that came with a
/// frame's header and bytes received straight into a chunk) store exactly the bytes sent, and
/// a frame whose bytes do not match its checksum is refused with CHECKSUM_MISMATCH, leaving
/// the version before it.
#[test]
fn streamed_puts_in_frames_of_any_size_keep_their_bytes_and_a_damaged_frame_keeps_nothing() {
    let scratch = Scratch::new("limits-frames");
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let mut stream = server.greeted();
    let mut client = server.client();
    let mut get = |key: &str| client.get("data", key, None).expect("GET").1;
    // Three chunks and a short fourth, the last checksum piece short too.
    let data = object_bytes(5, (9 << 20) + 12_345);
    for (round, parts) in [2usize, 7, 97, 1001].into_iter().enumerate() {
        let key = format!("frames-{parts}");
        let frames = streamed_put(20 + round as u64, &key, &data, parts);
        if round % 2 == 0 {
            stream.write_all(&frames.concat()).unwrap();
        } else {
            // A frame at a time, a pause between: the server waits with nothing buffered.
            for frame in &frames {
                stream.write_all(frame).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let answer = receive(&mut stream);
        assert_eq!(
            answer.status(),
            Status::Ok,
            "{parts} frames: {}",
            answer.message()
        );
        assert!(
            get(&key) == data,
            "{parts} frames: the bytes sent are stored"
        );
    }
    // The same key again, a byte of the fourth frame's payload changed after its checksum.
    let frames = streamed_put(40, "frames-7", &object_bytes(6, data.len()), 7);
    put_damaged(&mut stream, frames, 3);
    assert!(
        get("frames-7") == data,
        "a PUT refused for a damaged frame leaves the version before it"
    );
}

/// A streamed PUT becomes visible only once every one of its frames is in and checked: a last
/// frame that carries more than the object's bytes, or whose bytes do not match its checksum,
/// is refused and leaves the version before it, even though it holds the object's last bytes.
#[test]
fn a_streamed_put_whose_last_frame_is_too_long_or_damaged_keeps_nothing() {
    let scratch = Scratch::new("limits-last-frame");
    let server = ServerProcess::start(scratch.path(), 512, &["--origin", "none"], &[]);
    let mut stream = server.greeted();
    let mut client = server.client();
    let before = object_bytes(7, 300_000);
    client
        .put("data", "last", &before)
        .expect("the first version");
    let announce = |object_bytes: u64| {
        PutRequest {
            name: ObjectName {
                bucket: "data".into(),
                key: "last".into(),
            },
            object_bytes,
        }
        .encode()
    };
    // Announced 100,000 bytes; 60,000 come, then 60,000 more in the last frame.
    let long = object_bytes(8, 120_000);
    let mut frames =
        common::frame_of_stream(Opcode::Put, 50, &announce(100_000), &long[..60_000], true);
    frames.extend(common::frame_of_stream(
        Opcode::Put,
        50,
        &[],
        &long[60_000..],
        false,
    ));
    stream.write_all(&frames).unwrap();
    let answer = receive(&mut stream);
    assert_eq!(answer.status(), Status::BadRequest, "{}", answer.message());
    // The last frame damaged after its checksum was taken.
    put_damaged(
        &mut stream,
        streamed_put(51, "last", &object_bytes(9, 200_000), 3),
        2,
    );
    let (_, stored) = client.get("data", "last", None).expect("GET");
    assert!(
        stored == before,
        "a refused PUT leaves the version before it"
    );
    // And the connection goes on: a good PUT on it is stored.
    let good = object_bytes(10, 200_000);
    stream
        .write_all(&streamed_put(52, "last", &good, 3).concat())
        .unwrap();
    assert_eq!(receive(&mut stream).status(), Status::Ok);
    assert!(client.get("data", "last", None).expect("GET").1 == good);
}
