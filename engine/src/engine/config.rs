//! The engine's configuration: every option with its documented default, and the layout it
//! gives a set of devices.

use super::*;

pub const REGION_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
pub const CHUNK_BYTES_DEFAULT: u32 = 4 * 1024 * 1024;
pub const CRC_BLOCK_BYTES_DEFAULT: u32 = 64 * 1024;
/// Each shard needs an open region plus the reserve kept for reclaim.
pub(super) const REGIONS_PER_SHARD_MIN: u64 = 3;
/// What to do with devices that do not already hold this store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatPolicy {
    /// Format devices that are blank (created now, or all zeros where the superblocks go);
    /// refuse devices holding anything else.
    IfBlank,
    /// Format every device, destroying what it holds.
    Always,
}

/// How to open an engine. Every option has a default (see `EngineConfig::new`).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub devices: Vec<DeviceConfig>,
    /// Shards (threads, one per core). Default: as formatted, or the number of CPUs for a new
    /// store.
    pub shards: Option<usize>,
    /// Region size. Default: as formatted, or 64 MiB.
    pub region_bytes: Option<u64>,
    /// Objects larger than this are stored in chunks of this size. Default: as formatted, or
    /// 4 MiB.
    pub chunk_bytes: Option<u32>,
    /// Data is checksummed in pieces of this size, so a range read verifies only what it reads.
    /// Default: as formatted, or 64 KiB.
    pub crc_block_bytes: Option<u32>,
    pub format: FormatPolicy,
    /// Pinned buffer memory per shard. Default 64 MiB.
    pub arena_bytes: usize,
    /// Device operations in flight per shard. Default 64.
    pub io_depth_max: usize,
    /// Device bytes in flight per shard, raised to one entry (a chunk and its 4 KiB header) if
    /// smaller; a read or write larger than this goes alone. Some devices serve large reads
    /// fastest with few in flight (measure yours with `fio-profiles/randread-1m-depths.fio`).
    /// Default 8 MiB.
    pub io_bytes_in_flight_max: u64,
    /// Under load, how long a shard may wait to gather completions before submitting more.
    /// Default 100 µs.
    pub completion_batch_wait_us: u32,
    /// Provided 4 KiB receive buffers per shard, shared by its connections' multishot receives
    /// (a power of two up to 32768; 0: each receive goes into its connection's own buffer).
    /// Default 256 (1 MiB).
    pub receive_buffers: u16,
    /// Requests queued for one shard before senders wait. Default 1024.
    pub inbox_requests_max: usize,
    /// Requests one shard works on at once. Default 256.
    pub requests_in_flight_max: usize,
    /// The largest object a put accepts (each shard also holds at most half of its space in
    /// one object). Default 5 TiB, S3's limit.
    pub object_bytes_max: u64,
    /// Bytes of streamed puts' chunks held in memory at once, all shards and connections
    /// together; writers wait while it is reached. Default 128 MiB (32 chunks: enough to keep
    /// the devices busy, since each shard writes at most 4 streamed chunks at once).
    pub streamed_bytes_max: u64,
    /// Pin shard threads to cores. Default true.
    pub pin_threads: bool,
    /// The cores to pin shards to, shard i on `cpus[i % len]`. Default: shard i on core i. Use it
    /// to keep shards near their NVMe's interrupts or NUMA node.
    pub cpus: Option<Vec<usize>>,
    /// The origins behind the cache buckets. Default: none (every bucket lives on NVMe only).
    pub origins: Option<OriginConfig>,
    /// Memory for the DRAM tier, all shards together (each takes an equal share); 0: none.
    /// Default 256 MiB.
    pub dram_bytes: u64,
    /// The write budget for admitting origin data to NVMe, all shards together, in bytes per
    /// second (client writes are not counted). Default: none.
    pub admission_bytes_per_second: Option<u64>,
    /// When each shard writes a checkpoint of its index (restart then scans only the log
    /// written after it). Default: every 16 filled regions and on close.
    pub checkpoints: crate::store::CheckpointPolicy,
}

/// The range `EngineConfig::io_bytes_in_flight_max` accepts.
pub const IO_BYTES_IN_FLIGHT_MIN: u64 = 4 << 10;
pub const IO_BYTES_IN_FLIGHT_MAX: u64 = 1 << 30;

impl EngineConfig {
    pub fn new(devices: Vec<DeviceConfig>) -> EngineConfig {
        EngineConfig {
            devices,
            shards: None,
            region_bytes: None,
            chunk_bytes: None,
            crc_block_bytes: None,
            format: FormatPolicy::IfBlank,
            arena_bytes: 64 * 1024 * 1024,
            io_depth_max: 64,
            io_bytes_in_flight_max: crate::rt::IO_BYTES_MAX_DEFAULT,
            completion_batch_wait_us: 100,
            receive_buffers: crate::rt::RECEIVE_BUFFERS_DEFAULT,
            inbox_requests_max: 1024,
            requests_in_flight_max: 256,
            object_bytes_max: 5 << 40,
            streamed_bytes_max: 128 << 20,
            pin_threads: true,
            cpus: None,
            origins: None,
            dram_bytes: 256 << 20,
            admission_bytes_per_second: None,
            checkpoints: crate::store::CheckpointPolicy::default(),
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::new(ErrorKind::InvalidConfig, message));
        if self.devices.is_empty() {
            return invalid("at least one device is needed".into());
        }
        if let Some(shards) = self.shards {
            if shards == 0 || shards > 1024 {
                return invalid(format!("shards must be 1-1024, not {shards}"));
            }
        }
        if let Some(region_bytes) = self.region_bytes {
            if !(1 << 20..=REGION_BYTES_MAX).contains(&region_bytes)
                || region_bytes % BLOCK_BYTES as u64 != 0
            {
                return invalid(format!(
                    "region size {region_bytes} must be a multiple of 4 KiB between 1 MiB and {REGION_BYTES_MAX}"
                ));
            }
        }
        if let Some(chunk_bytes) = self.chunk_bytes {
            if chunk_bytes < BLOCK_BYTES as u32
                || chunk_bytes > CHUNK_BYTES_MAX
                || chunk_bytes % BLOCK_BYTES as u32 != 0
            {
                return invalid(format!(
                    "chunk size {chunk_bytes} must be a multiple of 4 KiB between 4 KiB and {CHUNK_BYTES_MAX}"
                ));
            }
        }
        if let Some(crc_block_bytes) = self.crc_block_bytes {
            if crc_block_bytes < CRC_BLOCK_BYTES_MIN || !crc_block_bytes.is_power_of_two() {
                return invalid(format!("checksum piece size {crc_block_bytes} must be a power of two of at least 4 KiB"));
            }
        }
        if self.io_depth_max == 0 || self.io_depth_max > 4096 {
            return invalid(format!(
                "io_depth_max must be 1-4096, not {}",
                self.io_depth_max
            ));
        }
        if !(IO_BYTES_IN_FLIGHT_MIN..=IO_BYTES_IN_FLIGHT_MAX).contains(&self.io_bytes_in_flight_max)
        {
            return invalid(format!(
                "io_bytes_in_flight_max must be 4 KiB-1 GiB, not {}",
                self.io_bytes_in_flight_max
            ));
        }
        if !crate::rt::receive_buffers_valid(self.receive_buffers) {
            return invalid(format!(
                "receive_buffers must be 0 or a power of two up to 32768, not {}",
                self.receive_buffers
            ));
        }
        if self.inbox_requests_max == 0 || self.requests_in_flight_max == 0 {
            return invalid(
                "inbox_requests_max and requests_in_flight_max must be positive".into(),
            );
        }
        Ok(())
    }
}

/// The geometry to format with, from the configuration and the defaults.
pub(super) struct Layout {
    pub(super) shards: u32,
    pub(super) region_bytes: u64,
    pub(super) chunk_bytes: u32,
    pub(super) crc_block_bytes: u32,
}

impl Layout {
    pub(super) fn requested(config: &EngineConfig) -> Layout {
        let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
        Layout {
            shards: config.shards.unwrap_or(cpus) as u32,
            region_bytes: config.region_bytes.unwrap_or(REGION_BYTES_DEFAULT),
            chunk_bytes: config.chunk_bytes.unwrap_or(CHUNK_BYTES_DEFAULT),
            crc_block_bytes: config.crc_block_bytes.unwrap_or(CRC_BLOCK_BYTES_DEFAULT),
        }
    }

    pub(super) fn device_bytes_min(&self) -> u64 {
        REGIONS_OFFSET_BYTES + REGIONS_PER_SHARD_MIN * self.shards as u64 * self.region_bytes
    }

    pub(super) fn check(&self) -> Result<()> {
        let checksums = self.chunk_bytes.div_ceil(self.crc_block_bytes) as usize;
        let header_room = crate::format::CRC_COUNT_MAX;
        if checksums > header_room {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a {}-byte chunk in {}-byte checksum pieces needs {checksums} checksums; an entry header holds {header_room}",
                    self.chunk_bytes, self.crc_block_bytes
                ),
            ));
        }
        // A region holds its header and at least one entry of the largest size.
        if self.region_bytes < self.chunk_bytes as u64 + 2 * BLOCK_BYTES as u64 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a region of {} bytes cannot hold a chunk of {} bytes with its headers",
                    self.region_bytes, self.chunk_bytes
                ),
            ));
        }
        Ok(())
    }
}
