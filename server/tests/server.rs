//! The real `hydrant-server` process on loopback, driven over TCP with frames built by
//! hydrant-proto: the operations built so far, pipelining, malformed input, and SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hydrant_proto::message::{
    GetRequest, HelloRequest, HelloResponse, Message, ObjectInfo, ObjectName, PutRequest,
};
use hydrant_proto::{FrameHeader, Limits, Opcode, Status, FRAME_HEADER_BYTES};

struct ServerProcess {
    child: Child,
    address: String,
    metrics_address: Option<String>,
    directory: PathBuf,
}

impl ServerProcess {
    fn start(name: &str) -> ServerProcess {
        ServerProcess::start_with(name, &[])
    }

    fn start_with(name: &str, extra: &[&str]) -> ServerProcess {
        let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        let data = format!("{}:512MiB", directory.join("data.hyd").display());
        let mut arguments = vec!["--listen", "127.0.0.1:0", "--shards", "2", "--data", &data];
        arguments.extend_from_slice(extra);
        let (child, line) = spawn_server(&arguments);
        let address = listening_address(&line);
        let metrics_address = line
            .split("metrics on http://")
            .nth(1)
            .map(|rest| rest.trim_end().trim_end_matches("/metrics").to_string());
        ServerProcess {
            child,
            address,
            metrics_address,
            directory,
        }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
    }
}

/// `hydrant-server` with `arguments`, and the first line it prints (where it listens).
fn spawn_server<S: AsRef<std::ffi::OsStr>>(arguments: &[S]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hydrant-server"))
        .args(arguments)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hydrant-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// The address in the server's first line: "hydrant-server listening on ADDRESS ...".
fn listening_address(line: &str) -> String {
    line.split_whitespace()
        .nth(3)
        .unwrap_or_else(|| panic!("the server prints where it listens, got {line:?}"))
        .to_string()
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

fn send(stream: &mut TcpStream, opcode: Opcode, request_id: u64, extension: &[u8], payload: &[u8]) {
    let crc = if payload.is_empty() {
        0
    } else {
        crc32c::crc32c(payload)
    };
    let header = FrameHeader::new(opcode, request_id, extension, payload.len() as u64, crc);
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(extension);
    frame.extend_from_slice(payload);
    stream.write_all(&frame).unwrap();
}

struct Response {
    header: FrameHeader,
    extension: Vec<u8>,
    payload: Vec<u8>,
}

fn receive(stream: &mut TcpStream) -> Response {
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header_bytes).unwrap();
    let limits = Limits {
        payload_bytes_max: 1 << 30,
        ..Limits::default()
    };
    let header = FrameHeader::decode(&header_bytes, &limits).expect("a valid response header");
    let mut extension = vec![0; header.extension_len as usize];
    stream.read_exact(&mut extension).unwrap();
    header.check_extension(&extension).unwrap();
    let mut payload = vec![0; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    header
        .check_payload_crc(if payload.is_empty() {
            0
        } else {
            crc32c::crc32c(&payload)
        })
        .unwrap();
    Response {
        header,
        extension,
        payload,
    }
}

fn status(response: &Response) -> Status {
    Status::from_byte(response.header.status).unwrap()
}

fn hello(stream: &mut TcpStream) -> HelloResponse {
    let request = HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: Limits::default(),
        client_nonce: [1; 16],
        proof: None,
    };
    send(stream, Opcode::Hello, 1, &request.encode(), &[]);
    let response = receive(stream);
    assert_eq!(status(&response), Status::Ok);
    HelloResponse::decode(&response.extension).unwrap()
}

fn name(key: &str) -> ObjectName {
    ObjectName {
        bucket: "data".into(),
        key: key.into(),
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| ((index as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251) as u8)
        .collect()
}

#[test]
fn operations_over_a_real_connection() {
    let server = ServerProcess::start("operations");
    let mut stream = server.connect();

    send(&mut stream, Opcode::Ping, 5, &[], &[]);
    let early = receive(&mut stream);
    assert_eq!(
        status(&early),
        Status::Unauthenticated,
        "nothing before HELLO"
    );
    assert_eq!(early.header.request_id, 5);

    let greeting = hello(&mut stream);
    assert_eq!(greeting.shard_count, 2);
    assert_eq!(greeting.version, 1);

    send(&mut stream, Opcode::Ping, 6, &[], &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);

    // Keys that land on both shards, so that half of them are forwarded between shards.
    for index in 0..20u64 {
        let data = pattern(index, 1000 + index as usize * 997);
        let put = PutRequest {
            name: name(&format!("k{index}")),
            object_bytes: data.len() as u64,
        };
        send(&mut stream, Opcode::Put, 100 + index, &put.encode(), &data);
        let response = receive(&mut stream);
        assert_eq!(
            status(&response),
            Status::Ok,
            "{}",
            String::from_utf8_lossy(&response.payload)
        );
        assert_eq!(
            ObjectInfo::decode(&response.extension)
                .unwrap()
                .object_bytes,
            data.len() as u64
        );
    }
    for index in 0..20u64 {
        let data = pattern(index, 1000 + index as usize * 997);
        let get = GetRequest {
            name: name(&format!("k{index}")),
            range_start: 0,
            range_end: None,
        };
        send(&mut stream, Opcode::Get, 200 + index, &get.encode(), &[]);
        let response = receive(&mut stream);
        assert_eq!(status(&response), Status::Ok);
        assert_eq!(response.header.request_id, 200 + index);
        assert!(response.payload == data, "k{index} reads back");
    }
    let range = GetRequest {
        name: name("k3"),
        range_start: 100,
        range_end: Some(150),
    };
    send(&mut stream, Opcode::Get, 300, &range.encode(), &[]);
    let response = receive(&mut stream);
    assert_eq!(response.payload, pattern(3, 1000 + 3 * 997)[100..150]);
    assert_eq!(
        ObjectInfo::decode(&response.extension).unwrap().range_start,
        100
    );

    send(&mut stream, Opcode::Head, 301, &name("k4").encode(), &[]);
    let head = receive(&mut stream);
    assert_eq!(
        ObjectInfo::decode(&head.extension).unwrap().object_bytes,
        1000 + 4 * 997
    );

    send(&mut stream, Opcode::Delete, 302, &name("k4").encode(), &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);
    send(&mut stream, Opcode::Delete, 303, &name("k4").encode(), &[]);
    assert_eq!(status(&receive(&mut stream)), Status::NotFound);
    let gone = GetRequest {
        name: name("k4"),
        range_start: 0,
        range_end: None,
    };
    send(&mut stream, Opcode::Get, 304, &gone.encode(), &[]);
    assert_eq!(status(&receive(&mut stream)), Status::NotFound);

    let mut bad_key = Vec::new();
    bad_key.extend_from_slice(&4u16.to_le_bytes());
    bad_key.extend_from_slice(b"data");
    bad_key.extend_from_slice(&0u16.to_le_bytes());
    send(&mut stream, Opcode::Head, 305, &bad_key, &[]);
    assert_eq!(
        status(&receive(&mut stream)),
        Status::InvalidKey,
        "an empty key"
    );
}

#[test]
fn pipelined_requests_are_all_answered() {
    let server = ServerProcess::start("pipelined");
    let mut stream = server.connect();
    hello(&mut stream);
    let count = 500u64;
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for index in 0..count {
            let data = pattern(index, 4096);
            let put = PutRequest {
                name: name(&format!("p{index}")),
                object_bytes: data.len() as u64,
            };
            send(&mut writer, Opcode::Put, index, &put.encode(), &data);
        }
    });
    let mut answered = std::collections::HashSet::new();
    for _ in 0..count {
        let response = receive(&mut stream);
        assert_eq!(status(&response), Status::Ok);
        assert!(
            answered.insert(response.header.request_id),
            "one answer per request"
        );
    }
    sender.join().unwrap();
    assert_eq!(answered.len(), count as usize);
}

/// The frames of `requests` (opcode, request id, extension, payload), one after another.
fn frames(requests: &[(Opcode, u64, Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (opcode, request_id, extension, payload) in requests {
        let crc = if payload.is_empty() {
            0
        } else {
            crc32c::crc32c(payload)
        };
        let header = FrameHeader::new(*opcode, *request_id, extension, payload.len() as u64, crc);
        bytes.extend_from_slice(&header.encode());
        bytes.extend_from_slice(extension);
        bytes.extend_from_slice(payload);
    }
    bytes
}

/// Write `bytes` in pieces of the given sizes (cycled), pausing between them so that they
/// arrive apart.
fn write_in_pieces(stream: &mut TcpStream, bytes: &[u8], sizes: &[usize]) {
    let mut offset = 0;
    for size in sizes.iter().cycle() {
        if offset == bytes.len() {
            return;
        }
        let end = (offset + size).min(bytes.len());
        stream.write_all(&bytes[offset..end]).unwrap();
        stream.flush().unwrap();
        offset = end;
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn frames_split_anywhere_or_packed_together_are_read_alike() {
    let server = ServerProcess::start("split-frames");
    // A small object, one larger than the server's receive buffer (so that it grows while a
    // frame before it is still buffered), and a small one behind it.
    let objects = [
        ("s1", pattern(1, 100)),
        ("large", pattern(2, 300 * 1024 + 1)),
        ("s2", pattern(3, 5)),
    ];
    for (round, sizes) in [&[][..], &[1, 47, 3, 4096, 65_537, 300_000][..]]
        .into_iter()
        .enumerate()
    {
        let mut stream = server.connect();
        stream.set_nodelay(true).unwrap();
        hello(&mut stream);
        let write = |stream: &mut TcpStream, bytes: &[u8]| {
            if sizes.is_empty() {
                stream.write_all(bytes).unwrap();
            } else {
                write_in_pieces(stream, bytes, sizes);
            }
        };
        let base = 100 * (round as u64 + 1);
        let puts: Vec<_> = objects
            .iter()
            .enumerate()
            .map(|(index, (key, data))| {
                let put = PutRequest {
                    name: name(&format!("{key}-{round}")),
                    object_bytes: data.len() as u64,
                };
                (Opcode::Put, base + index as u64, put.encode(), data.clone())
            })
            .collect();
        write(&mut stream, &frames(&puts));
        for _ in &objects {
            let response = receive(&mut stream);
            assert_eq!(status(&response), Status::Ok, "round {round}: put answered");
        }
        let gets: Vec<_> = objects
            .iter()
            .enumerate()
            .map(|(index, (key, _))| {
                let get = GetRequest {
                    name: name(&format!("{key}-{round}")),
                    range_start: 0,
                    range_end: None,
                };
                (
                    Opcode::Get,
                    base + 10 + index as u64,
                    get.encode(),
                    Vec::new(),
                )
            })
            .collect();
        write(&mut stream, &frames(&gets));
        let mut answers = std::collections::HashMap::new();
        for _ in &objects {
            let response = receive(&mut stream);
            assert_eq!(status(&response), Status::Ok, "round {round}: get answered");
            answers.insert(response.header.request_id, response.payload);
        }
        for (index, (key, data)) in objects.iter().enumerate() {
            assert!(
                answers.get(&(base + 10 + index as u64)) == Some(data),
                "round {round}: {key} read back as written"
            );
        }
        // Many small frames at once: one straddles the end of the receive buffer, whose
        // bytes move to its front to make room.
        let pings: Vec<_> = (0..200)
            .map(|index| (Opcode::Ping, base + 1000 + index, Vec::new(), Vec::new()))
            .collect();
        write(&mut stream, &frames(&pings));
        let mut answered = std::collections::HashSet::new();
        for _ in &pings {
            let response = receive(&mut stream);
            assert_eq!(
                status(&response),
                Status::Ok,
                "round {round}: ping answered"
            );
            answered.insert(response.header.request_id);
        }
        assert_eq!(
            answered.len(),
            pings.len(),
            "round {round}: every ping answered"
        );
    }
}

#[test]
fn a_frame_announced_is_not_allocated_before_its_bytes_arrive() {
    let server = ServerProcess::start("announced");
    let pid = server.child.id();
    // Let the server settle (its shard threads and first buffers) before measuring.
    let mut probe = server.connect();
    hello(&mut probe);
    let before = status_bytes(pid, "VmSize:");
    // Connections that announce the largest payload the limits allow and send 1 KiB of it.
    let connections = 100u64;
    let announced = Limits::default().payload_bytes_max;
    let mut streams = Vec::new();
    for index in 0..connections {
        let mut stream = server.connect();
        let header = FrameHeader::new(Opcode::Put, index, &[], announced, 0);
        stream.write_all(&header.encode()).unwrap();
        stream.write_all(&[7u8; 1024]).unwrap();
        streams.push(stream);
    }
    // The server has read them all once a request behind them on a new connection is answered
    // and a moment has passed.
    let mut last = server.connect();
    hello(&mut last);
    std::thread::sleep(Duration::from_millis(500));
    let after = status_bytes(pid, "VmSize:");
    let grown = after.saturating_sub(before);
    assert!(
        grown < connections * announced / 4,
        "{connections} connections announcing {announced} bytes each grew the server by {grown} \
         bytes of address space"
    );
    send(&mut last, Opcode::Ping, 1, &[], &[]);
    assert_eq!(status(&receive(&mut last)), Status::Ok, "still serving");
}

#[test]
fn malformed_frames_get_a_status_or_a_clean_close() {
    let server = ServerProcess::start("malformed");

    // An unknown opcode with a valid checksum: UNSUPPORTED, and the connection goes on.
    let mut stream = server.connect();
    hello(&mut stream);
    let mut header = FrameHeader::new(Opcode::Ping, 9, &[], 0, 0).encode();
    header[6] = 200;
    let crc = crc32c::crc32c(&header[..44]);
    header[44..].copy_from_slice(&crc.to_le_bytes());
    stream.write_all(&header).unwrap();
    let response = receive(&mut stream);
    assert_eq!(status(&response), Status::Unsupported);
    assert_eq!(response.header.request_id, 9);
    send(&mut stream, Opcode::Ping, 10, &[], &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Ok, "still serving");

    // A payload checksum mismatch: CHECKSUM_MISMATCH, nothing stored, the connection goes on.
    let put = PutRequest {
        name: name("bad-crc"),
        object_bytes: 4,
    };
    let mut frame_header = FrameHeader::new(Opcode::Put, 11, &put.encode(), 4, 12345);
    frame_header.shard = 0xffff;
    let mut frame = frame_header.encode().to_vec();
    frame.extend_from_slice(&put.encode());
    frame.extend_from_slice(b"data");
    stream.write_all(&frame).unwrap();
    assert_eq!(status(&receive(&mut stream)), Status::ChecksumMismatch);
    send(
        &mut stream,
        Opcode::Head,
        12,
        &name("bad-crc").encode(),
        &[],
    );
    assert_eq!(status(&receive(&mut stream)), Status::NotFound);

    // A payload above the limit: TOO_LARGE, then the connection closes.
    let huge = FrameHeader::new(Opcode::Put, 13, &[], 1 << 40, 0);
    stream.write_all(&huge.encode()).unwrap();
    assert_eq!(status(&receive(&mut stream)), Status::TooLarge);
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).unwrap(), 0, "closed");

    // A reserved flag with a huge announced payload: the length is checked first, and the
    // connection closes instead of the server reading (and keeping) what was announced.
    let mut greedy = server.connect();
    hello(&mut greedy);
    let mut bytes = FrameHeader::new(Opcode::Ping, 17, &[], 0, 0).encode();
    bytes[5] = 0x80;
    bytes[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..44]);
    bytes[44..].copy_from_slice(&crc.to_le_bytes());
    greedy.write_all(&bytes).unwrap();
    assert_eq!(status(&receive(&mut greedy)), Status::TooLarge);
    let mut rest = Vec::new();
    assert_eq!(greedy.read_to_end(&mut rest).unwrap(), 0, "closed");

    // Bad magic and a flipped header byte: the connection closes.
    for corrupt in [0usize, 20] {
        let mut stream = server.connect();
        hello(&mut stream);
        let mut bytes = FrameHeader::new(Opcode::Ping, 14, &[], 0, 0).encode();
        bytes[corrupt] ^= 0x55;
        stream.write_all(&bytes).unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            stream.read_to_end(&mut rest).unwrap(),
            0,
            "closed after byte {corrupt} was flipped"
        );
    }

    // A truncated frame followed by the client going away: the server keeps serving others.
    let mut truncated = server.connect();
    truncated
        .write_all(&FrameHeader::new(Opcode::Ping, 15, &[], 0, 0).encode()[..20])
        .unwrap();
    drop(truncated);
    let mut other = server.connect();
    hello(&mut other);
    send(&mut other, Opcode::Ping, 16, &[], &[]);
    assert_eq!(status(&receive(&mut other)), Status::Ok);
}

#[test]
fn sigterm_stops_the_server_with_status_zero_and_data_survives() {
    let mut server = ServerProcess::start("sigterm");
    {
        let mut stream = server.connect();
        hello(&mut stream);
        let put = PutRequest {
            name: name("durable"),
            object_bytes: 5,
        };
        send(&mut stream, Opcode::Put, 1, &put.encode(), b"hello");
        assert_eq!(status(&receive(&mut stream)), Status::Ok);
    }
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");

    let data = server.directory.join("data.hyd");
    let (child, line) = spawn_server(&[
        std::ffi::OsStr::new("--listen"),
        "127.0.0.1:0".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
    ]);
    server.child = child;
    server.address = listening_address(&line);
    let mut stream = server.connect();
    hello(&mut stream);
    let get = GetRequest {
        name: name("durable"),
        range_start: 0,
        range_end: None,
    };
    send(&mut stream, Opcode::Get, 2, &get.encode(), &[]);
    assert_eq!(receive(&mut stream).payload, b"hello");
}

fn resident_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// A size line of /proc/PID/status (`VmRSS:`, `VmSize:`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with(field)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn ten_thousand_idle_connections_cost_little_and_do_not_stop_service() {
    // SAFETY: setrlimit on this process with a struct we own.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    let server = ServerProcess::start("idle");
    let mut first = server.connect();
    hello(&mut first);
    let before = resident_bytes(server.child.id());
    let idle: Vec<TcpStream> = (0..10_000)
        .map(|_| TcpStream::connect(&server.address).unwrap())
        .collect();
    // Every idle connection has been accepted once a new one is served after them.
    let mut probe = server.connect();
    hello(&mut probe);
    send(&mut probe, Opcode::Ping, 2, &[], &[]);
    assert_eq!(status(&receive(&mut probe)), Status::Ok);
    std::thread::sleep(Duration::from_millis(200));
    let after = resident_bytes(server.child.id());
    let per_connection = after.saturating_sub(before) / idle.len() as u64;
    eprintln!(
        "{} idle connections: {} bytes resident each",
        idle.len(),
        per_connection
    );
    assert!(
        per_connection < 16 * 1024,
        "{per_connection} bytes per idle connection"
    );
    drop(idle);
    send(&mut first, Opcode::Ping, 3, &[], &[]);
    assert_eq!(
        status(&receive(&mut first)),
        Status::Ok,
        "the first connection still works"
    );
}

#[test]
fn a_token_is_proven_without_crossing_the_wire() {
    let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("token-file-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let token_file = directory.join("token");
    std::fs::write(&token_file, "correct horse battery staple\n").unwrap();
    let server =
        ServerProcess::start_with("token", &["--token-file", token_file.to_str().unwrap()]);
    let hello_request = |proof| HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: Limits::default(),
        client_nonce: [4; 16],
        proof,
    };

    // Without a proof: HELLO says a token is needed, and nothing else is served.
    let mut stream = server.connect();
    send(
        &mut stream,
        Opcode::Hello,
        1,
        &hello_request(None).encode(),
        &[],
    );
    let answer = receive(&mut stream);
    assert_eq!(status(&answer), Status::Ok);
    let greeting = HelloResponse::decode(&answer.extension).unwrap();
    assert!(greeting.auth_required);
    send(&mut stream, Opcode::Ping, 2, &[], &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Unauthenticated);

    // A proof made with the right token opens the connection.
    let proof = hydrant_proto::auth::proof(
        b"correct horse battery staple",
        &greeting.server_nonce,
        &[4; 16],
    );
    send(
        &mut stream,
        Opcode::Hello,
        3,
        &hello_request(Some(proof)).encode(),
        &[],
    );
    let answer = receive(&mut stream);
    assert_eq!(status(&answer), Status::Ok);
    assert!(
        !HelloResponse::decode(&answer.extension)
            .unwrap()
            .auth_required
    );
    send(&mut stream, Opcode::Ping, 4, &[], &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);

    // A wrong token: UNAUTHENTICATED and the connection closes.
    let mut intruder = server.connect();
    send(
        &mut intruder,
        Opcode::Hello,
        1,
        &hello_request(None).encode(),
        &[],
    );
    let greeting = HelloResponse::decode(&receive(&mut intruder).extension).unwrap();
    let wrong =
        hydrant_proto::auth::proof(b"not the token at all!", &greeting.server_nonce, &[4; 16]);
    send(
        &mut intruder,
        Opcode::Hello,
        2,
        &hello_request(Some(wrong)).encode(),
        &[],
    );
    assert_eq!(status(&receive(&mut intruder)), Status::Unauthenticated);
    let mut rest = Vec::new();
    assert_eq!(
        intruder.read_to_end(&mut rest).unwrap(),
        0,
        "closed after a wrong proof"
    );
    // A proof replayed on a new connection (new server nonce) fails too.
    let mut replay = server.connect();
    send(
        &mut replay,
        Opcode::Hello,
        1,
        &hello_request(Some(proof)).encode(),
        &[],
    );
    assert_eq!(status(&receive(&mut replay)), Status::Unauthenticated);
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn metrics_over_http_and_stats_count_what_was_done() {
    let server = ServerProcess::start_with("metrics", &["--metrics", "127.0.0.1:0"]);
    let mut stream = server.connect();
    hello(&mut stream);
    for index in 0..5u64 {
        let put = PutRequest {
            name: name(&format!("m{index}")),
            object_bytes: 3,
        };
        send(&mut stream, Opcode::Put, 10 + index, &put.encode(), b"abc");
        assert_eq!(status(&receive(&mut stream)), Status::Ok);
    }
    let get = GetRequest {
        name: name("m1"),
        range_start: 0,
        range_end: None,
    };
    send(&mut stream, Opcode::Get, 20, &get.encode(), &[]);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);

    send(&mut stream, Opcode::Stats, 21, &[], &[]);
    let stats = receive(&mut stream);
    assert_eq!(status(&stats), Status::Ok);
    let text = String::from_utf8(stats.payload).unwrap();
    let total = |text: &str, prefix: &str| -> u64 {
        text.lines()
            .filter(|line| line.starts_with(prefix))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(total(&text, "hydrant_objects{"), 5);
    assert_eq!(total(&text, "hydrant_engine_puts_total{"), 5);
    // Five objects of 3 bytes: 15 bytes stored, each in a header block and a data block (and
    // the log holds the markers that say which are at the origin).
    assert_eq!(total(&text, "hydrant_device_written_bytes_total{"), 15);
    let log_bytes = total(&text, "hydrant_log_bytes_total{");
    assert!(log_bytes >= 5 * 8192, "{log_bytes}");
    assert_eq!(
        total(
            &text,
            "hydrant_requests_total{shard=\"0\",operation=\"Put\"}"
        ) + total(
            &text,
            "hydrant_requests_total{shard=\"1\",operation=\"Put\"}"
        ),
        5
    );
    assert!(
        text.contains("hydrant_request_duration_seconds_count{operation=\"Get\"} 1"),
        "{text}"
    );

    // The same over HTTP, from the address the server printed.
    let mut output = String::new();
    let metrics_address = server
        .metrics_address
        .clone()
        .expect("metrics address printed");
    let mut http = TcpStream::connect(&metrics_address).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    http.read_to_string(&mut output).unwrap();
    assert!(output.starts_with("HTTP/1.1 200 OK"), "{output}");
    assert_eq!(total(&output, "hydrant_objects{"), 5);
}

#[test]
fn a_thousand_requests_in_flight_are_answered_out_of_order() {
    let server = ServerProcess::start("out-of-order");
    let mut stream = server.connect();
    hello(&mut stream);
    let big = pattern(1, 8 << 20);
    let put = PutRequest {
        name: name("big"),
        object_bytes: big.len() as u64,
    };
    send(&mut stream, Opcode::Put, 1, &put.encode(), &big);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);
    // Alternate reads of an 8 MiB object with PINGs, 1,000 requests written before any answer
    // is read: the PINGs overtake the reads.
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let get = GetRequest {
            name: name("big"),
            range_start: 0,
            range_end: None,
        };
        for index in 0..1000u64 {
            if index % 50 == 0 {
                send(&mut writer, Opcode::Get, 1000 + index, &get.encode(), &[]);
            } else {
                send(&mut writer, Opcode::Ping, 1000 + index, &[], &[]);
            }
        }
    });
    let mut order = Vec::new();
    // A GET's answer comes in parts (a chunk's range each), other answers between them.
    let mut partial: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    while order.len() < 1000 {
        let response = receive(&mut stream);
        assert_eq!(status(&response), Status::Ok);
        let id = response.header.request_id;
        if response.header.opcode == Opcode::Get {
            let gathered = partial.entry(id).or_default();
            gathered.extend_from_slice(&response.payload);
            if response
                .header
                .flags
                .contains(hydrant_proto::FrameFlags::MORE)
            {
                continue;
            }
            assert!(partial.remove(&id).unwrap() == big);
        }
        order.push(id);
    }
    sender.join().unwrap();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1000..2000).collect::<Vec<u64>>(),
        "every request answered once"
    );
    assert_ne!(order, sorted, "answers came back out of order");
}

#[test]
fn a_connection_that_never_says_hello_is_closed() {
    let server = ServerProcess::start("hello-deadline");
    let mut silent = server.connect();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    assert_eq!(
        silent.read_to_end(&mut rest).unwrap(),
        0,
        "closed by the server"
    );
    assert!(
        started.elapsed() < Duration::from_secs(19),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_config_file_sets_what_flags_do_not() {
    let directory =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let config = directory.join("hydrant.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata = [\"{}:512MiB\"]\nshards = 1\nmetrics = \"127.0.0.1:0\"\nio_bytes_in_flight = \"4MiB\"\n",
            directory.join("data.hyd").display()
        ),
    )
    .unwrap();
    // The flag wins over the file's shard count.
    let (mut child, line) = spawn_server(&["--config", config.to_str().unwrap(), "--shards", "2"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("with 2 shards"), "{line}");
    assert!(line.contains("metrics on http://127.0.0.1:"), "{line}");

    // A bound on device bytes in flight outside 4 KiB-1 GiB is refused before anything starts.
    let output = Command::new(env!("CARGO_BIN_EXE_hydrant-server"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--io-bytes-in-flight",
            "1KiB",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--io-bytes-in-flight must be 4KiB-1GiB, not 1024"),
        "{stderr}"
    );

    // A size with a unit hydrant does not know is refused with the flag and the text named.
    let output = Command::new(env!("CARGO_BIN_EXE_hydrant-server"))
        .args(["--config", config.to_str().unwrap(), "--dram-bytes", "12XB"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--dram-bytes") && stderr.contains("\"12XB\""),
        "{stderr}"
    );

    // Receive buffers that are not a power of two are refused too.
    let output = Command::new(env!("CARGO_BIN_EXE_hydrant-server"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--receive-buffers",
            "300",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--receive-buffers must be 0 or a power of two up to 32768, not 300"),
        "{stderr}"
    );

    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nshard_count = 3\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_hydrant-server"))
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("shard_count"),
        "an unknown key is named: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn a_greeted_connection_that_goes_quiet_is_closed_while_an_active_one_is_served() {
    let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idle-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let config = directory.join("hydrant.toml");
    std::fs::write(&config, "idle_timeout = \"1s\"\n").unwrap();
    let server = ServerProcess::start_with("idle-timeout", &["--config", config.to_str().unwrap()]);
    let mut quiet = server.connect();
    hello(&mut quiet);
    let greeted = std::time::Instant::now();
    let quiet_reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let read = quiet.read_to_end(&mut rest);
        (read.map_err(|error| error.to_string()), greeted.elapsed())
    });
    // The active connection asks something every 200 ms for three times the timeout.
    let mut active = server.connect();
    hello(&mut active);
    for request_id in 2..17 {
        send(&mut active, Opcode::Ping, request_id, &[], &[]);
        let answer = receive(&mut active);
        assert_eq!(status(&answer), Status::Ok);
        assert_eq!(answer.header.request_id, request_id);
        std::thread::sleep(Duration::from_millis(200));
    }
    let (read, quiet_for) = quiet_reader.join().unwrap();
    assert_eq!(read, Ok(0), "the quiet connection was closed cleanly");
    assert!(
        quiet_for >= Duration::from_millis(900),
        "closed after {quiet_for:?}, before its timeout"
    );
    send(&mut active, Opcode::Ping, 99, &[], &[]);
    assert_eq!(
        status(&receive(&mut active)),
        Status::Ok,
        "the active connection outlived the quiet one"
    );
    send(&mut active, Opcode::Stats, 100, &[], &[]);
    let metrics = String::from_utf8(receive(&mut active).payload).unwrap();
    let timed_out: u64 = metrics
        .lines()
        .filter(|line| line.starts_with("hydrant_connections_timed_out_total{"))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(timed_out, 1, "one connection timed out:\n{metrics}");
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn pipelined_large_gets_to_a_slow_reader_hold_bounded_memory() {
    // About the largest object a shard of the test's 512 MiB data file takes.
    const OBJECT_BYTES: usize = 30 << 20;
    const GETS: u64 = 64;
    let server = ServerProcess::start("large-gets");
    let object = pattern(64, OBJECT_BYTES);
    let mut client = hydrant_client::Client::connect(
        std::slice::from_ref(&server.address),
        Duration::from_secs(60),
    )
    .unwrap();
    client.put("data", "large", &object).unwrap();
    drop(client);
    let pid = server.child.id();
    let before = resident_bytes(pid);

    let mut stream = server.connect();
    hello(&mut stream);
    let get = GetRequest {
        name: name("large"),
        range_start: 0,
        range_end: None,
    };
    let mut requests = Vec::new();
    for request_id in 100..100 + GETS {
        let header = FrameHeader::new(Opcode::Get, request_id, &get.encode(), 0, 0);
        requests.extend_from_slice(&header.encode());
        requests.extend_from_slice(&get.encode());
    }
    stream.write_all(&requests).unwrap();

    // Read slowly: a frame at a time with a pause, noting the server's memory as it goes.
    let mut peak = before;
    let mut answered = Vec::new();
    // Answers come in parts, possibly between each other's: gathered by request id.
    let mut partial: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let mut frames = 0u64;
    while (answered.len() as u64) < GETS {
        let frame = receive(&mut stream);
        assert_eq!(status(&frame), Status::Ok);
        let answer = partial.entry(frame.header.request_id).or_default();
        if answer.is_empty() {
            let info = ObjectInfo::decode(&frame.extension).unwrap();
            assert_eq!(info.object_bytes, OBJECT_BYTES as u64);
        }
        answer.extend_from_slice(&frame.payload);
        frames += 1;
        if frames.is_multiple_of(2) {
            std::thread::sleep(Duration::from_millis(20));
            peak = peak.max(resident_bytes(pid));
        }
        if !frame.header.flags.contains(hydrant_proto::FrameFlags::MORE) {
            let answer = partial.remove(&frame.header.request_id).unwrap();
            assert!(
                answer == object,
                "answer {} differs",
                frame.header.request_id
            );
            answered.push(frame.header.request_id);
        }
    }
    answered.sort_unstable();
    assert_eq!(answered, (100..100 + GETS).collect::<Vec<u64>>());
    let grown = peak.saturating_sub(before);
    eprintln!(
        "{GETS} pipelined GETs of {} MiB: the server grew by at most {} MiB",
        OBJECT_BYTES >> 20,
        grown >> 20
    );
    // Unbounded, the server would hold every answer at once: 2 GiB, and more for copies.
    assert!(
        grown < 512 << 20,
        "the server grew by {} MiB while answering",
        grown >> 20
    );
}

/// The server's metric `name` summed over its label sets, through the client's STATS.
fn metric_total(client: &mut hydrant_client::Client, name: &str) -> u64 {
    let stats = client.stats().unwrap();
    stats[0]
        .1
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The shard-aware path: HELLO tells each shard's own port, the client sends each key's requests
/// there (single requests, pipelines and batches, blocking and async alike), and no request is
/// forwarded between the server's shards; a server started with --no-shard-ports offers none,
/// and the same requests then cross shards about half the time.
#[test]
fn shard_aware_clients_skip_the_hop_between_shards() {
    let keys: Vec<String> = (0..64).map(|index| format!("key-{index}")).collect();
    let mut forwarded = Vec::new();
    for extra in [&[][..], &["--no-shard-ports"][..]] {
        let server = ServerProcess::start_with("shard-aware", extra);
        let mut stream = server.connect();
        let greeting = hello(&mut stream);
        assert_eq!(greeting.shard_count, 2);
        assert_eq!(
            greeting.shard_ports.len(),
            if extra.is_empty() { 2 } else { 0 }
        );
        let mut client = hydrant_client::Client::connect(
            std::slice::from_ref(&server.address),
            Duration::from_secs(20),
        )
        .unwrap();
        let before = metric_total(&mut client, "hydrant_requests_forwarded_total");
        for (index, key) in keys.iter().enumerate() {
            let value = vec![index as u8; 1000 + index];
            client.put("b", key, &value).unwrap();
            assert_eq!(client.get("b", key, None).unwrap().1, value);
            assert_eq!(
                client.head("b", key).unwrap().object_bytes,
                value.len() as u64
            );
        }
        // A pipeline: each shard's requests on that shard's own connection.
        let mut pipeline = client.pipeline();
        let positions: Vec<(usize, usize)> = keys
            .iter()
            .map(|key| (pipeline.get("b", key, None), pipeline.head("b", key)))
            .collect();
        let results = pipeline.run().unwrap();
        for (index, (get, head)) in positions.into_iter().enumerate() {
            let expected = vec![index as u8; 1000 + index];
            assert_eq!(results[get].as_ref().unwrap().1, expected);
            assert_eq!(
                results[head].as_ref().unwrap().0.object_bytes,
                expected.len() as u64
            );
        }
        // A batch: each shard's items in a batch on that shard's own connection.
        let items: Vec<hydrant_client::GetItem> = keys
            .iter()
            .map(|key| hydrant_client::GetItem {
                bucket: "b".into(),
                key: key.clone(),
                range: None,
            })
            .collect();
        let answers = client.batch_get(&items, true).unwrap();
        for (index, answer) in answers.iter().enumerate() {
            assert_eq!(answer.as_ref().unwrap().1, vec![index as u8; 1000 + index]);
        }
        // The async client's single-key calls.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let config = hydrant_client::ClientConfig::new(std::slice::from_ref(&server.address));
            let client = hydrant_client::AsyncClient::connect(config).await.unwrap();
            for (index, key) in keys.iter().enumerate() {
                let expected = vec![index as u8; 1000 + index];
                assert_eq!(client.get("b", key, None).await.unwrap().1, expected);
                assert_eq!(
                    client.head("b", key).await.unwrap().object_bytes,
                    expected.len() as u64
                );
            }
        });
        forwarded.push(metric_total(&mut client, "hydrant_requests_forwarded_total") - before);
    }
    assert_eq!(forwarded[0], 0, "every request reached its own shard");
    assert!(
        forwarded[1] >= 6 * 16,
        "without shard ports about half of 512 requests cross shards: {}",
        forwarded[1]
    );
}

/// GETs of objects the DRAM tier holds are answered where they arrive, without a task (the
/// shard-aware client brings every key to its own shard): the bytes, ranges and versions are
/// those stored, a new version is never answered with the old bytes, a deleted object is not
/// found, and every such GET is counted (requests, DRAM hits, latency).
#[test]
fn gets_answered_from_the_dram_tier_are_the_stored_bytes_of_the_current_version() {
    let server = ServerProcess::start("dram-answers");
    let mut client = hydrant_client::Client::connect(
        std::slice::from_ref(&server.address),
        Duration::from_secs(20),
    )
    .unwrap();
    let keys: Vec<String> = (0..40).map(|index| format!("hot-{index}")).collect();
    let values: Vec<Vec<u8>> = (0..40)
        .map(|index| pattern(index, 3000 + index as usize * 7))
        .collect();
    for (key, value) in keys.iter().zip(&values) {
        client.put("b", key, value).unwrap();
        // The first read fills the DRAM tier.
        assert_eq!(&client.get("b", key, None).unwrap().1, value);
    }
    let hits_before = metric_total(&mut client, "hydrant_dram_hits_total");
    let gets_before = metric_total(&mut client, "hydrant_request_duration_seconds_count");
    let on_arrival_before = metric_total(&mut client, "hydrant_requests_answered_on_arrival_total");
    let mut gets = 0;
    for _ in 0..3 {
        for (key, value) in keys.iter().zip(&values) {
            let (info, bytes) = client.get("b", key, None).unwrap();
            assert_eq!(&bytes, value);
            assert_eq!(info.object_bytes, value.len() as u64);
            let (info, bytes) = client.get("b", key, Some((100, Some(1100)))).unwrap();
            assert_eq!(bytes, value[100..1100]);
            assert_eq!(info.range_start, 100);
            let (_, bytes) = client.get("b", key, Some((2990, None))).unwrap();
            assert_eq!(bytes, value[2990..]);
            gets += 3;
        }
    }
    assert!(
        metric_total(&mut client, "hydrant_dram_hits_total") - hits_before >= gets,
        "every read was a DRAM hit"
    );
    assert_eq!(
        metric_total(&mut client, "hydrant_request_duration_seconds_count") - gets_before,
        gets,
        "every GET is counted once"
    );
    assert_eq!(
        metric_total(&mut client, "hydrant_requests_answered_on_arrival_total") - on_arrival_before,
        gets,
        "every hit of the shard's own key is answered where it arrived"
    );
    // A range past the end is refused, from memory as from NVMe.
    let error = client
        .get("b", &keys[0], Some((1 << 20, None)))
        .unwrap_err();
    assert!(error.to_string().contains("range"), "{error}");
    // A new version: its bytes, never the old copy's.
    for (index, key) in keys.iter().enumerate().step_by(3) {
        let newer = pattern(1000 + index as u64, 2000);
        let written = client.put("b", key, &newer).unwrap();
        let (info, bytes) = client.get("b", key, None).unwrap();
        assert_eq!(bytes, newer);
        assert_eq!(info.seq, written.seq);
        assert_eq!(client.get("b", key, None).unwrap().1, newer);
    }
    client.delete("b", &keys[1]).unwrap();
    assert!(client.get("b", &keys[1], None).is_err());
}

/// The sum over shards of the metric lines starting with `prefix`, from STATS on a new
/// connection.
fn stat_total(server: &ServerProcess, prefix: &str) -> u64 {
    let mut stream = server.connect();
    hello(&mut stream);
    send(&mut stream, Opcode::Stats, 1, &[], &[]);
    let stats = receive(&mut stream);
    assert_eq!(status(&stats), Status::Ok);
    String::from_utf8(stats.payload)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with(prefix))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Wait (up to 20 s) until `condition` holds.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn connections_go_on_when_the_shared_receive_buffers_run_short_or_are_off() {
    // Two provided buffers per shard for eight busy connections, and none at all.
    for buffers in ["2", "0"] {
        let server = ServerProcess::start_with(
            &format!("receive-buffers-{buffers}"),
            &["--receive-buffers", buffers],
        );
        let address = server.address.clone();
        let clients: Vec<_> = (0..8u64)
            .map(|client| {
                let address = address.clone();
                std::thread::spawn(move || {
                    let mut stream = TcpStream::connect(&address).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(20)))
                        .unwrap();
                    hello(&mut stream);
                    for (round, size) in [1usize, 3000, 9000, 70_000, 200_000].iter().enumerate() {
                        let data = pattern(client * 10 + round as u64, *size);
                        let key = format!("c{client}-{round}");
                        let put = PutRequest {
                            name: name(&key),
                            object_bytes: data.len() as u64,
                        };
                        // The PUT with 400 PINGs (19 KiB of frames, more than the provided
                        // buffers hold at once) in one write; once it is answered, 400 PINGs
                        // and 4 GETs of the object.
                        let get = GetRequest {
                            name: name(&key),
                            range_start: 0,
                            range_end: None,
                        };
                        let pings = |base: u64| {
                            (0..400).map(move |index| (Opcode::Ping, base + index, vec![], vec![]))
                        };
                        let mut put_requests = vec![(Opcode::Put, 1, put.encode(), data.clone())];
                        put_requests.extend(pings(10));
                        let mut get_requests: Vec<_> = pings(1000).collect();
                        get_requests.extend(
                            (0..4).map(|index| (Opcode::Get, 2000 + index, get.encode(), vec![])),
                        );
                        for requests in [put_requests, get_requests] {
                            stream.write_all(&frames(&requests)).unwrap();
                            let mut answered = std::collections::HashSet::new();
                            for _ in &requests {
                                let response = receive(&mut stream);
                                assert_eq!(status(&response), Status::Ok, "{key}");
                                if response.header.opcode == Opcode::Get {
                                    assert!(response.payload == data, "{key} read back");
                                }
                                answered.insert(response.header.request_id);
                            }
                            assert_eq!(answered.len(), requests.len(), "{key}: all answered");
                        }
                    }
                })
            })
            .collect();
        for client in clients {
            client.join().unwrap();
        }
        let shortages = stat_total(&server, "hydrant_receive_buffer_shortages_total{");
        if buffers == "0" {
            assert_eq!(stat_total(&server, "hydrant_receive_streams_total{"), 0);
            assert_eq!(shortages, 0);
        } else {
            assert!(stat_total(&server, "hydrant_receive_streams_total{") > 0);
            assert!(shortages > 0, "two buffers per shard ran short");
            // Every buffer lent to the connections came back once they closed.
            eventually("every receive buffer is back", || {
                stat_total(&server, "hydrant_receive_buffers_lent{") == 0
            });
        }
    }
}

#[test]
fn a_connection_that_stops_reading_holds_few_receive_buffers() {
    let server = ServerProcess::start("stalled-reader");
    let mut stream = server.connect();
    hello(&mut stream);
    let big = pattern(5, 1 << 20);
    let put = PutRequest {
        name: name("big"),
        object_bytes: big.len() as u64,
    };
    send(&mut stream, Opcode::Put, 1, &put.encode(), &big);
    assert_eq!(status(&receive(&mut stream)), Status::Ok);
    let pool = stat_total(&server, "hydrant_receive_buffers{");
    assert_eq!(pool, 2 * 256, "the default pool of each of the two shards");
    // 100 GETs of 1 MiB that are not read stop the server reading this connection (its queued
    // answers pass their bound); 10,000 PINGs (469 KiB) sent after that arrive all the same.
    let get = GetRequest {
        name: name("big"),
        range_start: 0,
        range_end: None,
    };
    let mut requests: Vec<_> = (0..100)
        .map(|index| (Opcode::Get, 10 + index, get.encode(), vec![]))
        .collect();
    stream.write_all(&frames(&requests)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pings: Vec<_> = (0..10_000)
        .map(|index| (Opcode::Ping, 1000 + index, vec![], vec![]))
        .collect();
    stream.write_all(&frames(&pings)).unwrap();
    requests.extend(pings);
    // Once the server has taken what it will, the connection holds STREAM_BUFFERS_UNREAD_MAX
    // (8) buffers, and at most what the kernel posts in one pass over the socket (32) before the
    // cancellation reaches it; the rest waits in the socket.
    std::thread::sleep(Duration::from_secs(1));
    let lent = stat_total(&server, "hydrant_receive_buffers_lent{");
    assert!(
        (1..=40).contains(&lent),
        "{lent} buffers lent to one stalled connection"
    );
    assert!(stat_total(&server, "hydrant_receive_streams_cut_total{") >= 1);
    // Other connections are served meanwhile.
    let mut other = server.connect();
    hello(&mut other);
    send(&mut other, Opcode::Get, 7, &get.encode(), &[]);
    let response = receive(&mut other);
    assert_eq!(status(&response), Status::Ok);
    assert!(response.payload == big);
    // Reading again, the stalled connection gets every answer, in full.
    let mut gets = 0;
    for _ in &requests {
        let response = receive(&mut stream);
        assert_eq!(status(&response), Status::Ok);
        if response.header.opcode == Opcode::Get {
            assert!(response.payload == big);
            gets += 1;
        }
    }
    assert_eq!(gets, 100);
    drop(stream);
    drop(other);
    // A connection closed by the server for a bad frame, with more of its bytes in provided
    // buffers not read yet: those go back too.
    let mut bad = server.connect();
    hello(&mut bad);
    let mut bytes = vec![0xAB; FRAME_HEADER_BYTES];
    bytes.extend(frames(
        &(0..2000)
            .map(|index| (Opcode::Ping, index, vec![], vec![]))
            .collect::<Vec<_>>(),
    ));
    bad.write_all(&bytes).unwrap();
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    eventually("every receive buffer is back", || {
        stat_total(&server, "hydrant_receive_buffers_lent{") == 0
    });
}

/// The host's address on its first non-loopback interface, if it has one: the source address
/// of a route to a documentation address (a UDP "connect" sends nothing).
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("192.0.2.1:9").ok()?;
    let address = probe.local_addr().ok()?.ip();
    (!address.is_loopback() && !address.is_unspecified()).then_some(address)
}

#[test]
fn without_a_token_only_clients_on_this_host_are_served() {
    let Some(remote) = non_loopback_address() else {
        eprintln!("skipped: this host has no non-loopback address to connect from");
        return;
    };
    let directory =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("remote-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let data = format!("{}:256MiB", directory.join("data.hyd").display());
    let (mut child, line) = spawn_server(&[
        "--listen",
        "0.0.0.0:0",
        "--shards",
        "1",
        "--no-shard-ports",
        "--data",
        &data,
    ]);
    let address = listening_address(&line);
    let port = address.rsplit(':').next().unwrap();
    let stats_from = |host: String| {
        let config = hydrant_client::ClientConfig::new(&[format!("{host}:{port}")])
            .connect_timeout(Duration::from_secs(10))
            .request_timeout(Duration::from_secs(10))
            .retries_max(0);
        hydrant_client::Client::with_config(config).and_then(|mut client| client.stats())
    };
    let local = stats_from("127.0.0.1".into());
    // The same port reached through the host's own network address is another host's view.
    let from_network = stats_from(remote.to_string());
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(local.is_ok(), "loopback: {local:?}");
    assert!(from_network.is_err(), "{remote} was served without a token");
}

#[test]
fn the_log_bytes_metric_counts_each_entry_with_its_header_and_padding() {
    let server = ServerProcess::start_with("log-bytes", &["--origin", "none"]);
    let mut stream = server.connect();
    hello(&mut stream);
    let log_bytes = |stream: &mut TcpStream| {
        send(stream, Opcode::Stats, 1, &[], &[]);
        let text = String::from_utf8(receive(stream).payload).unwrap();
        text.lines()
            .filter(|line| line.starts_with("hydrant_log_bytes_total{"))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    let before = log_bytes(&mut stream);
    for (index, size) in [5000usize, 100, 4096].into_iter().enumerate() {
        let put = PutRequest {
            name: name(&format!("sized-{index}")),
            object_bytes: size as u64,
        };
        send(&mut stream, Opcode::Put, 2, &put.encode(), &vec![7; size]);
        assert_eq!(status(&receive(&mut stream)), Status::Ok);
    }
    // A header block each, and the data padded to whole blocks: 2 + 1 + 1 of them.
    assert_eq!(log_bytes(&mut stream) - before, (3 + 4) * 4096);
}
