//! A write answered with an error never comes back: on a store so small that reclaim keeps
//! taking the regions of puts still in progress, some puts give up with NoSpace after their
//! rewrite rounds, with every chunk written. Reopened, the store must show, for every key, the
//! last acknowledged version or nothing (clean data may be evicted), never a failed one.

mod common;

use std::collections::HashMap;

use common::{pattern, TempDir, MIB};
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::block_on;
use hydrant_engine::{Engine, EngineConfig, ErrorKind};

const KEYS: u64 = 20;
/// Fresh stores the load is run on (on a build without void markers, a failed version came
/// back on most of them).
const STORES: u64 = 4;
const ROUNDS: u64 = 12;
const OBJECT_BYTES: usize = 700 * 1024;

fn tiny_config(path: &std::path::Path) -> EngineConfig {
    // One shard of eight 1 MiB regions, chunks of 256 KiB: an object is three chunks, and the
    // puts in flight (20 of 700 KiB) hold more than the store.
    let mut config = EngineConfig::new(vec![DeviceConfig::create(path, 9 * MIB)]);
    config.shards = Some(1);
    config.region_bytes = Some(MIB);
    config.chunk_bytes = Some(256 * 1024);
    config.arena_bytes = 32 * MIB as usize;
    config
}

fn seed(key: u64, round: u64) -> u64 {
    key * 1000 + round
}

fn key_seed(store: u64, key: u64, round: u64) -> u64 {
    store * 1_000_000 + seed(key, round)
}

/// What the puts of each key got: the seeds acknowledged and failed, in order.
#[derive(Default, Debug)]
struct Outcomes {
    acknowledged: Vec<u64>,
    failed: Vec<u64>,
}

fn check(engine: &Engine, outcomes: &HashMap<u64, Outcomes>, when: &str) {
    for (key, outcome) in outcomes {
        let found = block_on(engine.get("data", &format!("k{key}"), None)).unwrap();
        let Some((_, data)) = found else { continue };
        let failed = outcome
            .failed
            .iter()
            .find(|&&seed| data == pattern(seed, OBJECT_BYTES));
        assert!(
            failed.is_none(),
            "{when}: key {key} shows version {failed:?}, whose put failed ({outcome:?})"
        );
        let last = outcome.acknowledged.last().copied();
        assert!(
            last.is_some_and(|seed| data == pattern(seed, OBJECT_BYTES)),
            "{when}: key {key} shows bytes other than its last acknowledged version {last:?}"
        );
    }
}

#[test]
fn a_put_that_failed_with_no_space_after_writing_its_chunks_does_not_come_back() {
    for store in 0..STORES {
        load_fail_and_reopen(store);
    }
}

fn load_fail_and_reopen(store: u64) {
    let directory = TempDir::new(&format!("void-{store}"));
    let path = directory.file("data.hyd");
    let engine = Engine::open(tiny_config(&path)).unwrap();
    // Every key's puts in sequence, all keys at once.
    let engine_ref = &engine;
    let chains = (0..KEYS).map(|key| async move {
        let mut outcome = Outcomes::default();
        for round in 0..ROUNDS {
            let seed = key_seed(store, key, round);
            let data = pattern(seed, OBJECT_BYTES);
            match engine_ref.put("data", &format!("k{key}"), data).await {
                Ok(_) => outcome.acknowledged.push(seed),
                Err(error) if error.kind() == ErrorKind::NoSpace => outcome.failed.push(seed),
                Err(error) => panic!("put of key {key}: {error}"),
            }
        }
        (key, outcome)
    });
    let outcomes: HashMap<u64, Outcomes> = block_on(futures::future::join_all(chains))
        .into_iter()
        .collect();
    let failures: usize = outcomes.values().map(|outcome| outcome.failed.len()).sum();
    let stats = block_on(engine.stats()).unwrap();
    let rewrites: u64 = stats.iter().map(|shard| shard.counters.rewrites).sum();
    assert!(
        failures > 0 && rewrites > 0,
        "the load must make puts give up after rewriting ({failures} failed, {rewrites} rewrites)"
    );
    check(&engine, &outcomes, "before reopening");
    engine.close();
    let engine = Engine::open(tiny_config(&path)).unwrap();
    check(&engine, &outcomes, "after reopening");
    engine.close();
}

/// Set the format version of both superblock copies of `path` (and their checksums).
fn set_format_version(path: &std::path::Path, version: u32) {
    let mut bytes = std::fs::read(path).unwrap();
    for offset in [0usize, 64 * 1024] {
        let block = &mut bytes[offset..offset + 4096];
        block[8..12].copy_from_slice(&version.to_le_bytes());
        let crc = crc32c::crc32c(&block[..4092]);
        block[4092..].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

fn format_version(path: &std::path::Path) -> [u32; 2] {
    let bytes = std::fs::read(path).unwrap();
    [0usize, 64 * 1024]
        .map(|offset| u32::from_le_bytes(bytes[offset + 8..offset + 12].try_into().unwrap()))
}

#[test]
fn older_stores_are_read_and_upgraded_and_an_unknown_version_is_refused() {
    let directory = TempDir::new("format-version");
    let path = directory.file("data.hyd");
    let engine = Engine::open(tiny_config(&path)).unwrap();
    block_on(engine.put("data", "kept", pattern(7, 300_000))).unwrap();
    engine.close();
    assert_eq!(format_version(&path), [6, 6]);
    for older in [1, 2, 3, 4, 5] {
        set_format_version(&path, older);
        let engine = Engine::open(tiny_config(&path)).unwrap();
        let (_, data) = block_on(engine.get("data", "kept", None)).unwrap().unwrap();
        assert!(data == pattern(7, 300_000));
        engine.close();
        assert_eq!(
            format_version(&path),
            [6, 6],
            "upgraded from {older} on open"
        );
    }
    set_format_version(&path, 7);
    let refused = Engine::open(tiny_config(&path)).err().expect("refused");
    assert!(
        refused.to_string().contains("format version 7"),
        "{refused}"
    );
}
