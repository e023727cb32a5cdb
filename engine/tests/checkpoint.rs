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

/// A checkpoint is encoded and written a piece at a time while its shard goes on serving: here
/// puts, overwrites and deletes all through the key space run beside it, from other threads.
/// Restarted from that checkpoint and the log after it, the store has exactly the index a full
/// scan of the same device gives, and every object as last written.
#[test]
fn a_checkpoint_written_while_writes_and_deletes_run_matches_a_full_scan() {
    use std::sync::atomic::{AtomicBool, Ordering};

    const OBJECTS: u64 = 5000;
    let dir = TempDir::new("checkpoint-concurrent");
    let path = dir.file("data.hyd");
    // One shard, and no checkpoint but the one taken here.
    let store_config = |path: &Path, load: bool| {
        let mut config = config(path, 256 * MIB, 1, 4);
        config.checkpoints.every_regions = 0;
        config.checkpoints.on_close = false;
        config.checkpoints.load = load;
        config
    };
    // Keys of about 900 bytes: a record takes about 1 KiB of the checkpoint, so that its 5,000
    // records take many pieces and two parts.
    let key = |index: u64| format!("{}/{index:05}", "k".repeat(890));
    let engine = Engine::open(store_config(&path, true)).unwrap();
    let mut expected: Vec<Option<Vec<u8>>> = Vec::new();
    for index in 0..OBJECTS {
        let data = pattern(index, (index % 5 * 700) as usize);
        block_on(engine.put("data", &key(index), data.clone())).unwrap();
        expected.push(Some(data));
    }
    expected.resize(OBJECTS as usize + 1000, None);
    assert_eq!(expected.len() % 1500, 0);

    // Four threads of changes, each on its own keys (those equal to it modulo 4), so that
    // together they know what each key ends as.
    let done = AtomicBool::new(false);
    let (written, changed) = std::thread::scope(|scope| {
        let changers: Vec<_> = expected
            .chunks_mut(1500)
            .enumerate()
            .map(|(thread, expected)| {
                let (done, engine) = (&done, &engine);
                scope.spawn(move || {
                    let mut changes = 0u64;
                    while !done.load(Ordering::Acquire) {
                        // Keys spread over the thread's range, some of them new.
                        let offset = (changes * 7919) % 1500;
                        let index = thread as u64 * 1500 + offset;
                        if changes.is_multiple_of(3) {
                            block_on(engine.delete("data", &key(index))).unwrap();
                            expected[offset as usize] = None;
                        } else {
                            let data =
                                pattern(index + changes * 10_000, (changes % 3 * 500) as usize);
                            block_on(engine.put("data", &key(index), data.clone())).unwrap();
                            expected[offset as usize] = Some(data);
                        }
                        changes += 1;
                    }
                    changes
                })
            })
            .collect();
        let written =
            block_on(engine.on_shard(0, |cache| async move { cache.store().checkpoint().await }));
        done.store(true, Ordering::Release);
        let changed: u64 = changers
            .into_iter()
            .map(|changer| changer.join().unwrap())
            .sum();
        (written, changed)
    });
    assert!(written.unwrap(), "the checkpoint was written");
    let stats = block_on(engine.stats()).unwrap();
    assert!(
        stats[0].counters.checkpoint_saved_max > 0,
        "changes ran ahead of the checkpoint's walk ({changed} changes)"
    );
    let before = block_on(engine.index_image()).unwrap();
    engine.close();
    assert_eq!(
        checkpoint_parts(&path).len(),
        2,
        "a checkpoint of two parts"
    );

    let copy = path.with_extension("copy");
    std::fs::copy(&path, &copy).unwrap();
    let scanning = Engine::open(store_config(&copy, false)).unwrap();
    let scanned = block_on(scanning.index_image()).unwrap();
    scanning.close();

    let engine = Engine::open(store_config(&path, true)).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats[0].counters.recovered_from_checkpoint, 1);
    let image = block_on(engine.index_image()).unwrap();
    assert_eq!(image, scanned, "the checkpoint and the full scan agree");
    assert_eq!(image, before, "the index as it was before the restart");
    for (index, data) in expected.iter().enumerate() {
        let found = block_on(engine.get("data", &key(index as u64), None)).unwrap();
        match (data, found) {
            (Some(data), Some((_, found))) => assert!(found == *data, "{index} changed"),
            (None, None) => {}
            (data, found) => panic!(
                "object {index}: expected {:?} bytes, found {:?}",
                data.as_ref().map(Vec::len),
                found.map(|(meta, _)| meta.bytes)
            ),
        }
    }
    engine.close();
}
