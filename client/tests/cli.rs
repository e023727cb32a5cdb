//! The `hydrant` CLI and the client library against real servers on loopback (started in this
//! process through hydrant-server's library; each has its own engine and data file).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use hydrant_client::{node_for, Client};
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::EngineConfig;
use hydrant_server::{Server, ServerConfig};

struct TestServer {
    server: Option<Server>,
    directory: PathBuf,
}

impl TestServer {
    fn start(name: &str) -> TestServer {
        TestServer::start_with_token(name, None)
    }

    fn start_with_token(name: &str, token: Option<&[u8]>) -> TestServer {
        TestServer::start_with(name, token, 256 << 20)
    }

    /// One shard on a data file of `bytes`.
    fn start_with(name: &str, token: Option<&[u8]>, bytes: u64) -> TestServer {
        let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        let mut engine = EngineConfig::new(vec![DeviceConfig::create(
            directory.join("data.hyd"),
            bytes,
        )]);
        engine.shards = Some(1);
        engine.arena_bytes = 16 << 20;
        let server = Server::start(ServerConfig {
            token: token.map(<[u8]>::to_vec),
            ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), engine)
        })
        .expect("server starts");
        TestServer {
            server: Some(server),
            directory,
        }
    }

    fn address(&self) -> String {
        self.server.as_ref().unwrap().address().to_string()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

fn hydrant(server: &str, arguments: &[&str], input: &[u8]) -> (i32, Vec<u8>, String) {
    hydrant_with(server, arguments, input, None)
}

fn hydrant_with(
    server: &str,
    arguments: &[&str],
    input: &[u8],
    token: Option<&str>,
) -> (i32, Vec<u8>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hydrant"));
    command.env_remove("HYDRANT_TOKEN");
    if let Some(token) = token {
        command.env("HYDRANT_TOKEN", token);
    }
    let mut child = command
        .arg("--server")
        .arg(server)
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_cli_puts_gets_lists_and_removes() {
    let server = TestServer::start("cli");
    let address = server.address();
    let data: Vec<u8> = (0..300_000u32).map(|index| (index % 251) as u8).collect();
    let file = server.directory.join("input.bin");
    std::fs::write(&file, &data).unwrap();

    let (code, _, stderr) = hydrant(
        &address,
        &["put", "data/a/one.bin", file.to_str().unwrap()],
        b"",
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = hydrant(&address, &["put", "data/a/two.txt", "-"], b"from stdin");
    assert_eq!(code, 0, "{stderr}");

    let (code, stdout, _) = hydrant(&address, &["get", "data/a/one.bin"], b"");
    assert_eq!(code, 0);
    assert!(stdout == data);
    let (code, stdout, _) = hydrant(
        &address,
        &["get", "data/a/one.bin", "--range", "100-199"],
        b"",
    );
    assert_eq!(code, 0);
    assert_eq!(stdout, data[100..200]);
    let (code, stdout, _) = hydrant(
        &address,
        &[
            "get",
            "data/a/one.bin",
            "--range",
            "299990-18446744073709551615",
        ],
        b"",
    );
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        data[299_990..],
        "the last possible byte means to the end"
    );
    let output = server.directory.join("output.txt");
    let (code, _, _) = hydrant(
        &address,
        &["get", "data/a/two.txt", output.to_str().unwrap()],
        b"",
    );
    assert_eq!(code, 0);
    assert_eq!(std::fs::read(&output).unwrap(), b"from stdin");

    let (code, stdout, _) = hydrant(&address, &["stat", "data/a/one.bin"], b"");
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&stdout).contains("300000 bytes"));
    let (code, stdout, _) = hydrant(&address, &["ls", "data/a/"], b"");
    assert_eq!(code, 0);
    assert_eq!(
        String::from_utf8_lossy(&stdout),
        "300000\ta/one.bin\n10\ta/two.txt\n"
    );

    let (code, stdout, _) = hydrant(&address, &["stats"], b"");
    assert_eq!(code, 0);
    let stats = String::from_utf8_lossy(&stdout);
    assert!(stats.contains("hydrant_objects{shard=\"0\"} 2"), "{stats}");
    let (code, _, _) = hydrant(&address, &["rm", "data/a/two.txt"], b"");
    assert_eq!(code, 0);
    let (code, _, stderr) = hydrant(&address, &["get", "data/a/two.txt"], b"");
    assert_eq!(code, 3, "not found has its own exit status");
    assert!(stderr.starts_with("hydrant: NotFound"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let (code, _, stderr) = hydrant(&address, &["get", "no-key"], b"");
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = hydrant("127.0.0.1:1", &["stat", "data/x"], b"");
    assert_eq!(code, 1, "{stderr}");
}

#[test]
fn three_servers_used_as_one_cluster() {
    let servers: Vec<TestServer> = (0..3)
        .map(|index| TestServer::start(&format!("cluster-{index}")))
        .collect();
    let addresses: Vec<String> = servers.iter().map(TestServer::address).collect();
    let mut cluster = Client::connect(&addresses, Duration::from_secs(20)).unwrap();
    for index in 0..90u32 {
        let key = format!("k{index}");
        cluster.put("data", &key, key.as_bytes()).unwrap();
    }
    for index in 0..90u32 {
        let key = format!("k{index}");
        let (_, data) = cluster.get("data", &key, None).unwrap();
        assert_eq!(data, key.as_bytes());
        // The key lives on exactly the node rendezvous hashing picks.
        let owner = node_for(&addresses, "data", &key);
        for (node, address) in addresses.iter().enumerate() {
            let mut single =
                Client::connect(std::slice::from_ref(address), Duration::from_secs(20)).unwrap();
            let found = single.head("data", &key);
            assert_eq!(found.is_ok(), node == owner, "{key} on node {node}");
        }
    }
    assert_eq!(cluster.list("data", "k", None, 1000).unwrap().len(), 90);
    // The CLI pages through listings longer than one page (7 keys a page here), across nodes.
    let (code, stdout, stderr) = hydrant(
        &addresses.join(","),
        &["ls", "data/k", "--page-size", "7"],
        b"",
    );
    assert_eq!(code, 0, "{stderr}");
    let listed: Vec<String> = String::from_utf8_lossy(&stdout)
        .lines()
        .map(|line| line.split('\t').nth(1).unwrap().to_string())
        .collect();
    let mut expected: Vec<String> = (0..90u32).map(|index| format!("k{index}")).collect();
    expected.sort();
    assert_eq!(listed, expected);
}

#[test]
fn the_cli_proves_the_token_from_its_environment() {
    let server = TestServer::start_with_token("cli-token", Some(b"sixteen bytes or more"));
    let address = server.address();
    let (code, _, stderr) = hydrant(&address, &["put", "data/secret", "-"], b"x");
    assert_eq!(code, 2, "no token: {stderr}");
    assert!(stderr.contains("HYDRANT_TOKEN"), "{stderr}");
    let (code, _, stderr) = hydrant_with(
        &address,
        &["put", "data/secret", "-"],
        b"x",
        Some("a wrong token, long enough"),
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("Unauthenticated"), "{stderr}");
    let (code, _, stderr) = hydrant_with(
        &address,
        &["put", "data/secret", "-"],
        b"x",
        Some("sixteen bytes or more"),
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, _) = hydrant_with(
        &address,
        &["get", "data/secret"],
        b"",
        Some("sixteen bytes or more"),
    );
    assert_eq!((code, stdout), (0, b"x".to_vec()));
}

#[test]
fn batch_get_of_a_thousand_keys_with_per_item_status() {
    let servers: Vec<TestServer> = (0..2)
        .map(|index| TestServer::start(&format!("batch-{index}")))
        .collect();
    let addresses: Vec<String> = servers.iter().map(TestServer::address).collect();
    let mut client = Client::connect(&addresses, Duration::from_secs(20)).unwrap();
    for index in 0..1000u32 {
        let key = format!("b{index}");
        client
            .put("data", &key, format!("value of {key}").as_bytes())
            .unwrap();
    }
    // Every tenth key is missing; some items ask for a range.
    let items: Vec<hydrant_client::GetItem> = (0..1000u32)
        .map(|index| hydrant_client::GetItem {
            bucket: "data".into(),
            key: if index % 10 == 9 {
                format!("missing{index}")
            } else {
                format!("b{index}")
            },
            range: (index % 7 == 0).then_some((0, Some(5))),
        })
        .collect();
    for in_order in [false, true] {
        let results = client.batch_get(&items, in_order).unwrap();
        assert_eq!(results.len(), 1000);
        for (index, result) in results.iter().enumerate() {
            if index % 10 == 9 {
                assert!(
                    matches!(result, Err(error) if error.is_not_found()),
                    "item {index}"
                );
                continue;
            }
            let (info, data) = result.as_ref().unwrap();
            let expected = format!("value of b{index}");
            assert_eq!(info.object_bytes, expected.len() as u64);
            if index % 7 == 0 {
                assert_eq!(data, &expected.as_bytes()[..5]);
            } else {
                assert_eq!(data, expected.as_bytes());
            }
        }
    }
}

#[test]
fn a_one_gib_object_streams_in_and_out() {
    // One shard on 3 GiB: half of its usable space is over 1 GiB.
    let server = TestServer::start_with("stream", None, 3 << 30);
    let addresses = vec![server.address()];
    let mut client = Client::connect(&addresses, Duration::from_secs(120)).unwrap();
    let object: Vec<u8> = (0..1u64 << 30)
        .map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let info = client.put("data", "checkpoint.bin", &object).unwrap();
    assert_eq!(info.object_bytes, 1 << 30);
    let (info, data) = client.get("data", "checkpoint.bin", None).unwrap();
    assert_eq!(info.object_bytes, 1 << 30);
    assert!(data == object, "the GiB came back intact");
    let (_, tail) = client
        .get("data", "checkpoint.bin", Some(((1 << 30) - 10, None)))
        .unwrap();
    assert_eq!(tail, object[(1 << 30) - 10..]);
}

#[test]
fn the_cli_draws_a_progress_bar_only_on_a_terminal() {
    let server = TestServer::start("progress");
    let address = server.address();
    let data: Vec<u8> = (0..20u32 << 20).map(|index| (index % 253) as u8).collect();
    let file = server.directory.join("large.bin");
    std::fs::write(&file, &data).unwrap();
    let (code, _, stderr) = hydrant(
        &address,
        &["put", "data/large.bin", file.to_str().unwrap()],
        b"",
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stderr.contains('\r'),
        "no bar when stderr is a pipe: {stderr:?}"
    );

    // `script` runs the CLI on a pseudo-terminal and copies what it draws to its own stdout.
    if !std::path::Path::new("/usr/bin/script").exists() {
        eprintln!("skipped the terminal half: /usr/bin/script (util-linux) is missing");
        return;
    }
    let output_file = server.directory.join("large.out");
    let command_line = format!(
        "{} --server {address} get data/large.bin {}",
        env!("CARGO_BIN_EXE_hydrant"),
        output_file.display()
    );
    let output = Command::new("/usr/bin/script")
        .args(["-qefc", &command_line, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let drawn = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{drawn}");
    assert!(
        drawn.contains("[##############################] 20.00 MiB/20.00 MiB 100%"),
        "{drawn:?}"
    );
    assert!(drawn.contains("iB/s"), "the rate: {drawn:?}");
    assert!(std::fs::read(&output_file).unwrap() == data);
}
