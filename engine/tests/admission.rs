//! Admission of origin data to a full NVMe tier, through the engine's public API with a
//! local-folder origin: a scan of one-hit objects larger than the tier does not flush it, and a
//! write budget bounds what misses write to NVMe.

mod common;

use common::{config, pattern, TempDir, MIB};
use hydrant_engine::rt::block_on;
use hydrant_engine::{Engine, OriginConfig};

const OBJECT_BYTES: usize = 64 * 1024;

fn engine_with_origin(dir: &TempDir, admission_bytes_per_second: Option<u64>) -> Engine {
    let origin = dir.path().join("origin");
    std::fs::create_dir_all(origin.join("data")).unwrap();
    let mut origins = OriginConfig::new();
    origins.default_url = Some(format!("file://{}", origin.display()));
    let mut config = config(&dir.file("data.hyd"), 12 * MIB, 1, 1);
    config.origins = Some(origins);
    config.dram_bytes = 0; // every read reaches NVMe or the origin
    config.admission_bytes_per_second = admission_bytes_per_second;
    Engine::open(config).unwrap()
}

fn put_at_origin(dir: &TempDir, name: &str, seed: u64) {
    std::fs::write(
        dir.path().join("origin").join("data").join(name),
        pattern(seed, OBJECT_BYTES),
    )
    .unwrap();
}

fn read(engine: &Engine, name: &str, seed: u64) {
    let (_, data) = block_on(engine.get("data", name, None))
        .unwrap()
        .unwrap_or_else(|| panic!("{name} is at the origin"));
    assert!(data == pattern(seed, OBJECT_BYTES), "{name}");
}

#[test]
fn a_scan_larger_than_the_tier_does_not_flush_what_is_read_again() {
    let dir = TempDir::new("admission-scan");
    let engine = engine_with_origin(&dir, None);
    put_at_origin(&dir, "hot", 1);
    // 400 one-hit objects (about 25 MiB on a 10 MiB tier), with the hot object read between.
    for index in 0..400u64 {
        put_at_origin(&dir, &format!("scan-{index}"), 100 + index);
    }
    for index in 0..400u64 {
        read(&engine, &format!("scan-{index}"), 100 + index);
        read(&engine, "hot", 1);
    }
    std::thread::sleep(std::time::Duration::from_millis(200)); // admissions in flight finish
    let stats = block_on(engine.stats()).unwrap();
    let admission = stats[0].admission;
    assert!(admission.rejected_cold > 100, "{admission:?}");
    assert!(
        block_on(engine.head("data", "hot"))
            .unwrap()
            .is_some_and(|meta| meta.seq > 0),
        "the object read again stays on NVMe"
    );
    // Objects stored and readable: the scan did not break correctness.
    read(&engine, "scan-399", 499);
}

#[test]
fn the_admission_write_budget_bounds_bytes_written_for_misses() {
    let dir = TempDir::new("admission-budget");
    // 256 KiB per second: a one-second burst holds four objects.
    let engine = engine_with_origin(&dir, Some(256 * 1024));
    for index in 0..40u64 {
        put_at_origin(&dir, &format!("o{index}"), index);
    }
    let started = std::time::Instant::now();
    for index in 0..40u64 {
        read(&engine, &format!("o{index}"), index);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let elapsed = started.elapsed().as_secs_f64();
    let admission = block_on(engine.stats()).unwrap()[0].admission;
    let allowed = 256.0 * 1024.0 * (1.0 + elapsed);
    assert!(
        admission.admitted_bytes as f64 <= allowed,
        "{admission:?} in {elapsed:.2} s"
    );
    assert!(admission.rejected_budget > 0, "{admission:?}");
}
