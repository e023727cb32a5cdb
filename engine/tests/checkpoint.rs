//! Index checkpoints: a store closed cleanly reopens from its checkpoint without scanning a log
//! region, and gives the index a full scan of the same device gives; a damaged checkpoint is
//! detected and the full scan used. (Checkpoints taken while writes run, followed by a kill or
//! a power cut, are in `faults.rs` and `crash.rs`.)

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{config, pattern, TempDir, MIB};
use hydrant_engine::rt::block_on;
use hydrant_engine::{Engine, EngineConfig};

const CHECKPOINT_MAGIC: &[u8; 8] = b"HYDCKPT\0";

fn store_config(path: &Path, load: bool) -> EngineConfig {
    let mut config = config(path, 128 * MIB, 2, 4);
    config.checkpoints.load = load;
    config
}

/// Puts of several sizes (some of several chunks), dirty and clean, overwrites and deletes,
/// enough to fill several regions and reclaim some.
fn fill(engine: &Engine) -> Vec<(String, Option<Vec<u8>>)> {
    let mut expected = Vec::new();
    for index in 0..400u64 {
        let key = format!("objects/{index:04}");
        let bytes = match index % 9 {
            0 => 0,
            1 => 2 * MIB as usize + 1234,
            _ => (index as usize * 7919) % 150_000,
        };
        let data = pattern(index, bytes);
        block_on(engine.put_with("data", &key, data.clone(), index % 3 == 0)).unwrap();
        expected.push((key, Some(data)));
    }
    for index in (0..400u64).step_by(7) {
        let key = format!("objects/{index:04}");
        block_on(engine.delete("data", &key)).unwrap();
        expected[index as usize].1 = None;
    }
    for index in (3..400u64).step_by(11) {
        let key = format!("objects/{index:04}");
        let data = pattern(index + 1_000_000, 5000);
        block_on(engine.put("data", &key, data.clone())).unwrap();
        expected[index as usize].1 = Some(data);
    }
    expected
}

/// Whatever is stored reads back as written, and nothing deleted comes back.
fn check(engine: &Engine, expected: &[(String, Option<Vec<u8>>)]) {
    for (key, data) in expected {
        let found = block_on(engine.get("data", key, None)).unwrap();
        match (data, found) {
            (Some(data), Some((_, found))) => assert!(found == *data, "{key} reads back changed"),
            (None, Some(_)) => panic!("{key} was deleted and came back"),
            // Clean objects may have been evicted by reclaim.
            (_, None) => {}
        }
    }
}

/// Offsets of the checkpoint part headers in a device file.
fn checkpoint_parts(path: &Path) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    (0..bytes.len() / 4096)
        .map(|block| block * 4096)
        .filter(|&offset| &bytes[offset..offset + 8] == CHECKPOINT_MAGIC)
        .map(|offset| offset as u64)
        .collect()
}

fn flip(path: &Path, offset: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x20], offset).unwrap();
    file.sync_all().unwrap();
}

/// The index of the store in `path` recovered by a full scan of a copy of it (the copy is
/// changed by its recovery, the original is not).
fn full_scan_image(path: &Path) -> Vec<String> {
    let copy = path.with_extension("copy");
    std::fs::copy(path, &copy).unwrap();
    let engine = Engine::open(store_config(&copy, false)).unwrap();
    let image = block_on(engine.index_image()).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert!(stats
        .iter()
        .all(|shard| shard.counters.recovered_from_checkpoint == 0));
    engine.close();
    std::fs::remove_file(&copy).unwrap();
    image
}

#[test]
fn a_clean_restart_loads_the_checkpoint_scans_no_region_and_matches_a_full_scan() {
    let dir = TempDir::new("checkpoint-clean");
    let path = dir.file("data.hyd");
    let engine = Engine::open(store_config(&path, true)).unwrap();
    let expected = fill(&engine);
    let before = block_on(engine.index_image()).unwrap();
    engine.close();
    assert!(
        !checkpoint_parts(&path).is_empty(),
        "close wrote a checkpoint"
    );
    let scanned = full_scan_image(&path);

    let engine = Engine::open(store_config(&path, true)).unwrap();
    for shard in block_on(engine.stats()).unwrap() {
        assert_eq!(shard.counters.recovered_from_checkpoint, 1);
        assert_eq!(
            shard.counters.regions_scanned, 0,
            "nothing after the checkpoint"
        );
        assert!(shard.objects > 0);
    }
    let image = block_on(engine.index_image()).unwrap();
    assert_eq!(image, scanned, "the checkpoint and the full scan agree");
    assert_eq!(image, before, "the index as it was before the restart");
    check(&engine, &expected);

    // Writes after the restart, then a restart that loads the new checkpoint.
    let data = pattern(77, 300_000);
    block_on(engine.put("data", "after", data.clone())).unwrap();
    block_on(engine.delete("data", "objects/0001")).unwrap();
    engine.close();
    let engine = Engine::open(store_config(&path, true)).unwrap();
    let (_, found) = block_on(engine.get("data", "after", None))
        .unwrap()
        .expect("written after the first restart");
    assert!(found == data);
    assert!(block_on(engine.get("data", "objects/0001", None))
        .unwrap()
        .is_none());
}

#[test]
fn a_damaged_checkpoint_is_detected_and_the_full_scan_used() {
    let dir = TempDir::new("checkpoint-damaged");
    let path = dir.file("data.hyd");
    let engine = Engine::open(store_config(&path, true)).unwrap();
    let expected = fill(&engine);
    engine.close();
    let scanned = full_scan_image(&path);
    let parts = checkpoint_parts(&path);
    assert_eq!(parts.len(), 2, "one checkpoint part per shard: {parts:?}");

    // One byte of the first part's records, and the second part's header.
    flip(&path, parts[0] + 4096 + 200);
    flip(&path, parts[1] + 40);
    let engine = Engine::open(store_config(&path, true)).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    for shard in &stats {
        assert_eq!(shard.counters.recovered_from_checkpoint, 0);
        assert!(shard.counters.regions_scanned > 0);
    }
    // The part whose bytes fail their CRC is counted; a part whose header is damaged is not
    // a checkpoint at all.
    let damaged: u64 = stats
        .iter()
        .map(|shard| shard.counters.checkpoints_damaged)
        .sum();
    assert_eq!(damaged, 1);
    assert_eq!(block_on(engine.index_image()).unwrap(), scanned);
    check(&engine, &expected);
}
