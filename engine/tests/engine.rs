//! The engine through its public API on real files opened with O_DIRECT: every operation,
//! objects from 0 bytes to 64 MiB, one and two shards, reopening, and bad input.

mod common;

use common::{config, file_fingerprint, pattern, TempDir, MIB};
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::block_on;
use hydrant_engine::{ByteRange, Engine, EngineConfig, ErrorKind, FormatPolicy};

const SIZES: [usize; 10] = [
    0,
    1,
    4095,
    4096,
    65_537,
    300_000,
    4 * 1024 * 1024,
    4 * 1024 * 1024 + 1,
    9 * 1024 * 1024 + 12_345,
    64 * 1024 * 1024,
];

fn key_of(size: usize) -> String {
    format!("objects/size-{size}")
}

fn put_all(engine: &Engine) {
    for (index, &size) in SIZES.iter().enumerate() {
        let meta =
            block_on(engine.put("data", &key_of(size), pattern(index as u64, size))).unwrap();
        assert_eq!(meta.bytes, size as u64);
        assert!(!meta.dirty);
    }
}

fn check_all(engine: &Engine) {
    for (index, &size) in SIZES.iter().enumerate() {
        let expected = pattern(index as u64, size);
        let (meta, data) = block_on(engine.get("data", &key_of(size), None))
            .unwrap()
            .expect("stored");
        assert_eq!(meta.bytes, size as u64);
        assert!(data == expected, "object of {size} bytes reads back intact");
        let head = block_on(engine.head("data", &key_of(size)))
            .unwrap()
            .expect("head");
        assert_eq!(head.bytes, size as u64);
        // Ranges: the first byte, a window across a checksum piece and a chunk boundary, the tail.
        let ranges = [
            (0u64, 1u64),
            (65_530, 65_550),
            (4 * 1024 * 1024 - 10, 4 * 1024 * 1024 + 10),
            (size as u64 / 2, size as u64),
        ];
        for (start, end) in ranges {
            if start > size as u64 {
                continue;
            }
            let range = ByteRange {
                start,
                end: Some(end),
            };
            let (_, data) = block_on(engine.get("data", &key_of(size), Some(range)))
                .unwrap()
                .expect("stored");
            let end = (end as usize).min(size);
            assert!(
                data == expected[start as usize..end],
                "range {start}-{end} of {size}"
            );
        }
    }
}

fn round_trip(shards: usize) {
    let dir = TempDir::new(&format!("round-trip-{shards}"));
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 512 * MIB, shards, 16)).unwrap();
    assert_eq!(engine.shard_count(), shards);
    put_all(&engine);
    check_all(&engine);

    // Overwrite, delete, list.
    block_on(engine.put("data", &key_of(1), b"new".to_vec())).unwrap();
    assert!(block_on(engine.delete("data", &key_of(4095))).unwrap());
    assert!(!block_on(engine.delete("data", "objects/never-stored")).unwrap());
    assert_eq!(
        block_on(engine.get("data", &key_of(4095), None)).unwrap(),
        None
    );
    let listed = block_on(engine.list("data", "objects/size-4", None, 100)).unwrap();
    let keys: Vec<&str> = listed.iter().map(|meta| meta.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "objects/size-4096",
            "objects/size-4194304",
            "objects/size-4194305"
        ]
    );
    let first_page = block_on(engine.list("data", "objects/", None, 4)).unwrap();
    let second_page =
        block_on(engine.list("data", "objects/", Some(&first_page[3].key), 100)).unwrap();
    assert_eq!(first_page.len() + second_page.len(), SIZES.len() - 1);
    assert!(second_page.iter().all(|meta| meta.key > first_page[3].key));
    assert!(block_on(engine.list("other", "", None, 100))
        .unwrap()
        .is_empty());
    engine.close();

    // Reopen after a clean close: everything comes back, the delete stays deleted.
    let engine = Engine::open(config(&path, 512 * MIB, shards, 16)).unwrap();
    let (_, data) = block_on(engine.get("data", &key_of(1), None))
        .unwrap()
        .unwrap();
    assert_eq!(data, b"new");
    assert_eq!(
        block_on(engine.get("data", &key_of(4095), None)).unwrap(),
        None
    );
    for (index, &size) in SIZES
        .iter()
        .enumerate()
        .filter(|(_, &size)| size != 1 && size != 4095)
    {
        let (_, data) = block_on(engine.get("data", &key_of(size), None))
            .unwrap()
            .expect("still stored");
        assert!(
            data == pattern(index as u64, size),
            "object of {size} bytes after reopen"
        );
    }
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats.len(), shards);
    assert_eq!(
        stats.iter().map(|shard| shard.objects).sum::<u64>(),
        SIZES.len() as u64 - 1
    );
    assert!(stats
        .iter()
        .all(|shard| shard.counters.checksum_errors == 0));
}

#[test]
fn put_get_range_head_delete_list_one_shard() {
    round_trip(1);
}

#[test]
fn put_get_range_head_delete_list_two_shards() {
    round_trip(2);
}

#[test]
fn ranges_are_checked() {
    let dir = TempDir::new("ranges");
    let engine = Engine::open(config(&dir.file("data.hyd"), 64 * MIB, 1, 4)).unwrap();
    block_on(engine.put("data", "ten", pattern(1, 10))).unwrap();
    let past = ByteRange {
        start: 11,
        end: None,
    };
    let error = block_on(engine.get("data", "ten", Some(past))).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidRange);
    let backwards = ByteRange {
        start: 5,
        end: Some(2),
    };
    assert_eq!(
        block_on(engine.get("data", "ten", Some(backwards)))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidRange
    );
    let clamped = ByteRange {
        start: 8,
        end: Some(100),
    };
    let (_, data) = block_on(engine.get("data", "ten", Some(clamped)))
        .unwrap()
        .unwrap();
    assert_eq!(data, pattern(1, 10)[8..]);
    let empty = ByteRange {
        start: 10,
        end: None,
    };
    let (_, data) = block_on(engine.get("data", "ten", Some(empty)))
        .unwrap()
        .unwrap();
    assert!(data.is_empty());
}

#[test]
fn bad_keys_are_refused() {
    let dir = TempDir::new("bad-keys");
    let engine = Engine::open(config(&dir.file("data.hyd"), 64 * MIB, 1, 4)).unwrap();
    let empty = block_on(engine.put("data", "", b"x".to_vec())).unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidKey);
    assert!(empty.to_string().contains("empty"), "{empty}");
    let long = block_on(engine.put("data", &"k".repeat(1025), b"x".to_vec())).unwrap_err();
    assert_eq!(long.kind(), ErrorKind::InvalidKey);
    assert!(long.to_string().contains("1024"), "{long}");
    assert_eq!(
        block_on(engine.get("Data", "k", None)).unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    assert_eq!(
        block_on(engine.delete("data", "")).unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    // The longest key is fine.
    block_on(engine.put("data", &"k".repeat(1024), b"x".to_vec())).unwrap();
    let stats = block_on(engine.stats()).unwrap();
    assert_eq!(stats[0].objects, 1, "refused puts stored nothing");
}

#[test]
fn too_large_objects_are_refused() {
    let dir = TempDir::new("too-large");
    let mut config = config(&dir.file("data.hyd"), 64 * MIB, 1, 16);
    config.object_bytes_max = MIB;
    let engine = Engine::open(config).unwrap();
    let error = block_on(engine.put("data", "big", vec![0; MIB as usize + 1])).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TooLarge);
}

fn open_error(config: EngineConfig) -> hydrant_engine::Error {
    match Engine::open(config) {
        Ok(_) => panic!("the engine opened a device it should refuse"),
        Err(error) => error,
    }
}

#[test]
fn a_device_of_a_few_kib_is_refused_and_left_unchanged() {
    let dir = TempDir::new("tiny");
    let path = dir.file("tiny.hyd");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    let before = file_fingerprint(&path);
    let error = open_error(EngineConfig::new(vec![DeviceConfig::new(&path)]));
    assert_eq!(error.kind(), ErrorKind::DeviceTooSmall, "{error}");
    assert!(error.to_string().contains("8192 bytes"), "{error}");
    assert_eq!(file_fingerprint(&path), before);
    // Asking to create a file that small is refused before anything is created.
    let new_path = dir.file("new-tiny.hyd");
    let error = open_error(config(&new_path, 16 * 1024, 1, 4));
    assert_eq!(error.kind(), ErrorKind::DeviceTooSmall, "{error}");
    assert!(!new_path.exists());
}

#[test]
fn a_device_size_off_the_alignment_is_refused_and_left_unchanged() {
    let dir = TempDir::new("misaligned");
    let path = dir.file("odd.hyd");
    std::fs::write(&path, vec![0u8; 64 * MIB as usize + 100]).unwrap();
    let before = file_fingerprint(&path);
    let error = open_error(EngineConfig::new(vec![DeviceConfig::new(&path)]));
    assert_eq!(error.kind(), ErrorKind::DeviceMisaligned, "{error}");
    assert!(error.to_string().contains("not a multiple"), "{error}");
    assert_eq!(file_fingerprint(&path), before);
}

#[test]
fn a_device_formatted_with_another_region_size_is_refused_and_left_unchanged() {
    let dir = TempDir::new("geometry");
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 64 * MIB, 1, 8)).unwrap();
    block_on(engine.put("data", "kept", pattern(3, 5000))).unwrap();
    engine.close();
    let before = file_fingerprint(&path);
    let error = open_error(config(&path, 64 * MIB, 1, 4));
    assert_eq!(error.kind(), ErrorKind::GeometryMismatch, "{error}");
    assert!(error.to_string().contains("region size 8388608"), "{error}");
    let error = open_error(config(&path, 64 * MIB, 2, 8));
    assert_eq!(error.kind(), ErrorKind::GeometryMismatch, "{error}");
    assert_eq!(file_fingerprint(&path), before);
    // Without explicit geometry the store's own is adopted, and the data is there.
    let engine = Engine::open(EngineConfig::new(vec![DeviceConfig::new(&path)])).unwrap();
    assert_eq!(engine.geometry().region_bytes, 8 * MIB);
    let (_, data) = block_on(engine.get("data", "kept", None)).unwrap().unwrap();
    assert_eq!(data, pattern(3, 5000));
}

#[test]
fn a_device_of_another_program_is_refused_unless_formatting_is_asked() {
    let dir = TempDir::new("foreign");
    let path = dir.file("foreign.img");
    let mut contents = vec![0u8; 64 * MIB as usize];
    contents[1024..1040].copy_from_slice(b"someone's data!!");
    std::fs::write(&path, &contents).unwrap();
    let before = file_fingerprint(&path);
    let error = open_error(config(&path, 64 * MIB, 1, 4));
    assert_eq!(error.kind(), ErrorKind::ForeignDevice, "{error}");
    assert_eq!(file_fingerprint(&path), before);
    let mut formatting = config(&path, 64 * MIB, 1, 4);
    formatting.format = FormatPolicy::Always;
    let engine = Engine::open(formatting).unwrap();
    block_on(engine.put("data", "mine", b"now".to_vec())).unwrap();
}

#[test]
fn a_blank_existing_device_is_formatted() {
    let dir = TempDir::new("blank");
    let path = dir.file("blank.hyd");
    std::fs::write(&path, vec![0u8; 32 * MIB as usize]).unwrap();
    let engine = Engine::open(config(&path, 32 * MIB, 1, 4)).unwrap();
    block_on(engine.put("data", "k", b"v".to_vec())).unwrap();
    assert_eq!(
        block_on(engine.get("data", "k", None)).unwrap().unwrap().1,
        b"v"
    );
}

#[test]
fn many_concurrent_writers_from_many_threads() {
    let dir = TempDir::new("concurrent");
    let engine =
        std::sync::Arc::new(Engine::open(config(&dir.file("data.hyd"), 256 * MIB, 2, 8)).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                // Many requests in flight at once from one thread: they share group commits.
                let puts: Vec<_> = (0..200)
                    .map(|index| {
                        engine.put(
                            "data",
                            &format!("t{thread}/{index}"),
                            pattern(thread * 1000 + index, 1000 + index as usize * 7),
                        )
                    })
                    .collect();
                for put in puts {
                    block_on(put).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for thread in 0..4u64 {
        for index in 0..200u64 {
            let (_, data) = block_on(engine.get("data", &format!("t{thread}/{index}"), None))
                .unwrap()
                .unwrap();
            assert!(data == pattern(thread * 1000 + index, 1000 + index as usize * 7));
        }
    }
    let stats = block_on(engine.stats()).unwrap();
    let puts: u64 = stats.iter().map(|shard| shard.counters.puts).sum();
    let flushes: u64 = stats.iter().map(|shard| shard.flushes).sum();
    assert_eq!(puts, 800);
    assert!(
        flushes < puts,
        "group commit shares flushes: {flushes} flushes for {puts} puts"
    );
}

#[test]
fn two_devices_form_one_store_and_must_stay_together_and_in_order() {
    let dir = TempDir::new("two-devices");
    let first = dir.file("first.hyd");
    let second = dir.file("second.hyd");
    let devices = |order: [&std::path::Path; 2]| {
        let mut config = EngineConfig::new(
            order
                .iter()
                .map(|path| DeviceConfig::create(*path, 48 * MIB))
                .collect(),
        );
        config.shards = Some(2);
        config.region_bytes = Some(4 * MIB);
        config.chunk_bytes = Some(MIB as u32);
        config.arena_bytes = 16 * MIB as usize;
        config
    };
    let engine = Engine::open(devices([&first, &second])).unwrap();
    // About 25 MB per shard: more than its 20 MiB share of the first device, less than what it
    // can fill before reclaim starts (its regions less reclaim's reserve and the room kept for
    // index checkpoints), so both devices hold data and nothing is evicted.
    for index in 0..25u64 {
        block_on(engine.put("data", &format!("o{index}"), pattern(index, 2_000_000))).unwrap();
    }
    engine.close();
    let head_has_entries = |path: &std::path::Path| {
        let bytes = std::fs::read(path).unwrap();
        bytes
            .chunks(4096)
            .filter(|block| &block[..4] == b"HENT")
            .count()
    };
    assert!(
        head_has_entries(&first) > 0 && head_has_entries(&second) > 0,
        "entries on both devices"
    );

    let swapped = open_error(devices([&second, &first]));
    assert_eq!(swapped.kind(), ErrorKind::GeometryMismatch, "{swapped}");
    assert!(swapped.to_string().contains("order"), "{swapped}");
    let mut alone = devices([&first, &second]);
    alone.devices.truncate(1);
    let error = open_error(alone);
    assert_eq!(error.kind(), ErrorKind::GeometryMismatch, "{error}");

    let engine = Engine::open(devices([&first, &second])).unwrap();
    for index in 0..25u64 {
        let (_, data) = block_on(engine.get("data", &format!("o{index}"), None))
            .unwrap()
            .expect("stored");
        assert!(data == pattern(index, 2_000_000));
    }
}

#[test]
fn one_damaged_superblock_copy_is_survived() {
    use std::os::unix::fs::FileExt;
    let dir = TempDir::new("superblock-copy");
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    block_on(engine.put("data", "kept", pattern(4, 10_000))).unwrap();
    engine.close();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0xEE; 64], 100).unwrap(); // inside copy 0
    file.sync_all().unwrap();
    let engine = Engine::open(config(&path, 64 * MIB, 1, 4)).unwrap();
    assert_eq!(
        block_on(engine.get("data", "kept", None))
            .unwrap()
            .unwrap()
            .1,
        pattern(4, 10_000)
    );
    engine.close();
    file.write_all_at(&[0xEE; 64], 65_536 + 100).unwrap(); // and copy 1
    file.sync_all().unwrap();
    let error = open_error(config(&path, 64 * MIB, 1, 4));
    assert_eq!(error.kind(), ErrorKind::ChecksumMismatch, "{error}");
}

/// What a version says of itself beside its bytes: the time it was written, and the MD5 tag its
/// writer gave (from memory, or on a streamed put's last chunk). Both come back from HEAD, GET
/// and LIST, and again after the store is reopened (recovery reads them from the headers).
#[test]
fn a_versions_time_and_md5_tag_come_back_after_reopening() {
    use hydrant_engine::{Md5Tag, ObjectKey, Precondition};
    let dir = TempDir::new("stamps");
    let path = dir.file("data.hyd");
    let engine = Engine::open(config(&path, 256 * MIB, 2, 16)).unwrap();
    let started = std::time::SystemTime::now();
    let whole = Md5Tag::whole([0x5a; 16]);
    let parts = Md5Tag {
        digest: [0xc3; 16],
        parts: 3,
    };
    let key = |name: &str| ObjectKey::new("data", name).unwrap();
    block_on(engine.put_tagged(
        key("tagged"),
        pattern(1, 70_000),
        Precondition::Any,
        Some(whole),
        &Default::default(),
    ))
    .unwrap();
    block_on(engine.put("data", "untagged", pattern(2, 5_000))).unwrap();
    // A streamed put of several chunks: the tag comes with the last one.
    let streamed_bytes = 9 * MIB as usize + 4321;
    let data = pattern(3, streamed_bytes);
    let (sink, done) = engine
        .put_stream_key(
            key("streamed"),
            streamed_bytes as u64,
            Precondition::Any,
            &Default::default(),
        )
        .unwrap();
    let done = std::thread::spawn(move || block_on(done));
    let chunk_bytes = engine.chunk_bytes() as usize;
    for (index, piece) in data.chunks(chunk_bytes).enumerate() {
        let mut chunk = block_on(engine.streamed_chunk(piece.len()));
        chunk.data.extend_from_slice(piece);
        if (index + 1) * chunk_bytes >= streamed_bytes {
            chunk.md5 = Some(parts);
        }
        assert!(block_on(sink.send(chunk)));
    }
    drop(sink);
    done.join().unwrap().unwrap();
    let finished = std::time::SystemTime::now();

    let stamps = |engine: &Engine| {
        ["streamed", "tagged", "untagged"].map(|name| {
            let head = block_on(engine.head("data", name))
                .unwrap()
                .expect("stored");
            let (got, _) = block_on(engine.get("data", name, None))
                .unwrap()
                .expect("stored");
            assert_eq!(got.stamp, head.stamp, "{name}: GET and HEAD agree");
            head.stamp
        })
    };
    let before = stamps(&engine);
    let listed: Vec<_> = block_on(engine.list("data", "", None, 10))
        .unwrap()
        .into_iter()
        .map(|meta| meta.stamp)
        .collect();
    assert_eq!(listed, before, "LIST agrees");
    assert_eq!(
        before.map(|stamp| stamp.md5),
        [Some(parts), Some(whole), None]
    );
    for stamp in before {
        let written = stamp.modified().expect("a time is kept");
        assert!(
            written >= started - std::time::Duration::from_millis(1) && written <= finished,
            "{stamp:?} is the time of the write"
        );
    }
    engine.close();
    let engine = Engine::open(config(&path, 256 * MIB, 2, 16)).unwrap();
    assert_eq!(stamps(&engine), before, "the same after reopening");
}

/// An object's attributes (its Content-Type, user metadata...) come back with HEAD and GET of
/// that version only, from memory puts and streamed ones, after reclaim has moved the entry
/// and after the store is reopened; attributes too large are refused with nothing written.
#[test]
fn an_objects_attributes_come_back_with_its_version_through_reclaim_and_reopening() {
    use hydrant_engine::{Attributes, ObjectKey, Precondition, ATTRIBUTES_BYTES_MAX};
    let dir = TempDir::new("attributes");
    let path = dir.file("data.hyd");
    // One shard of eight 1 MiB regions, so that the puts below make reclaim relocate.
    let open = || Engine::open(config(&path, 9 * MIB, 1, 1)).unwrap();
    let engine = open();
    let key = |name: &str| ObjectKey::new("data", name).unwrap();
    let described = |content_type: &str, epoch: &str| Attributes {
        content_type: Some(content_type.to_string()),
        cache_control: Some("no-cache".to_string()),
        metadata: vec![
            ("epoch".to_string(), epoch.to_string()),
            ("rank".to_string(), "0".to_string()),
        ],
        ..Default::default()
    };
    let hot = described("application/json", "1");
    block_on(engine.put_tagged(
        key("hot"),
        pattern(1, 100_000),
        Precondition::Any,
        None,
        &hot,
    ))
    .unwrap();
    // Streamed, of several chunks: the first chunk's header holds them.
    let streamed = described("application/x-tar", "2");
    let streamed_bytes = 700_000;
    let (sink, done) = engine
        .put_stream_key(
            key("streamed"),
            streamed_bytes as u64,
            Precondition::Any,
            &streamed,
        )
        .unwrap();
    let done = std::thread::spawn(move || block_on(done));
    let data = pattern(2, streamed_bytes);
    assert!(data.len() > 2 * engine.chunk_bytes() as usize);
    for piece in data.chunks(engine.chunk_bytes() as usize) {
        let mut chunk = block_on(engine.streamed_chunk(piece.len()));
        chunk.data.extend_from_slice(piece);
        assert!(block_on(sink.send(chunk)));
    }
    drop(sink);
    done.join().unwrap().unwrap();
    // A version without attributes has none, whatever the one before had.
    block_on(engine.put_tagged(
        key("replaced"),
        pattern(3, 10),
        Precondition::Any,
        None,
        &described("text/plain", "3"),
    ))
    .unwrap();
    block_on(engine.put("data", "replaced", pattern(4, 10))).unwrap();
    // Too large for an entry header: refused, and the key stays absent.
    let too_large = Attributes {
        content_type: Some("t".repeat(ATTRIBUTES_BYTES_MAX)),
        ..Default::default()
    };
    let error = block_on(engine.put_tagged(
        key("refused"),
        pattern(5, 10),
        Precondition::Any,
        None,
        &too_large,
    ))
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AttributesTooLarge, "{error}");
    assert!(block_on(engine.head("data", "refused")).unwrap().is_none());

    let check = |engine: &Engine| {
        for (name, want, data) in [
            ("hot", &hot, pattern(1, 100_000)),
            ("streamed", &streamed, pattern(2, streamed_bytes)),
            ("replaced", &Attributes::default(), pattern(4, 10)),
        ] {
            let (meta, attributes) = block_on(engine.head_described(key(name)))
                .unwrap()
                .expect("stored");
            assert_eq!(&attributes, want, "{name}: HEAD");
            let read = block_on(engine.get_shared_described(key(name), None))
                .unwrap()
                .expect("stored");
            assert_eq!(&read.attributes, want, "{name}: GET");
            assert_eq!(read.meta.seq, meta.seq);
            assert!(read.data[..] == data[..], "{name}: the bytes");
        }
    };
    check(&engine);
    // Each version's header was read once for them (the two that have some), and not again.
    let attribute_reads = |engine: &Engine| {
        block_on(engine.stats()).unwrap()[0]
            .counters
            .attribute_reads
    };
    assert_eq!(attribute_reads(&engine), 2);
    check(&engine);
    assert_eq!(
        attribute_reads(&engine),
        2,
        "the second HEAD and GET read no header"
    );
    // Reclaim moves the visited objects' entries (headers and all) into new regions.
    for index in 0..200u64 {
        block_on(engine.put("data", &format!("cold-{index}"), pattern(index, 100_000))).unwrap();
        block_on(engine.get("data", "hot", None)).unwrap().unwrap();
        block_on(engine.get("data", "streamed", None))
            .unwrap()
            .unwrap();
        block_on(engine.get("data", "replaced", None))
            .unwrap()
            .unwrap();
    }
    let stats = block_on(engine.stats()).unwrap();
    assert!(stats[0].counters.relocations > 0, "{stats:?}");
    check(&engine);
    engine.close();
    check(&open());
}

/// A GET from NVMe of a version with attributes finds them in the first chunk's header block it
/// reads for the data (read with it in one read when the chunk is one checksum piece), not in a
/// read of its own; HEAD then finds them cached. The bytes and attributes are the ones stored.
#[test]
fn a_get_from_nvme_takes_the_attributes_from_the_header_it_reads() {
    use hydrant_engine::{Attributes, ObjectKey, Precondition};
    let dir = TempDir::new("attributes-with-data");
    let path = dir.file("data.hyd");
    let open = || Engine::open(config(&path, 48 * MIB, 1, 4)).unwrap();
    let engine = open();
    let key = |name: &str| ObjectKey::new("data", name).unwrap();
    let objects = [
        ("one-piece", 4096usize, None),
        ("pieces", 200_000, None),
        ("chunks", 2_500_000, None),
        ("ranged", 200_000, Some(100_000..150_000u64)),
        ("one-piece-ranged", 4096, Some(100..200)),
        ("native", 4096, None),
    ];
    let described = |name: &str| Attributes {
        content_type: Some(format!("application/{name}")),
        checksum: Some(("CRC32C".to_string(), "yZRlqg==".to_string())),
        ..Default::default()
    };
    for (index, (name, bytes, _)) in objects.iter().enumerate() {
        block_on(engine.put_tagged(
            key(name),
            pattern(index as u64, *bytes),
            Precondition::Any,
            None,
            &described(name),
        ))
        .unwrap();
    }
    engine.close();
    // Reopened: nothing in the DRAM tier or the attributes cache, every read from the file.
    let engine = open();
    let attribute_reads = |engine: &Engine| {
        block_on(engine.stats()).unwrap()[0]
            .counters
            .attribute_reads
    };
    for (index, (name, bytes, range)) in objects.iter().enumerate() {
        if *name == "native" {
            continue;
        }
        let want = range.clone().unwrap_or(0..*bytes as u64);
        let byte_range = range.as_ref().map(|range| ByteRange {
            start: range.start,
            end: Some(range.end),
        });
        let read = block_on(engine.get_shared_described(key(name), byte_range))
            .unwrap()
            .expect("stored");
        assert_eq!(read.attributes, described(name), "{name}: GET");
        let data = pattern(index as u64, *bytes);
        assert!(
            read.data[..] == data[want.start as usize..want.end as usize],
            "{name}: the bytes"
        );
        let (_, attributes) = block_on(engine.head_described(key(name)))
            .unwrap()
            .expect("stored");
        assert_eq!(attributes, described(name), "{name}: HEAD");
    }
    assert_eq!(
        attribute_reads(&engine),
        0,
        "no header block was read for the attributes alone"
    );
    // A read that does not want them (the native protocol's) reads the data alone: a HEAD
    // then reads the header block.
    let (index, (name, bytes, _)) = (5, objects[5].clone());
    let read = block_on(engine.get_shared_key(key(name), None))
        .unwrap()
        .expect("stored");
    assert!(read.data[..] == pattern(index, bytes)[..]);
    let (_, attributes) = block_on(engine.head_described(key(name)))
        .unwrap()
        .expect("stored");
    assert_eq!(attributes, described(name));
    assert_eq!(attribute_reads(&engine), 1);
}

/// A checksum known only once every byte has come (an S3 trailer) goes in the last chunk's
/// header of a streamed put: the first chunk's attributes name its algorithm, and GET and HEAD
/// answer the value, from the header they read, after the store is reopened too. A put whose
/// value never came answers no checksum, never the empty promise.
#[test]
fn a_checksum_given_with_the_last_chunk_is_answered_from_its_header() {
    use hydrant_engine::{Attributes, ObjectKey, Precondition};
    let dir = TempDir::new("closing-checksum");
    let path = dir.file("data.hyd");
    let open = || Engine::open(config(&path, 48 * MIB, 1, 4)).unwrap();
    let engine = open();
    let key = |name: &str| ObjectKey::new("data", name).unwrap();
    let chunk_bytes = engine.chunk_bytes() as usize;
    let promised = Attributes {
        content_type: Some("application/x-tar".into()),
        checksum: Some(("SHA256".into(), String::new())),
        ..Default::default()
    };
    let value = "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=";
    // (name, bytes, the value given with the last chunk)
    let objects = [
        ("two-chunks", 2 * chunk_bytes - 100, Some(value)),
        ("three-chunks", 2 * chunk_bytes + 1, Some(value)),
        ("never-given", 2 * chunk_bytes, None),
    ];
    for (index, (name, bytes, given)) in objects.iter().enumerate() {
        let data = pattern(index as u64, *bytes);
        let (sink, done) = engine
            .put_stream_key(key(name), *bytes as u64, Precondition::Any, &promised)
            .unwrap();
        let done = std::thread::spawn(move || block_on(done));
        for (at, piece) in data.chunks(chunk_bytes).enumerate() {
            let mut chunk = block_on(engine.streamed_chunk(piece.len()));
            chunk.data.extend_from_slice(piece);
            if (at + 1) * chunk_bytes >= *bytes {
                chunk.checksum = given.map(|value| ("SHA256".to_string(), value.to_string()));
            }
            assert!(block_on(sink.send(chunk)));
        }
        drop(sink);
        done.join().unwrap().unwrap();
    }
    let expected = |given: Option<&str>| Attributes {
        checksum: given.map(|value| ("SHA256".to_string(), value.to_string())),
        ..promised.clone()
    };
    let check = |engine: &Engine| {
        for (index, (name, bytes, given)) in objects.iter().enumerate() {
            let (_, attributes) = block_on(engine.head_described(key(name)))
                .unwrap()
                .expect("stored");
            assert_eq!(attributes, expected(*given), "{name}: HEAD");
            let read = block_on(engine.get_shared_described(key(name), None))
                .unwrap()
                .expect("stored");
            assert_eq!(read.attributes, expected(*given), "{name}: GET");
            assert!(read.data[..] == pattern(index as u64, *bytes)[..], "{name}");
        }
    };
    check(&engine);
    engine.close();
    // Reopened: nothing cached; a GET reads the first chunk's header with the data, then the
    // last chunk's for the value.
    let engine = open();
    for (index, (name, bytes, given)) in objects.iter().enumerate() {
        let read = block_on(engine.get_shared_described(key(name), None))
            .unwrap()
            .expect("stored");
        assert_eq!(
            read.attributes,
            expected(*given),
            "{name}: GET after reopening"
        );
        assert!(read.data[..] == pattern(index as u64, *bytes)[..], "{name}");
    }
    check(&engine);
}

/// `log_bytes` counts what the device takes for what is stored: each put of an object no
/// larger than a chunk places a 4 KiB header block and its data padded to whole blocks; a
/// delete places its tombstone's block.
#[test]
fn the_log_counts_every_entry_it_places_with_headers_and_padding() {
    let dir = TempDir::new("log-bytes");
    let engine = Engine::open(config(&dir.path().join("data.hyd"), 256 * MIB, 1, 16)).unwrap();
    let log_bytes = |engine: &Engine| {
        let stats = block_on(engine.stats()).unwrap();
        stats[0].counters.log_bytes
    };
    let before = log_bytes(&engine);
    let mut expected = 0;
    for (index, size) in [1usize, 100, 1024, 4095, 4096, 4097, 65_536, 100_000]
        .into_iter()
        .enumerate()
    {
        block_on(engine.put(
            "data",
            &format!("sized-{index}"),
            pattern(index as u64, size),
        ))
        .unwrap();
        expected += 4096 + size.div_ceil(4096) as u64 * 4096;
    }
    assert_eq!(log_bytes(&engine) - before, expected);
    assert!(block_on(engine.delete("data", "sized-0")).unwrap());
    assert_eq!(log_bytes(&engine) - before, expected + 4096);
}
