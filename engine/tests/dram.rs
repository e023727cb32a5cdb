//! The DRAM tier through the engine's public API, on a real file: it answers with the current
//! version's bytes, and under a Zipf workload its hit ratio is the one the policy simulator
//! predicts for the same key stream and capacity.

mod common;

use common::{config, pattern, TempDir, MIB};
use hydrant_engine::policy::{Capacity, EvictionPolicy, TinyLfuSieve};
use hydrant_engine::rt::block_on;
use hydrant_engine::Engine;

const OBJECT_BYTES: usize = 4096;
const KEYS: u64 = 2_000;
const REQUESTS: usize = 30_000;
const DRAM_BYTES: u64 = MIB;

/// Keys ranked by a Zipf(1.0) law, from a seeded generator (a precomputed CDF).
fn zipf_stream(keys: u64, requests: usize, seed: u64) -> Vec<u64> {
    let weights: Vec<f64> = (1..=keys).map(|rank| 1.0 / rank as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(weights.len());
    let mut sum = 0.0;
    for weight in weights {
        sum += weight / total;
        cumulative.push(sum);
    }
    let mut state = seed | 1;
    (0..requests)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let uniform = (state >> 11) as f64 / (1u64 << 53) as f64;
            cumulative
                .partition_point(|&edge| edge < uniform)
                .min(keys as usize - 1) as u64
        })
        .collect()
}

fn open(dir: &TempDir) -> Engine {
    let mut config = config(&dir.file("data.hyd"), 64 * MIB, 1, 4);
    config.dram_bytes = DRAM_BYTES;
    Engine::open(config).unwrap()
}

fn load(engine: &Engine) {
    let keys: Vec<u64> = (0..KEYS).collect();
    for batch in keys.chunks(200) {
        let puts: Vec<_> = batch
            .iter()
            .map(|&key| engine.put("data", &format!("k{key}"), pattern(key, OBJECT_BYTES)))
            .collect();
        for meta in block_on(futures::future::join_all(puts)) {
            meta.unwrap();
        }
    }
}

#[test]
fn the_dram_tier_serves_the_current_version() {
    let dir = TempDir::new("dram-versions");
    let engine = open(&dir);
    block_on(engine.put("data", "k", pattern(1, OBJECT_BYTES))).unwrap();
    for _ in 0..3 {
        let (_, data) = block_on(engine.get("data", "k", None)).unwrap().unwrap();
        assert!(data == pattern(1, OBJECT_BYTES));
    }
    let hits_before = block_on(engine.stats()).unwrap()[0].dram.hits;
    assert!(hits_before >= 1, "repeated reads are DRAM hits");
    block_on(engine.put("data", "k", pattern(2, OBJECT_BYTES))).unwrap();
    let (_, data) = block_on(engine.get("data", "k", None)).unwrap().unwrap();
    assert!(
        data == pattern(2, OBJECT_BYTES),
        "a write is never hidden by DRAM"
    );
    let (_, range) = block_on(engine.get(
        "data",
        "k",
        Some(hydrant_engine::ByteRange {
            start: 100,
            end: Some(200),
        }),
    ))
    .unwrap()
    .unwrap();
    assert!(range == pattern(2, OBJECT_BYTES)[100..200]);
    block_on(engine.delete("data", "k")).unwrap();
    assert!(block_on(engine.get("data", "k", None)).unwrap().is_none());
    let stats = block_on(engine.stats()).unwrap();
    assert!(stats[0].dram.bytes <= DRAM_BYTES);
}

#[test]
fn under_zipf_the_dram_tier_hits_as_the_simulator_predicts() {
    let dir = TempDir::new("dram-zipf");
    let engine = open(&dir);
    load(&engine);
    let stream = zipf_stream(KEYS, REQUESTS, 42);
    // Reads in flight together, as loaders issue them, in stream order within each batch.
    for batch in stream.chunks(64) {
        let gets: Vec<_> = batch
            .iter()
            .map(|&key| engine.get("data", &format!("k{key}"), None))
            .collect();
        for (key, read) in batch.iter().zip(block_on(futures::future::join_all(gets))) {
            let (_, data) = read.unwrap().expect("every key was stored");
            assert!(data == pattern(*key, OBJECT_BYTES), "k{key}");
        }
    }
    let stats = block_on(engine.stats()).unwrap();
    let dram = stats[0].dram;
    assert_eq!(dram.hits + dram.misses, REQUESTS as u64);
    let engine_hit_ratio = dram.hits as f64 / REQUESTS as f64;

    let mut policy = TinyLfuSieve::new(Capacity::Bytes(DRAM_BYTES));
    let mut evicted = Vec::new();
    let simulated_hits = stream
        .iter()
        .filter(|&&key| {
            policy
                .access(key, OBJECT_BYTES as u64, &mut evicted)
                .is_hit()
        })
        .count();
    let simulated_hit_ratio = simulated_hits as f64 / REQUESTS as f64;
    eprintln!("DRAM tier hit ratio {engine_hit_ratio:.4}, simulator {simulated_hit_ratio:.4}");
    assert!(
        (engine_hit_ratio - simulated_hit_ratio).abs() <= 0.02,
        "engine {engine_hit_ratio:.4} vs simulator {simulated_hit_ratio:.4}"
    );
    // The capacity holds a tenth of the keys; Zipf(1.0) still makes most reads hits.
    assert!(engine_hit_ratio > 0.4, "{engine_hit_ratio}");
}

/// What a server may answer from the DRAM tier without waiting (`Cache::get_memory`): only the
/// version NVMe holds, and only while it is current without asking the origin. Under a TTL, a
/// copy the tier still holds is not answered once the TTL has run out (the usual read then
/// revalidates it and finds the origin's new bytes).
#[test]
fn answers_without_waiting_are_current_versions_only() {
    use hydrant_engine::store::ObjectKey;
    use hydrant_engine::{OriginConfig, Revalidate};
    let dir = TempDir::new("dram-get-memory");
    let origin = dir.path().join("origin");
    std::fs::create_dir_all(origin.join("data")).unwrap();
    let mut origins = OriginConfig::new();
    origins.default_url = Some(format!("file://{}", origin.display()));
    origins.default_revalidate = Revalidate::Ttl(std::time::Duration::from_millis(300));
    let mut config = config(&dir.file("data.hyd"), 16 * MIB, 1, 1);
    config.origins = Some(origins);
    config.dram_bytes = MIB;
    let engine = Engine::open(config).unwrap();
    let first = pattern(1, OBJECT_BYTES);
    std::fs::write(origin.join("data").join("ttl"), &first).unwrap();
    let in_memory = |engine: &Engine| {
        let key = ObjectKey::new("data", "ttl").unwrap();
        block_on(engine.on_shard(0, move |cache| async move {
            Ok(cache
                .get_memory(&key, None, |_| Some(()))
                .map(|(read, ())| read.data.parts().concat()))
        }))
        .unwrap()
    };
    let read = |engine: &Engine| {
        block_on(engine.get("data", "ttl", None))
            .unwrap()
            .unwrap()
            .1
    };
    // Through from the origin, then (once admitted to NVMe, in the background) from NVMe,
    // which fills the tier, then from the tier.
    let mut held = None;
    for _ in 0..50 {
        assert!(read(&engine) == first);
        held = in_memory(&engine);
        if held.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(held == Some(first.clone()), "fresh and held");
    let second = pattern(2, OBJECT_BYTES + 100);
    std::fs::write(origin.join("data").join("ttl"), &second).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert!(
        in_memory(&engine).is_none(),
        "held, but its TTL has run out"
    );
    assert!(read(&engine) == second, "the usual read revalidates");
    // A version written through the engine: never the old copy.
    let third = pattern(3, 500);
    block_on(engine.put("data", "ttl", third.clone())).unwrap();
    assert!(in_memory(&engine).is_none_or(|bytes| bytes == third));
    assert!(read(&engine) == third);
}
