//! Helpers shared by the engine's whole-system tests: real files under the target directory,
//! opened by the engine with O_DIRECT.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hydrant_engine::device::DeviceConfig;
use hydrant_engine::EngineConfig;

pub const MIB: u64 = 1024 * 1024;

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic bytes for (seed, len): what a test wrote can be regenerated to compare.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    data
}

/// A small engine on one data file: regions of `region_mib`, small arenas, two shards unless
/// said otherwise.
pub fn config(path: &Path, bytes: u64, shards: usize, region_mib: u64) -> EngineConfig {
    let mut config = EngineConfig::new(vec![DeviceConfig::create(path, bytes)]);
    config.shards = Some(shards);
    config.region_bytes = Some(region_mib * MIB);
    // Small regions get small chunks, so that a region holds several.
    config.chunk_bytes = Some((region_mib * MIB / 4).min(4 * MIB) as u32);
    config.arena_bytes = 32 * MIB as usize;
    config
}

/// A cheap fingerprint of a whole file, to show that it was left unchanged.
pub fn file_fingerprint(path: &Path) -> (u64, u32) {
    let bytes = std::fs::read(path).expect("read file");
    (bytes.len() as u64, crc32c::crc32c(&bytes))
}
