//! The client library against the real `hydrant-server` process on loopback: the connection
//! pool, pipelining, retries across a server restart, `get_into`, and the async client. BUSY
//! cannot be provoked on demand from the real server, so its retries are tested against a
//! scripted server speaking the protocol through hydrant-proto.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Once};
use std::time::Duration;

use hydrant_client::{AsyncClient, ClientConfig, ClientError, GetItem, SharedClient};
use hydrant_proto::message::{GetRequest, HelloResponse, Message, ObjectInfo};
use hydrant_proto::{FrameHeader, Limits, Opcode, Status, FRAME_HEADER_BYTES};

/// The `hydrant-server` binary beside this test's own profile folder. Cargo builds another
/// package's binaries only for that package's tests, so the first call builds it (a no-op when
/// it is up to date).
fn server_binary() -> PathBuf {
    static BUILT: Once = Once::new();
    let test_executable = std::env::current_exe().unwrap();
    // target/<profile>/deps/client-<hash>
    let profile_folder = test_executable.parent().unwrap().parent().unwrap();
    let binary = profile_folder.join("hydrant-server");
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .args([
                "build",
                "--quiet",
                "-p",
                "hydrant-server",
                "--bin",
                "hydrant-server",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_folder.ends_with("release") {
            command.arg("--release");
        }
        let status = command.status().expect("cargo runs");
        assert!(status.success(), "building hydrant-server failed");
    });
    assert!(binary.exists(), "{} is missing", binary.display());
    binary
}

struct ServerProcess {
    child: Child,
    address: String,
    directory: PathBuf,
}

impl ServerProcess {
    /// One shard on a 512 MiB data file in a fresh folder, on any free port.
    fn start(name: &str) -> ServerProcess {
        let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("client-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        let (child, address) = ServerProcess::spawn(&directory, "127.0.0.1:0");
        ServerProcess {
            child,
            address,
            directory,
        }
    }

    fn spawn(directory: &std::path::Path, listen: &str) -> (Child, String) {
        let mut child = Command::new(server_binary())
            .args(["--listen", listen, "--shards", "1", "--origin", "none"])
            .arg("--data")
            .arg(format!("{}:512MiB", directory.join("data.hyd").display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start hydrant-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("the server prints where it listens, got {line:?}"))
            .to_string();
        (child, address)
    }

    /// Kill the process (as a crash would) and start it again on the same port and data file.
    fn restart(&mut self) {
        self.kill();
        let (child, address) = ServerProcess::spawn(&self.directory, &self.address);
        assert_eq!(address, self.address);
        self.child = child;
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn config(&self) -> ClientConfig {
        ClientConfig::new(std::slice::from_ref(&self.address))
            .connect_timeout(Duration::from_secs(5))
            .request_timeout(Duration::from_secs(30))
            .backoff(Duration::from_millis(5), Duration::from_millis(50))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// The sum over shards of metric `name` in a server's Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn connections_opened(client: &SharedClient) -> u64 {
    let (_, text) = client.stats().unwrap().remove(0);
    metric(&text, "hydrant_connections_opened_total")
}

/// Bytes that differ with the key and the position, so a misplaced byte shows.
fn pattern(seed: u64, bytes: usize) -> Vec<u8> {
    (0..bytes as u64)
        .map(|index| (index.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

#[test]
fn the_pool_uses_several_connections_for_concurrent_threads_and_no_more_than_its_bound() {
    let server = ServerProcess::start("pool");
    let client = SharedClient::connect(server.config().max_connections_per_node(4)).unwrap();
    let data = pattern(1, 256 * 1024);
    client.put("data", "shared", &data).unwrap();
    assert_eq!(
        connections_opened(&client),
        1,
        "one connection while one thread calls"
    );

    const THREADS: usize = 12;
    let start = Arc::new(Barrier::new(THREADS));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let (client, start, data) = (client.clone(), start.clone(), &data);
            scope.spawn(move || {
                start.wait();
                for _ in 0..40 {
                    let (info, read) = client.get("data", "shared", None).unwrap();
                    assert_eq!(info.object_bytes, data.len() as u64);
                    assert!(read == *data);
                }
            });
        }
    });
    let opened = connections_opened(&client);
    assert!(
        (2..=4).contains(&opened),
        "12 threads share 2 to 4 connections, opened {opened}"
    );
}

#[test]
fn a_thousand_pipelined_requests_on_one_connection_are_all_answered() {
    let server = ServerProcess::start("pipeline");
    let client = SharedClient::connect(server.config().max_connections_per_node(1)).unwrap();
    // Sizes from empty to 20 MiB, so that some answers are streamed over several frames.
    let size = |index: u64| match index {
        0 => 20 << 20,
        index if index % 100 == 1 => 3 << 20,
        index => (index * 37 % 5000) as usize,
    };
    let objects: Vec<Vec<u8>> = (0..1000u64)
        .map(|index| pattern(index, size(index)))
        .collect();
    let mut puts = client.pipeline();
    for (index, object) in objects.iter().enumerate() {
        puts.put("data", &format!("object-{index}"), object);
    }
    let stored = puts.run().unwrap();
    for (index, result) in stored.iter().enumerate() {
        let (info, _) = result.as_ref().unwrap();
        assert_eq!(info.object_bytes, objects[index].len() as u64);
    }

    let mut gets = client.pipeline();
    let mut expected = Vec::new();
    for index in 0..1000u64 {
        // Every 50th asks for a missing key; every 7th for a range.
        if index % 50 == 49 {
            gets.get("data", &format!("missing-{index}"), None);
            expected.push(None);
        } else if index % 7 == 0 && !objects[index as usize].is_empty() {
            let object = &objects[index as usize];
            let end = object.len() as u64;
            gets.get(
                "data",
                &format!("object-{index}"),
                Some((end / 2, Some(end))),
            );
            expected.push(Some(object[object.len() / 2..].to_vec()));
        } else {
            gets.get("data", &format!("object-{index}"), None);
            expected.push(Some(objects[index as usize].clone()));
        }
    }
    assert_eq!(gets.len(), 1000);
    let results = gets.run().unwrap();
    assert_eq!(results.len(), 1000);
    for (index, (result, expected)) in results.iter().zip(&expected).enumerate() {
        match expected {
            None => assert!(
                matches!(result, Err(error) if error.is_not_found()),
                "item {index}"
            ),
            Some(bytes) => {
                let (info, read) = result.as_ref().unwrap();
                assert_eq!(info.object_bytes, objects[index].len() as u64, "{index}");
                assert!(read == bytes, "item {index} came back byte for byte");
            }
        }
    }
    assert_eq!(
        connections_opened(&client),
        1,
        "2,000 requests, all on the one connection"
    );
}

#[test]
fn a_broken_connection_is_retried_and_a_dead_server_given_up_on() {
    let mut server = ServerProcess::start("restart");
    let client = SharedClient::connect(server.config().retries_max(2)).unwrap();
    let data = pattern(7, 100_000);
    client.put("data", "durable", &data).unwrap();

    // The pooled connection dies with the process; the next call fails on it and is retried
    // on a new connection to the restarted server.
    server.restart();
    let (_, read) = client.get("data", "durable", None).unwrap();
    assert!(read == data);
    assert_eq!(client.retries_total(), 1);
    client.put("data", "after", b"restart").unwrap();

    server.kill();
    let retries_before = client.retries_total();
    let error = client.get("data", "durable", None).unwrap_err();
    assert_eq!(
        client.retries_total() - retries_before,
        2,
        "retries_max retries"
    );
    match &error {
        ClientError::Io(io_error) => assert_eq!(
            io_error.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "the last attempt's error: {error}"
        ),
        other => panic!("expected an I/O error, got {other}"),
    }
}

#[test]
fn the_async_client_retries_on_a_new_connection_after_a_restart() {
    let mut server = ServerProcess::start("async-restart");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = AsyncClient::connect(server.config().retries_max(2))
            .await
            .unwrap();
        let data = pattern(9, 50_000);
        client.put("data", "durable", &data).await.unwrap();
        server.restart();
        let (_, read) = client.get("data", "durable", None).await.unwrap();
        assert!(read == data);
        assert_eq!(client.retries_total(), 1);
        server.kill();
        let error = client.get("data", "durable", None).await.unwrap_err();
        assert!(matches!(error, ClientError::Io(_)), "{error}");
        assert_eq!(client.retries_total(), 3, "then retries_max more");
    });
}

#[test]
fn get_into_fills_the_callers_buffer_and_refuses_one_too_small() {
    let server = ServerProcess::start("into");
    let client = SharedClient::connect(server.config()).unwrap();
    let small = pattern(3, 1 << 20);
    let large = pattern(4, 20 << 20);
    client.put("data", "small", &small).unwrap();
    client.put("data", "large", &large).unwrap();

    let mut buffer = vec![0u8; 24 << 20];
    let (info, read) = client.get_into("data", "small", None, &mut buffer).unwrap();
    assert_eq!((info.object_bytes, read), (1 << 20, 1 << 20));
    assert!(buffer[..read] == small);
    let (_, read) = client.get_into("data", "large", None, &mut buffer).unwrap();
    assert_eq!(read, 20 << 20, "a streamed answer, frame after frame");
    assert!(buffer[..read] == large);
    let (info, read) = client
        .get_into(
            "data",
            "large",
            Some((1000, Some(5000))),
            &mut buffer[..4000],
        )
        .unwrap();
    assert_eq!((info.range_start, read), (1000, 4000));
    assert!(buffer[..4000] == large[1000..5000]);

    let mut tight = vec![0xa5u8; (1 << 20) - 1];
    let error = client
        .get_into("data", "small", None, &mut tight)
        .unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::BufferTooSmall {
                needed: 1_048_576,
                capacity: 1_048_575
            }
        ),
        "{error}"
    );
    assert!(tight.iter().all(|&byte| byte == 0xa5), "nothing was copied");
    let error = client
        .get_into("data", "missing", None, &mut buffer)
        .unwrap_err();
    assert!(error.is_not_found(), "{error}");
    // The client goes on after a refused buffer (its connection was replaced).
    let (_, read) = client.get_into("data", "small", None, &mut buffer).unwrap();
    assert!(buffer[..read] == small);
}

#[test]
fn the_async_client_serves_two_hundred_concurrent_requests_byte_for_byte() {
    let server = ServerProcess::start("async");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = AsyncClient::connect(server.config().max_connections_per_node(4))
            .await
            .unwrap();
        let objects: Arc<Vec<Vec<u8>>> = Arc::new(
            (0..200u64)
                .map(|index| {
                    pattern(
                        index,
                        if index == 0 {
                            18 << 20
                        } else {
                            1000 + index as usize * 97
                        },
                    )
                })
                .collect(),
        );
        let mut tasks = Vec::new();
        for index in 0..200usize {
            let (client, objects) = (client.clone(), objects.clone());
            tasks.push(tokio::spawn(async move {
                let info = client
                    .put("data", &format!("async-{index}"), &objects[index])
                    .await
                    .unwrap();
                assert_eq!(info.object_bytes, objects[index].len() as u64);
            }));
        }
        for task in tasks.drain(..) {
            task.await.unwrap();
        }
        for index in 0..200usize {
            let (client, objects) = (client.clone(), objects.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("async-{index}");
                let (info, read) = client.get("data", &key, None).await.unwrap();
                assert_eq!(info.object_bytes, objects[index].len() as u64);
                assert!(read == objects[index], "{key} byte for byte");
                let mut buffer = vec![0u8; objects[index].len()];
                let (_, read) = client
                    .get_into("data", &key, None, &mut buffer)
                    .await
                    .unwrap();
                assert!(buffer[..read] == objects[index]);
                let info = client.head("data", &key).await.unwrap();
                assert_eq!(info.object_bytes, objects[index].len() as u64);
            }));
        }
        for task in tasks.drain(..) {
            task.await.unwrap();
        }
        let mut small = vec![0u8; 10];
        let error = client
            .get_into("data", "async-5", None, &mut small)
            .await
            .unwrap_err();
        assert!(
            matches!(error, ClientError::BufferTooSmall { .. }),
            "{error}"
        );
        let error = client.get("data", "missing", None).await.unwrap_err();
        assert!(error.is_not_found());

        let items: Vec<GetItem> = (0..200)
            .map(|index| GetItem {
                bucket: "data".into(),
                key: format!("async-{index}"),
                range: Some((0, Some(10))),
            })
            .collect();
        let batch = client.batch_get(&items[1..], true).await.unwrap();
        for (offset, result) in batch.iter().enumerate() {
            assert_eq!(result.as_ref().unwrap().1, objects[offset + 1][..10]);
        }
        assert_eq!(
            client
                .list("data", "async-", None, 1000)
                .await
                .unwrap()
                .len(),
            200
        );
        client.delete("data", "async-7").await.unwrap();
        assert!(client
            .head("data", "async-7")
            .await
            .unwrap_err()
            .is_not_found());
        client.ping().await.unwrap();
        let (_, text) = client.stats().await.unwrap().remove(0);
        let opened = metric(&text, "hydrant_connections_opened_total");
        assert!(
            (2..=4).contains(&opened),
            "concurrent tasks spread over 2 to 4 connections, opened {opened}"
        );
    });
}

/// What a scripted server does with GETs.
#[derive(Clone, Copy)]
enum Script {
    /// Answer BUSY ("busy N" for the Nth GET) while N is at most this, then the object "ok".
    Busy { answers: u64 },
    /// Hold the answers until this many GETs have arrived, then send them in reverse order,
    /// each with the requested key as its bytes: a client that waits for an answer before
    /// sending its next request never gets one.
    Reversed { gets: usize },
}

/// A server speaking the protocol through hydrant-proto: HELLO, then GETs as its script says;
/// it counts the GETs it saw.
struct ScriptedServer {
    address: String,
    gets: Arc<AtomicU64>,
}

impl ScriptedServer {
    fn start(script: Script) -> ScriptedServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let gets = Arc::new(AtomicU64::new(0));
        let seen = gets.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = seen.clone();
                std::thread::spawn(move || serve_script(stream, script, &seen));
            }
        });
        ScriptedServer { address, gets }
    }

    fn config(&self, retries: u32) -> ClientConfig {
        ClientConfig::new(std::slice::from_ref(&self.address))
            .retries_max(retries)
            .backoff(Duration::from_millis(1), Duration::from_millis(10))
            .request_timeout(Duration::from_secs(10))
    }
}

fn answer_frame(
    request: &FrameHeader,
    status: Status,
    extension: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let header = FrameHeader::response(request, status as u8, extension, payload);
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(extension);
    frame.extend_from_slice(payload);
    frame
}

fn serve_script(mut stream: TcpStream, script: Script, gets: &AtomicU64) {
    let limits = Limits::default();
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        if stream.read_exact(&mut header_bytes).is_err() {
            return;
        }
        let header = FrameHeader::decode(&header_bytes, &limits).unwrap();
        let mut extension = vec![0u8; header.extension_len as usize];
        stream.read_exact(&mut extension).unwrap();
        let mut payload = vec![0u8; header.payload_len as usize];
        stream.read_exact(&mut payload).unwrap();
        let answer = match header.opcode {
            Opcode::Hello => {
                let greeting = HelloResponse {
                    version: 1,
                    limits,
                    server_nonce: [0; 16],
                    auth_required: false,
                    shard_count: 1,
                    placement_hash: 1,
                    shard_ports: Vec::new(),
                };
                answer_frame(&header, Status::Ok, &greeting.encode(), &[])
            }
            Opcode::Get => {
                let count = gets.fetch_add(1, Ordering::SeqCst) + 1;
                let key = GetRequest::decode(&extension).unwrap().name.key;
                let object = |bytes: &[u8]| ObjectInfo {
                    object_bytes: bytes.len() as u64,
                    seq: 1,
                    dirty: false,
                    range_start: 0,
                };
                match script {
                    Script::Busy { answers } if count <= answers => answer_frame(
                        &header,
                        Status::Busy,
                        &[],
                        format!("busy {count}").as_bytes(),
                    ),
                    Script::Busy { .. } => {
                        answer_frame(&header, Status::Ok, &object(b"ok").encode(), b"ok")
                    }
                    Script::Reversed { gets } => {
                        let info = object(key.as_bytes());
                        held.push(answer_frame(
                            &header,
                            Status::Ok,
                            &info.encode(),
                            key.as_bytes(),
                        ));
                        if held.len() < gets {
                            continue;
                        }
                        held.drain(..).rev().flatten().collect()
                    }
                }
            }
            _ => answer_frame(&header, Status::Unsupported, &[], b"scripted"),
        };
        if stream.write_all(&answer).is_err() {
            return;
        }
    }
}

#[test]
fn pipelined_requests_are_all_sent_before_any_answer_and_matched_out_of_order() {
    const REQUESTS: usize = 300;
    let server = ScriptedServer::start(Script::Reversed { gets: REQUESTS });
    let client = SharedClient::connect(server.config(0).max_connections_per_node(1)).unwrap();
    let mut pipeline = client.pipeline();
    for index in 0..REQUESTS {
        pipeline.get("data", &format!("key-{index}"), None);
    }
    let results = pipeline.run().unwrap();
    for (index, result) in results.iter().enumerate() {
        assert_eq!(
            result.as_ref().unwrap().1,
            format!("key-{index}").as_bytes()
        );
    }

    // The async client, one connection: the same, from concurrent tasks.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = AsyncClient::connect(server.config(0).max_connections_per_node(1))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|index| {
                let client = client.clone();
                tokio::spawn(async move {
                    let key = format!("key-{index}");
                    let (_, read) = client.get("data", &key, None).await.unwrap();
                    assert_eq!(read, key.as_bytes());
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert_eq!(server.gets.load(Ordering::SeqCst), 2 * REQUESTS as u64);
}

#[test]
fn busy_answers_are_retried_until_success_or_retries_max() {
    let recovering = ScriptedServer::start(Script::Busy { answers: 2 });
    let client = SharedClient::connect(recovering.config(4)).unwrap();
    let (_, read) = client.get("data", "key", None).unwrap();
    assert_eq!(read, b"ok");
    assert_eq!(recovering.gets.load(Ordering::SeqCst), 3);
    assert_eq!(client.retries_total(), 2);

    let stuck = ScriptedServer::start(Script::Busy { answers: u64::MAX });
    let client = SharedClient::connect(stuck.config(3)).unwrap();
    let error = client.get("data", "key", None).unwrap_err();
    assert_eq!(
        stuck.gets.load(Ordering::SeqCst),
        4,
        "one attempt and 3 retries"
    );
    assert!(error.is_retriable());
    assert_eq!(
        error.to_string(),
        "Busy: busy 4",
        "the last attempt's error"
    );

    let client = SharedClient::connect(stuck.config(0)).unwrap();
    let before = stuck.gets.load(Ordering::SeqCst);
    client.get("data", "key", None).unwrap_err();
    assert_eq!(stuck.gets.load(Ordering::SeqCst) - before, 1, "no retries");
}

#[test]
fn the_async_client_retries_busy_answers_too() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let recovering = ScriptedServer::start(Script::Busy { answers: 3 });
        let client = AsyncClient::connect(recovering.config(4)).await.unwrap();
        let (_, read) = client.get("data", "key", None).await.unwrap();
        assert_eq!(read, b"ok");
        assert_eq!(client.retries_total(), 3);

        let stuck = ScriptedServer::start(Script::Busy { answers: u64::MAX });
        let client = AsyncClient::connect(stuck.config(2)).await.unwrap();
        let error = client.get("data", "key", None).await.unwrap_err();
        assert_eq!(error.to_string(), "Busy: busy 3");
        assert_eq!(client.retries_total(), 2);
    });
}
