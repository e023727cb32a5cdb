//! Opening an engine: check or format the devices, upgrade an older format, and start one shard
//! per superblock's shard, waiting until each has recovered its regions.

use crate::device::Device;
use crate::format::{Superblock, BLOCK_BYTES, REGIONS_OFFSET_BYTES};
use crate::origin::Origins;
use crate::rt::{channel, ReactorConfig};
use crate::shard::{self, ShardHandle, ShardPlan};
use crate::store::Geometry;
use crate::{Error, ErrorKind, Result};

use super::config::Layout;
use super::superblocks::*;
use super::{Engine, EngineConfig, EngineHandle, FormatPolicy};

impl Engine {
    /// Open (and format, as the policy allows) the devices, recover every shard and start
    /// serving.
    pub fn open(config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        let requested = Layout::requested(&config);
        requested.check()?;
        let devices = config
            .devices
            .iter()
            .map(|device| {
                // A new file is created only if it can hold the requested layout; an existing
                // device is checked against its own geometry once its superblock is read.
                let bytes_min = if device.path.exists() {
                    REGIONS_OFFSET_BYTES + BLOCK_BYTES as u64
                } else {
                    requested.device_bytes_min()
                };
                Device::open(device, bytes_min)
            })
            .collect::<Result<Vec<Device>>>()?;
        let states = match config.format {
            FormatPolicy::Always => devices.iter().map(|_| DeviceState::Blank).collect(),
            FormatPolicy::IfBlank => devices
                .iter()
                .map(read_device_state)
                .collect::<Result<Vec<_>>>()?,
        };
        let formatted: Vec<Superblock> = states
            .iter()
            .filter_map(|state| match state {
                DeviceState::Formatted(superblock) => Some(superblock.clone()),
                DeviceState::Blank => None,
            })
            .collect();
        let superblocks = if config.format == FormatPolicy::Always || formatted.is_empty() {
            for device in &devices {
                if device.bytes() < requested.device_bytes_min() {
                    return Err(Error::new(
                        ErrorKind::DeviceTooSmall,
                        format!(
                            "{} is {} bytes; {} shards of {}-byte regions need at least {} bytes",
                            device.path().display(),
                            device.bytes(),
                            requested.shards,
                            requested.region_bytes,
                            requested.device_bytes_min()
                        ),
                    ));
                }
            }
            format_devices(&devices, &requested)?
        } else if formatted.len() != devices.len() {
            return Err(Error::new(
                ErrorKind::GeometryMismatch,
                "some devices hold a hydrant store and others are blank; give the devices the store was formatted with, or format them all",
            ));
        } else {
            check_formatted(&config, &devices, &formatted)?;
            upgrade_format(&devices, formatted)?
        };
        let first = &superblocks[0];
        let geometry = Geometry {
            region_bytes: first.region_bytes,
            chunk_bytes: first.chunk_bytes,
            crc_block_bytes: first.crc_block_bytes,
            set_uuid: first.set_uuid,
        };
        let origins = config
            .origins
            .clone()
            .map(Origins::start)
            .transpose()?
            .map(std::sync::Arc::new);
        let mut engine = Engine {
            handle: EngineHandle {
                inboxes: Vec::new(),
                object_bytes_max: config.object_bytes_max,
                origins: origins.clone(),
                chunk_bytes: geometry.chunk_bytes,
                crc_block_bytes: geometry.crc_block_bytes,
                streamed_bytes: Default::default(),
                streamed_bytes_max: config.streamed_bytes_max,
            },
            threads: Vec::new(),
            devices,
            geometry: geometry.clone(),
        };
        let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
        let mut readiness = Vec::new();
        for shard in 0..first.shard_count {
            let (ready, ready_receiver) = channel::oneshot();
            let plan = ShardPlan {
                shard,
                cpu: config.pin_threads.then(|| match &config.cpus {
                    Some(list) if !list.is_empty() => list[shard as usize % list.len()],
                    _ => shard as usize % cpus,
                }),
                geometry: geometry.clone(),
                regions: shard_regions(&superblocks, shard),
                device_fds: engine.devices.iter().map(Device::raw_fd).collect(),
                arena_bytes: config.arena_bytes,
                reactor: ReactorConfig {
                    ring_entries: (config.io_depth_max as u32 * 2 + 8).next_power_of_two(),
                    io_depth_max: config.io_depth_max,
                    // At least one entry (a chunk and its header), so that the store's own
                    // reads and writes never have to go alone.
                    io_bytes_max: config
                        .io_bytes_in_flight_max
                        .max(u64::from(geometry.chunk_bytes) + BLOCK_BYTES as u64),
                    completion_batch_wait_us: config.completion_batch_wait_us,
                    receive_buffers: config.receive_buffers,
                },
                requests_in_flight_max: config.requests_in_flight_max,
                origins: origins.clone(),
                dram_bytes: config.dram_bytes / first.shard_count as u64,
                admission_bytes_per_second: config
                    .admission_bytes_per_second
                    .map(|rate| (rate / first.shard_count as u64).max(1)),
                checkpoints: config.checkpoints,
            };
            let started: ShardHandle = shard::start(plan, config.inbox_requests_max, ready)?;
            engine.handle.inboxes.push(started.inbox);
            engine.threads.extend(started.thread);
            readiness.push(ready_receiver);
        }
        for ready in readiness {
            match crate::rt::block_on(ready) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        "a shard thread stopped while opening (see the log: io_uring unavailable?)",
                    ))
                }
            }
        }
        Ok(engine)
    }
}
