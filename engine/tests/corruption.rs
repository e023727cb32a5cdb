//! Flipped bytes inside stored entries: reads report a checksum error or a miss, never wrong
//! bytes. Reclaim: what is evicted reads as a miss, what stays reads back exact, visited objects
//! survive, dirty objects are never evicted.

mod common;

use std::os::unix::fs::FileExt;

use common::{config, pattern, TempDir, MIB};
use hydrant_engine::rt::block_on;
use hydrant_engine::{ByteRange, Engine, ErrorKind};

const ENTRY_MAGIC: &[u8; 4] = b"HENT";

/// Offsets of entry headers in a device file and their data length (the format's data_bytes
/// field at offset 20).
fn entries(path: &std::path::Path) -> Vec<(u64, u32)> {
    let bytes = std::fs::read(path).unwrap();
    (0..bytes.len() / 4096)
        .map(|block| block * 4096)
        .filter(|&offset| &bytes[offset..offset + 4] == ENTRY_MAGIC && bytes[offset + 4] == 1)
        .map(|offset| {
            (
                offset as u64,
                u32::from_le_bytes(bytes[offset + 20..offset + 24].try_into().unwrap()),
            )
        })
        .collect()
}

#[test]
fn flipped_bytes_give_checksum_errors_or_misses_never_wrong_bytes() {
    flipped_bytes(false);
}

/// The same damage, reopened from the index checkpoint written on close: no entry header is
/// read while recovering, so every object is found and fails its checksum when read.
#[test]
fn flipped_bytes_after_a_checkpoint_give_checksum_errors_never_wrong_bytes() {
    flipped_bytes(true);
}

fn flipped_bytes(from_checkpoint: bool) {
    let dir = TempDir::new("corruption");
    let path = dir.file("data.hyd");
    let sizes = [1usize, 1000, 4096, 70_000, 200_000, 1_500_000, 2_300_000];
    let config = || {
        let mut config = config(&path, 64 * MIB, 1, 4);
        config.checkpoints.load = from_checkpoint;
        config
    };
    let engine = Engine::open(config()).unwrap();
    for (index, &size) in sizes.iter().enumerate() {
        block_on(engine.put(
            "data",
            &format!("object-{index}"),
            pattern(index as u64, size),
        ))
        .unwrap();
    }
    engine.close();

    let found = entries(&path);
    assert!(
        found.len() >= sizes.len(),
        "every object has at least one entry"
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    for (position, &(offset, data_bytes)) in found.iter().enumerate() {
        // One flip in the data of every entry; for every third entry also one in its header.
        let target = offset + 4096 + (position as u64 * 7919) % data_bytes as u64;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, target).unwrap();
        file.write_all_at(&[byte[0] ^ 0x5A], target).unwrap();
        if position % 3 == 0 {
            let header_target = offset + 150;
            file.read_exact_at(&mut byte, header_target).unwrap();
            file.write_all_at(&[byte[0] ^ 0x01], header_target).unwrap();
        }
    }
    file.sync_all().unwrap();
    drop(file);

    let engine = Engine::open(config()).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(
        stats[0].counters.recovered_from_checkpoint,
        u64::from(from_checkpoint)
    );
    let mut errors = 0;
    let mut misses = 0;
    for (index, &size) in sizes.iter().enumerate() {
        let key = format!("object-{index}");
        match block_on(engine.get("data", &key, None)) {
            Ok(None) => misses += 1,
            Err(error) => {
                assert_eq!(error.kind(), ErrorKind::ChecksumMismatch, "{error}");
                errors += 1;
                // A clean object that failed its checksum is dropped: the next read is a miss.
                assert_eq!(block_on(engine.get("data", &key, None)).unwrap(), None);
            }
            Ok(Some((_, data))) => panic!(
                "{key} ({size} bytes) returned {} bytes despite a flipped byte",
                data.len()
            ),
        }
    }
    assert_eq!(errors + misses, sizes.len());
    assert!(
        errors > 0,
        "some objects were found and failed their checksum"
    );
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats[0].counters.checksum_errors, errors as u64);
    if from_checkpoint {
        assert_eq!(misses, 0, "every object is in the checkpoint");
        assert_eq!(
            stats[0].counters.damaged_headers, 0,
            "no header was scanned"
        );
    } else {
        assert!(misses > 0, "objects whose header was damaged are misses");
        assert!(stats[0].counters.damaged_headers > 0);
    }
}

#[test]
fn a_range_read_verifies_only_what_it_reads() {
    let dir = TempDir::new("range-corruption");
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    let data = pattern(9, 500_000); // one chunk of 1 MiB chunks, eight 64 KiB checksum pieces
    block_on(engine.put("data", "big", data.clone())).unwrap();
    engine.close();
    let (offset, _) = entries(&path)[0];
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Damage checksum piece 5 (bytes 327680..393216 of the data).
    file.write_all_at(&[0xFF, 0xFF, 0xFF], offset + 4096 + 330_000)
        .unwrap();
    file.sync_all().unwrap();
    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    let early = ByteRange {
        start: 70_000,
        end: Some(200_000),
    };
    let (_, bytes) = block_on(engine.get("data", "big", Some(early)))
        .unwrap()
        .unwrap();
    assert!(
        bytes == data[70_000..200_000],
        "undamaged pieces read back exact"
    );
    let damaged = ByteRange {
        start: 320_000,
        end: Some(340_000),
    };
    let error = block_on(engine.get("data", "big", Some(damaged))).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ChecksumMismatch);
}

#[test]
fn reclaim_evicts_unvisited_keeps_visited_and_never_drops_dirty() {
    let dir = TempDir::new("reclaim");
    let path = dir.file("data.hyd");
    // One shard, eight 1 MiB regions: about 8 MiB for 100 KiB objects.
    let engine = Engine::open(config(&path, 9 * MIB, 1, 1)).unwrap();
    block_on(engine.put("data", "hot", pattern(7, 100_000))).unwrap();
    for index in 0..200u64 {
        block_on(engine.put("data", &format!("cold-{index}"), pattern(index, 100_000))).unwrap();
        let (_, hot) = block_on(engine.get("data", "hot", None))
            .unwrap()
            .expect("a visited object survives reclaim");
        assert!(hot == pattern(7, 100_000));
    }
    let mut present = 0;
    for index in 0..200u64 {
        if let Some((_, data)) =
            block_on(engine.get("data", &format!("cold-{index}"), None)).unwrap()
        {
            assert!(data == pattern(index, 100_000));
            present += 1;
        }
    }
    assert!(
        present > 0 && present < 200,
        "{present} of 200 cold objects remain"
    );
    let stats = block_on(engine.stats()).unwrap();
    assert!(
        stats[0].counters.reclaims > 0
            && stats[0].counters.evictions > 0
            && stats[0].counters.relocations > 0
    );

    // Dirty objects are pinned: the store fills and then says NoSpace, losing none of them.
    let mut pinned = 0u64;
    let error = loop {
        match block_on(engine.put_with(
            "data",
            &format!("dirty-{pinned}"),
            pattern(1000 + pinned, 100_000),
            true,
        )) {
            Ok(_) => pinned += 1,
            Err(error) => break error,
        }
        assert!(pinned < 200, "a 9 MiB store cannot pin 20 MB");
    };
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    let stats = block_on(engine.stats()).unwrap();
    assert!(
        pinned >= 40,
        "only {pinned} dirty objects fit: {error}; {stats:?}"
    );
    engine.close();
    let engine = Engine::open(config(&path, 9 * MIB, 1, 1)).unwrap();
    for index in 0..pinned {
        let (meta, data) = block_on(engine.get("data", &format!("dirty-{index}"), None))
            .unwrap()
            .expect("dirty objects are never evicted");
        assert!(meta.dirty);
        assert!(data == pattern(1000 + index, 100_000));
    }
}

#[test]
fn an_object_written_while_reclaim_takes_its_regions_reads_back_intact() {
    let dir = TempDir::new("reclaim-under-put");
    let path = dir.file("data.hyd");
    // One shard, six 1 MiB regions with 256 KiB chunks: a 1.4 MiB object spans two regions, and
    // writing it forces reclaim of regions full of older objects.
    let engine = Engine::open(config(&path, 7 * MIB, 1, 1)).unwrap();
    let too_large = block_on(engine.put("data", "huge", pattern(1, 2 * MIB as usize))).unwrap_err();
    assert_eq!(too_large.kind(), ErrorKind::TooLarge, "{too_large}");
    for round in 0..6u64 {
        for index in 0..8u64 {
            block_on(engine.put(
                "data",
                &format!("filler-{index}"),
                pattern(round * 100 + index, 120_000),
            ))
            .unwrap();
        }
        let big = pattern(round, 1_400_000);
        block_on(engine.put_with("data", "big", big.clone(), round % 2 == 0)).unwrap();
        let (_, data) = block_on(engine.get("data", "big", None))
            .unwrap()
            .expect("just written");
        assert!(data == big, "round {round}: the object reads back intact");
    }
    let stats = block_on(engine.stats()).unwrap();
    assert!(stats[0].counters.reclaims > 0);
    assert_eq!(stats[0].counters.checksum_errors, 0);
    engine.close();
    let engine = Engine::open(config(&path, 7 * MIB, 1, 1)).unwrap();
    let (_, data) = block_on(engine.get("data", "big", None))
        .unwrap()
        .expect("still there after reopen");
    assert!(data == pattern(5, 1_400_000));
}

#[test]
fn concurrent_writers_on_a_small_store_keep_their_latest_versions() {
    let dir = TempDir::new("reclaim-concurrent");
    let path = dir.file("data.hyd");
    // One shard, ten 1 MiB regions: reclaim runs while many puts are in flight.
    let engine = std::sync::Arc::new(Engine::open(config(&path, 11 * MIB, 1, 1)).unwrap());
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut puts = Vec::new();
                for round in 0..40u64 {
                    let key = format!("w{writer}/k{}", round % 3);
                    let seed = writer * 1000 + round;
                    let size = 50_000 + (seed as usize * 7919) % 400_000;
                    puts.push(engine.put_with("data", &key, pattern(seed, size), writer == 0));
                    if puts.len() == 4 || round == 39 {
                        for put in puts.drain(..) {
                            block_on(put).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let check = |engine: &Engine| {
        for writer in 0..4u64 {
            for slot in 0..3u64 {
                let key = format!("w{writer}/k{slot}");
                let seed = writer * 1000 + (0..40).filter(|round| round % 3 == slot).max().unwrap();
                let size = 50_000 + (seed as usize * 7919) % 400_000;
                match block_on(engine.get("data", &key, None)).unwrap() {
                    Some((_, data)) => assert!(
                        data == pattern(seed, size),
                        "{key} holds its latest version"
                    ),
                    None => assert!(writer != 0, "dirty {key} was evicted"),
                }
            }
        }
    };
    check(&engine);
    let stats = block_on(engine.stats()).unwrap();
    assert!(stats[0].counters.reclaims > 0);
    assert_eq!(stats[0].counters.checksum_errors, 0);
    drop(stats);
    std::sync::Arc::try_unwrap(engine)
        .ok()
        .expect("sole owner")
        .close();
    let engine = Engine::open(config(&path, 11 * MIB, 1, 1)).unwrap();
    check(&engine);
}

/// Mark `bucket/key` (version `seq`) clean through its shard, as write-back does after an upload.
fn mark_clean(engine: &Engine, key: &str, seq: u64) -> bool {
    let object = hydrant_engine::store::ObjectKey::new("data", key).unwrap();
    let shard = engine.shard_of(&object);
    block_on(engine.on_shard(shard, move |cache| async move {
        cache.store().mark_clean(&object, seq).await
    }))
    .unwrap()
}

#[test]
fn clean_markers_survive_reopening_and_reclaim() {
    let dir = TempDir::new("clean-markers");
    let path = dir.file("data.hyd");
    // One shard of ten 1 MiB regions, so that filling it reclaims every region several times.
    let open = || Engine::open(config(&path, 12 * MIB, 1, 1)).unwrap();
    let engine = open();
    let mut seqs = Vec::new();
    for index in 0..6 {
        let meta =
            block_on(engine.put_with("data", &format!("d{index}"), pattern(index, 50_000), true))
                .unwrap();
        seqs.push(meta.seq);
    }
    // A stale version is not marked: only the indexed one.
    assert!(!mark_clean(&engine, "d0", seqs[0] + 1_000));
    for (index, seq) in seqs.iter().enumerate().take(3) {
        assert!(mark_clean(&engine, &format!("d{index}"), *seq));
    }
    engine.close();
    let engine = open();
    for index in 0..6 {
        let meta = block_on(engine.head("data", &format!("d{index}")))
            .unwrap()
            .unwrap();
        assert_eq!(meta.dirty, index >= 3, "d{index} after reopening");
    }
    // Keep the clean ones visited so that reclaim moves them, then churn through every region.
    for round in 0..120u64 {
        for index in 0..3 {
            block_on(engine.get("data", &format!("d{index}"), None)).unwrap();
        }
        block_on(engine.put(
            "data",
            &format!("churn-{}", round % 8),
            pattern(round, 300_000),
        ))
        .unwrap();
    }
    assert!(block_on(engine.stats()).unwrap()[0].counters.reclaims >= 10);
    engine.close();
    let engine = open();
    for index in 0..6 {
        if let Some(meta) = block_on(engine.head("data", &format!("d{index}"))).unwrap() {
            assert_eq!(
                meta.dirty,
                index >= 3,
                "d{index} after reclaim moved its entries and dropped its marker"
            );
        } else {
            assert!(index < 3, "dirty d{index} was evicted");
        }
    }
}

/// Page-aligned memory outside the engine, as a same-host client's region is.
struct Aligned {
    pointer: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory, written only through ExternalBuf while a read runs.
unsafe impl Send for Aligned {}
unsafe impl Sync for Aligned {}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `external`.
        unsafe { std::alloc::dealloc(self.pointer, self.layout) }
    }
}

fn external(bytes: usize) -> hydrant_engine::buf::ExternalBuf {
    let layout = std::alloc::Layout::from_size_align(bytes, 4096).unwrap();
    // SAFETY: a non-zero size.
    let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!pointer.is_null());
    let owner = std::sync::Arc::new(Aligned { pointer, layout });
    // SAFETY: `bytes` bytes at `pointer`, alive as long as the owner, no reference into them.
    unsafe { hydrant_engine::buf::ExternalBuf::new(owner, pointer as usize, bytes) }
}

/// Read `key` into `target` on its shard: what was placed, or the error.
fn get_into(
    engine: &Engine,
    key: &str,
    target: &hydrant_engine::buf::ExternalBuf,
) -> hydrant_engine::Result<Option<hydrant_engine::Placed>> {
    let object = hydrant_engine::store::ObjectKey::new("data", key).unwrap();
    let shard = engine.shard_of(&object);
    let target = target.clone();
    block_on(engine.on_shard(shard, move |cache| async move {
        cache.get_into(&object, None, &target).await
    }))
}

fn external_bytes(target: &hydrant_engine::buf::ExternalBuf, len: usize) -> Vec<u8> {
    // SAFETY: no read into `target` is running.
    unsafe { std::slice::from_raw_parts(target.address() as *const u8, len).to_vec() }
}

#[test]
fn direct_reads_into_outside_memory_are_checked_where_they_land() {
    let dir = TempDir::new("direct-corruption");
    let path = dir.file("data.hyd");
    let sizes = [1usize, 4096, 70_000, 1_500_000, 2_300_000];
    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    let target = external(4 * MIB as usize);
    for (index, &size) in sizes.iter().enumerate() {
        let key = format!("object-{index}");
        let data = pattern(index as u64 + 40, size);
        block_on(engine.put("data", &key, data.clone())).unwrap();
        let placed = get_into(&engine, &key, &target).unwrap().unwrap();
        assert!(placed.written);
        assert_eq!(placed.copied_bytes, 0, "{size} bytes landed by DMA");
        assert_eq!(placed.len, size as u64);
        assert!(
            external_bytes(&target, size) == data,
            "{key} reads back exact"
        );
    }
    engine.close();

    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for (position, &(offset, data_bytes)) in entries(&path).iter().enumerate() {
        let target = offset + 4096 + (position as u64 * 7919) % data_bytes as u64;
        file.write_all_at(&[0xA5, 0x5A], target).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);

    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    for index in 0..sizes.len() {
        let key = format!("object-{index}");
        let error = get_into(&engine, &key, &target).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ChecksumMismatch, "{key}: {error}");
        // The buffered read that confirmed the damage dropped the clean copy.
        assert!(get_into(&engine, &key, &target).unwrap().is_none());
    }
}

/// Chunks that are not a multiple of the checksum piece: pieces count from each chunk's start,
/// so a range that starts at a piece of the object but not of its chunk is read through the
/// buffers, byte-exact, and a tight target never trips the server.
#[test]
fn direct_reads_with_chunks_that_are_not_whole_pieces_land_the_right_bytes() {
    let dir = TempDir::new("direct-odd-chunks");
    let path = dir.file("data.hyd");
    let mut engine_config = config(&path, 64 * MIB, 1, 4);
    engine_config.chunk_bytes = Some(96 * 1024);
    engine_config.crc_block_bytes = Some(64 * 1024);
    let engine = Engine::open(engine_config).unwrap();
    let data = pattern(99, 200 * 1024);
    block_on(engine.put("data", "odd", data.clone())).unwrap();
    let object = hydrant_engine::store::ObjectKey::new("data", "odd").unwrap();
    let shard = engine.shard_of(&object);
    for (start, end, target_bytes) in [
        (128 * 1024u64, None, 128 * 1024usize),
        (128 * 1024, None, 72 * 1024),
        (96 * 1024, Some(160 * 1024u64), 64 * 1024),
        (0, None, 256 * 1024),
        (64 * 1024, Some(100 * 1024), 64 * 1024),
    ] {
        let target = external(target_bytes);
        let (object, inner) = (object.clone(), target.clone());
        let placed = block_on(engine.on_shard(shard, move |cache| async move {
            cache
                .get_into(&object, Some(ByteRange { start, end }), &inner)
                .await
        }))
        .unwrap()
        .unwrap();
        let end = end.unwrap_or(data.len() as u64);
        assert!(placed.written, "{start}..{end} into {target_bytes}");
        assert_eq!(placed.len, end - start);
        assert!(
            external_bytes(&target, placed.len as usize) == data[start as usize..end as usize],
            "{start}..{end} into {target_bytes} bytes"
        );
    }
}

/// Zero every seal block of `path`: the store then reads as one whose process died before it
/// closed (its newest region is scanned as a tail, verifying data).
fn unseal(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    for block in bytes.chunks_mut(4096) {
        if &block[..4] == ENTRY_MAGIC && block[4] == 3 {
            block.fill(0);
        }
    }
    std::fs::write(path, bytes).unwrap();
}

/// Put `data` as `key` from memory outside the engine, as a same-host client's WRITE does
/// (written where it lies).
fn put_from_client_memory(engine: &Engine, key: &str, data: &[u8]) {
    let source = external(data.len().next_multiple_of(4096));
    source.write_at(0, data);
    block_on(engine.put_shared(
        hydrant_engine::ObjectKey::new("data", key).unwrap(),
        source,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        data.len() as u64,
        hydrant_engine::Precondition::Any,
        &hydrant_engine::Attributes::default(),
    ))
    .unwrap();
}

/// An entry in the newest region written from a client's memory whose header checks out and
/// whose data does not, with acknowledged entries after it (the client changed its memory
/// while the device read it): recovery keeps what follows and voids that version, whose older
/// one comes back, at this open and every later one. The same damage in an entry written from
/// the server's own memory can only be a torn write, after which nothing was acknowledged: the
/// log ends there. `fill_region` leaves the region no room after its last entry, so that the
/// marker goes into a region of its own.
fn damaged_entry_before_acknowledged_ones(fill_region: bool, from_client: bool) {
    let dir = TempDir::new("damaged-in-tail");
    let path = dir.file("data.hyd");
    let config = || {
        // 1 MiB regions (256 blocks, chunks of 256 KiB), one shard, no checkpoints: every open
        // scans the log.
        let mut config = config(&path, 16 * MIB, 1, if fill_region { 1 } else { 4 });
        config.checkpoints.load = false;
        config.checkpoints.on_close = false;
        config
    };
    // In blocks: the region header, 14 + 19 for the victim's versions, 4 × 50 + 21 after: 255
    // of 256, so that one block (room for the seal, not for a marker as well) is left.
    let after: Vec<(String, Vec<u8>)> = (0..5u64)
        .map(|index| {
            let size = if index < 4 { 200_000 } else { 20 * 4096 };
            (format!("after-{index}"), pattern(100 + index, size))
        })
        .collect();
    let engine = Engine::open(config()).unwrap();
    block_on(engine.put("data", "victim", pattern(1, 50_000))).unwrap();
    if from_client {
        put_from_client_memory(&engine, "victim", &pattern(2, 70_000));
    } else {
        block_on(engine.put("data", "victim", pattern(2, 70_000))).unwrap();
    }
    for (key, data) in &after {
        block_on(engine.put("data", key, data.clone())).unwrap();
    }
    engine.close();

    let found = entries(&path);
    assert_eq!(found.len(), 7, "{found:?}");
    let (damaged, _) = *found
        .iter()
        .find(|&&(_, data_bytes)| data_bytes == 70_000)
        .expect("the victim's newer version");
    let last = found.last().unwrap();
    if fill_region {
        assert_eq!(
            (last.0 + 4096 + last.1 as u64) % MIB,
            MIB - 4096,
            "the region's last entry leaves one block: {found:?}"
        );
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let target = damaged + 4096 + 30_000;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, target).unwrap();
    file.write_all_at(&[byte[0] ^ 0x5A], target).unwrap();
    file.sync_all().unwrap();
    drop(file);
    unseal(&path);

    if !from_client {
        // A torn end: the log stops at the victim's newer version, and what came after it is
        // gone (none of it was acknowledged, had this been a crash).
        let engine = Engine::open(config()).unwrap();
        let stats = block_on(engine.stats()).unwrap();
        assert_eq!(stats[0].counters.damaged_voided, 0);
        assert_eq!(stats[0].counters.torn_tails, 1);
        let (_, victim) = block_on(engine.get("data", "victim", None))
            .unwrap()
            .unwrap();
        assert!(victim == pattern(1, 50_000));
        for (key, _) in &after {
            assert!(
                block_on(engine.get("data", key, None)).unwrap().is_none(),
                "{key}"
            );
        }
        engine.close();
        return;
    }
    let check = |engine: &Engine, when: &str| {
        let (_, victim) = block_on(engine.get("data", "victim", None))
            .unwrap()
            .unwrap_or_else(|| panic!("{when}: the victim's older version is there"));
        assert!(
            victim == pattern(1, 50_000),
            "{when}: the victim is its older version"
        );
        for (key, data) in &after {
            let (_, read) = block_on(engine.get("data", key, None))
                .unwrap()
                .unwrap_or_else(|| panic!("{when}: {key}, written after the damage, is kept"));
            assert!(read == *data, "{when}: {key} reads back exact");
        }
    };
    let engine = Engine::open(config()).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats[0].counters.damaged_voided, 1);
    assert_eq!(stats[0].counters.torn_tails, 0);
    check(&engine, "after the first open");
    block_on(engine.put("data", "later", pattern(9, 5000))).unwrap();
    engine.close();
    // The damaged entry stays as it was; its marker is at the tail's end, or in a region of
    // its own (the first region after the data's, with the marker in its first entry block)
    // where the tail had no room.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        bytes[damaged as usize + 4],
        1,
        "the damaged entry is left alone"
    );
    let voids: Vec<usize> = (0..bytes.len() / 4096)
        .map(|block| block * 4096)
        .filter(|&offset| &bytes[offset..offset + 4] == ENTRY_MAGIC && bytes[offset + 4] == 5)
        .collect();
    assert_eq!(voids.len(), 1, "one void marker: {voids:?}");
    let region_of =
        |offset: u64| (offset - found[0].0 + 4096) / (if fill_region { MIB } else { 4 * MIB });
    assert_eq!(
        region_of(voids[0] as u64) != region_of(damaged),
        fill_region,
        "the marker is in the damaged entry's region unless that had no room"
    );
    // Its region now sealed and trusted without reading data: the marker keeps the damaged
    // version out.
    let engine = Engine::open(config()).unwrap();
    check(&engine, "after a clean reopen");
    engine.close();
    // And scanned as a tail again (the seals gone, as if the process had died once more).
    unseal(&path);
    let engine = Engine::open(config()).unwrap();
    check(&engine, "after another unclean reopen");
    let (_, later) = block_on(engine.get("data", "later", None))
        .unwrap()
        .unwrap();
    assert!(later == pattern(9, 5000));
    engine.close();
}

#[test]
fn a_damaged_entry_from_client_memory_is_voided_and_the_acknowledged_ones_after_it_kept() {
    damaged_entry_before_acknowledged_ones(false, true);
}

#[test]
fn a_damaged_entry_from_client_memory_in_a_full_region_is_voided_from_a_region_of_its_own() {
    damaged_entry_before_acknowledged_ones(true, true);
}

#[test]
fn a_damaged_entry_from_the_servers_memory_ends_the_log() {
    damaged_entry_before_acknowledged_ones(false, false);
}

/// A kept entry whose data fails its checksums (bit rot, or a client that changed its memory
/// while the entry was written from it) is dropped by reclaim, never moved: its copy would be
/// written from the server's memory, and a copy that fails its checksums is taken for a torn
/// write by recovery (which ends the log there).
#[test]
fn reclaim_drops_a_damaged_entry_rather_than_moving_it() {
    let dir = TempDir::new("reclaim-damaged");
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 9 * MIB, 1, 1)).unwrap();
    // Dirty: kept by reclaim whether visited or not.
    block_on(engine.put_with("data", "damaged", pattern(7, 100_001), true)).unwrap();
    let (offset, _) = *entries(&path)
        .iter()
        .find(|&&(_, data_bytes)| data_bytes == 100_001)
        .unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0xEE; 16], offset + 4096 + 5000)
        .unwrap();
    file.sync_all().unwrap();
    drop(file);
    for index in 0..200u64 {
        block_on(engine.put("data", &format!("cold-{index}"), pattern(index, 100_000))).unwrap();
    }
    let stats = block_on(engine.stats()).unwrap();
    assert!(
        stats[0].counters.reclaims >= 8,
        "every region was reclaimed"
    );
    assert_eq!(stats[0].counters.checksum_errors, 1, "found by reclaim");
    assert_eq!(
        block_on(engine.get("data", "damaged", None)).unwrap(),
        None,
        "dropped, not moved"
    );
    engine.close();
}

/// A voided version's seq is never given out again, though every sound entry after it has an
/// older one (here the last chunk of a streamed put begun before it): a put of the same key
/// after the reopen must not take that seq, or the marker would void it at the next one.
#[test]
fn a_voided_versions_seq_is_not_given_out_again() {
    let dir = TempDir::new("voided-seq");
    let path = dir.file("data.hyd");
    let config = || {
        let mut config = config(&path, 32 * MIB, 1, 4);
        config.checkpoints.load = false;
        config.checkpoints.on_close = false;
        config
    };
    let engine = Engine::open(config()).unwrap();
    block_on(engine.put("data", "victim", pattern(1, 50_000))).unwrap();
    // A streamed put of two chunks: its seq is taken when its first chunk is placed.
    let chunk_bytes = engine.chunk_bytes() as usize;
    let streamed = pattern(5, 2 * chunk_bytes);
    let (sink, done) = engine
        .put_stream_key(
            hydrant_engine::ObjectKey::new("data", "streamed").unwrap(),
            streamed.len() as u64,
            hydrant_engine::Precondition::Any,
            &Default::default(),
        )
        .unwrap();
    let done = std::thread::spawn(move || block_on(done));
    let send = |piece: &[u8]| {
        let mut chunk = block_on(engine.streamed_chunk(piece.len()));
        chunk.data.extend_from_slice(piece);
        assert!(block_on(sink.send(chunk)));
    };
    send(&streamed[..chunk_bytes]);
    let placed = std::time::Instant::now();
    while !entries(&path)
        .iter()
        .any(|&(_, data_bytes)| data_bytes as usize == chunk_bytes)
    {
        assert!(
            placed.elapsed().as_secs() < 30,
            "the first chunk is written"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The newest seq, from a client's memory; then the streamed put's last chunk after it.
    put_from_client_memory(&engine, "victim", &pattern(2, 70_000));
    send(&streamed[chunk_bytes..]);
    drop(sink);
    done.join().unwrap().unwrap();
    engine.close();

    let found = entries(&path);
    let damaged = found
        .iter()
        .position(|&(_, data_bytes)| data_bytes == 70_000)
        .unwrap();
    assert_eq!(
        found[damaged + 1].1 as usize,
        chunk_bytes,
        "the streamed put's last chunk follows the victim's newer version: {found:?}"
    );
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0xEE; 16], found[damaged].0 + 4096 + 100)
        .unwrap();
    file.sync_all().unwrap();
    drop(file);
    unseal(&path);

    let engine = Engine::open(config()).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats[0].counters.damaged_voided, 1);
    let (_, victim) = block_on(engine.get("data", "victim", None))
        .unwrap()
        .unwrap();
    assert!(victim == pattern(1, 50_000), "the older version is back");
    let (_, read) = block_on(engine.get("data", "streamed", None))
        .unwrap()
        .unwrap();
    assert!(read == streamed);
    block_on(engine.put("data", "victim", pattern(3, 60_000))).unwrap();
    engine.close();
    let engine = Engine::open(config()).unwrap();
    let (_, victim) = block_on(engine.get("data", "victim", None))
        .unwrap()
        .unwrap();
    assert!(
        victim == pattern(3, 60_000),
        "the put after the reopen is kept ({} bytes read)",
        victim.len()
    );
    engine.close();
}
