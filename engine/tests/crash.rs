//! Crash test: a child process writes and deletes objects through the engine and reports every
//! operation it begins and every acknowledgement it gets; the parent kills it with SIGKILL at a
//! random moment, reopens the store and checks that every acknowledged object reads back
//! byte-exact and that no deleted object returns. Repeated over many kills on one store, so that
//! recovery, sealing and reclaim are crossed many times. The child writes an index checkpoint
//! every two filled regions, so kills land before, during and after checkpoint writes; after
//! each kill the index recovered from the checkpoint is compared with a full scan of a copy of
//! the same device.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{pattern, TempDir, MIB};
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::block_on;
use hydrant_engine::{Engine, EngineConfig};

const KILLS: usize = 60;
const KEYS: u64 = 96;
const WRITER_THREADS: u64 = 8;

fn crash_config(path: &std::path::Path) -> EngineConfig {
    let mut config = EngineConfig::new(vec![DeviceConfig::create(path, 97 * MIB)]);
    config.shards = Some(2);
    config.region_bytes = Some(4 * MIB);
    config.chunk_bytes = Some(MIB as u32);
    config.arena_bytes = 16 * MIB as usize;
    config.checkpoints.every_regions = 2;
    config
}

fn key_name(key: u64) -> String {
    format!("k/{key}")
}

/// Size of the object a (key, seed) put writes: mostly small, some spanning several chunks.
fn size_of(seed: u64) -> usize {
    match seed % 10 {
        0 => 0,
        1 => (2 * MIB + seed % 300_000) as usize,
        _ => (seed.wrapping_mul(7919) % 200_000) as usize,
    }
}

/// The child: runs only when the parent sets HYDRANT_CRASH_PATH.
#[test]
#[ignore = "run by crash_recovery_keeps_every_acknowledged_write as a child process"]
fn crash_child() {
    let Ok(path) = std::env::var("HYDRANT_CRASH_PATH") else {
        return;
    };
    let round: u64 = std::env::var("HYDRANT_CRASH_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let engine =
        std::sync::Arc::new(Engine::open(crash_config(std::path::Path::new(&path))).unwrap());
    println!("READY");
    let threads: Vec<_> = (0..WRITER_THREADS)
        .map(|thread| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut operation = round * 1_000_000 + thread * 100_000;
                loop {
                    operation += 1;
                    let key = (operation.wrapping_mul(2654435761) % (KEYS / WRITER_THREADS))
                        * WRITER_THREADS
                        + thread;
                    let seed = operation;
                    let delete = operation.is_multiple_of(7);
                    let line = if delete {
                        format!("BEGIN {key} delete")
                    } else {
                        format!("BEGIN {key} put {seed}")
                    };
                    say(&line);
                    if delete {
                        block_on(engine.delete("crash", &key_name(key))).unwrap();
                    } else {
                        let data = pattern(seed, size_of(seed));
                        block_on(engine.put_with("crash", &key_name(key), data, true)).unwrap();
                    }
                    say(&format!("ACK {key}"));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

fn say(line: &str) {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    writeln!(lock, "{line}").unwrap();
    lock.flush().unwrap();
}

/// What a key may hold: `None` = absent, `Some(seed)` = the object that put wrote.
type State = Option<u64>;

#[derive(Default)]
struct KeyModel {
    acknowledged: State,
    /// An operation begun and not acknowledged when the child died.
    in_flight: Option<State>,
}

#[test]
fn crash_recovery_keeps_every_acknowledged_write() {
    let dir = TempDir::new("crash");
    let path = dir.file("data.hyd");
    let mut model: HashMap<u64, KeyModel> =
        (0..KEYS).map(|key| (key, KeyModel::default())).collect();
    let mut acknowledged_total = 0u64;
    let mut from_checkpoint = 0usize;
    let mut random = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("HYDRANT_CRASH_PATH", &path)
            .env("HYDRANT_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child");
        let stdout = child.stdout.take().unwrap();
        let (lines, received) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let ready_deadline = Instant::now() + Duration::from_secs(60);
        let mut pending_lines = Vec::new();
        loop {
            let line = received
                .recv_timeout(ready_deadline.saturating_duration_since(Instant::now()))
                .expect("the child reports READY");
            if line.ends_with("READY") {
                break;
            }
        }
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let run_for = Duration::from_millis(20 + random % 400);
        let started = Instant::now();
        while started.elapsed() < run_for {
            if let Ok(line) = received.recv_timeout(Duration::from_millis(5)) {
                pending_lines.push(line);
            }
        }
        child.kill().expect("SIGKILL the child");
        child.wait().unwrap();
        reader.join().unwrap();
        pending_lines.extend(received.try_iter());

        for line in pending_lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["BEGIN", key, "delete"] => {
                    model.get_mut(&key.parse().unwrap()).unwrap().in_flight = Some(None)
                }
                ["BEGIN", key, "put", seed] => {
                    model.get_mut(&key.parse().unwrap()).unwrap().in_flight =
                        Some(Some(seed.parse().unwrap()))
                }
                ["ACK", key] => {
                    let entry = model.get_mut(&key.parse().unwrap()).unwrap();
                    entry.acknowledged = entry.in_flight.take().expect("an ACK follows its BEGIN");
                    acknowledged_total += 1;
                }
                _ => {} // libtest's own lines
            }
        }

        let copy = path.with_extension("copy");
        std::fs::copy(&path, &copy).expect("copy the device");
        let engine = Engine::open(crash_config(&path)).expect("reopen after SIGKILL");
        let stats = block_on(engine.stats()).unwrap();
        from_checkpoint += stats
            .iter()
            .filter(|shard| shard.counters.recovered_from_checkpoint > 0)
            .count();
        let mut full_scan_config = crash_config(&copy);
        full_scan_config.checkpoints.load = false;
        let full_scan = Engine::open(full_scan_config).expect("a full scan of the copy");
        assert_eq!(
            block_on(engine.index_image()).unwrap(),
            block_on(full_scan.index_image()).unwrap(),
            "round {round}: the index recovered from the checkpoint differs from a full scan's"
        );
        full_scan.close();
        std::fs::remove_file(&copy).unwrap();
        for (key, entry) in model.iter_mut() {
            let found =
                block_on(engine.get("crash", &key_name(*key), None)).expect("read after recovery");
            let state = match found {
                None => None,
                Some((_, data)) => {
                    let candidates = [Some(entry.acknowledged), entry.in_flight];
                    let seed = candidates
                        .iter()
                        .flatten()
                        .flatten()
                        .find(|&&seed| {
                            data.len() == size_of(seed) && data == pattern(seed, size_of(seed))
                        })
                        .copied();
                    assert!(
                        seed.is_some(),
                        "round {round}: key {key} holds {} bytes that match neither its acknowledged state {:?} nor its in-flight write {:?}",
                        data.len(),
                        entry.acknowledged,
                        entry.in_flight
                    );
                    seed
                }
            };
            let allowed = state == entry.acknowledged || Some(state) == entry.in_flight;
            assert!(
                allowed,
                "round {round}: key {key} recovered as {state:?}; acknowledged {:?}, in flight {:?}",
                entry.acknowledged, entry.in_flight
            );
            entry.acknowledged = state;
            entry.in_flight = None;
        }
        let stats = block_on(engine.stats()).unwrap();
        assert!(stats
            .iter()
            .all(|shard| shard.counters.checksum_errors == 0));
        engine.close();
    }
    assert!(
        acknowledged_total > KILLS as u64 * 5,
        "the children acknowledged only {acknowledged_total} operations"
    );
    assert!(
        from_checkpoint >= KILLS,
        "only {from_checkpoint} of {} shard recoveries loaded a checkpoint",
        2 * KILLS
    );
    eprintln!(
        "{KILLS} kills, {acknowledged_total} acknowledged operations checked, {from_checkpoint} of {} shard recoveries from a checkpoint",
        2 * KILLS
    );
}
