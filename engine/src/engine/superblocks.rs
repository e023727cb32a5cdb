//! The devices' superblocks: reading what a device holds, checking a formatted set against
//! itself and the configuration, formatting blank devices, upgrading older formats, and each
//! shard's share of the regions.

use super::*;

/// What a device's superblocks say.
pub(super) enum DeviceState {
    Blank,
    Formatted(Superblock),
}

pub(super) fn read_device_state(device: &Device) -> Result<DeviceState> {
    if device.created() {
        return Ok(DeviceState::Blank);
    }
    let mut problems = Vec::new();
    let mut found: Option<Superblock> = None;
    for offset in SUPERBLOCK_OFFSETS {
        match Superblock::decode(&device.read_at(offset, BLOCK_BYTES)?) {
            Ok(superblock) => {
                if found.is_none() {
                    found = Some(superblock);
                }
            }
            Err(problem) => problems.push(problem),
        }
    }
    if let Some(superblock) = found {
        if !problems.is_empty() {
            log::warn!(
                "{}: one superblock copy is damaged; using the other",
                device.path().display()
            );
        }
        return Ok(DeviceState::Formatted(superblock));
    }
    let path = device.path().display();
    if problems
        .iter()
        .all(|problem| *problem == SuperblockProblem::Blank)
    {
        let head = device.read_at(0, REGIONS_OFFSET_BYTES as usize)?;
        if head.iter().all(|&byte| byte == 0) {
            return Ok(DeviceState::Blank);
        }
    }
    if let Some(SuperblockProblem::Version(version)) = problems
        .iter()
        .find(|problem| matches!(problem, SuperblockProblem::Version(_)))
    {
        return Err(Error::new(
            ErrorKind::GeometryMismatch,
            format!("{path} holds a hydrant store of format version {version}, which this build does not read"),
        ));
    }
    if problems.contains(&SuperblockProblem::Corrupt) {
        return Err(Error::new(
            ErrorKind::ChecksumMismatch,
            format!("{path}: both hydrant superblock copies are damaged; format it to start over"),
        ));
    }
    Err(Error::new(
        ErrorKind::ForeignDevice,
        format!("{path} holds data that is not a hydrant store; refusing to overwrite it unless asked to format"),
    ))
}

pub(super) fn random_uuid() -> [u8; 16] {
    let mut uuid = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into the array.
    let filled = unsafe { libc::getrandom(uuid.as_mut_ptr().cast(), uuid.len(), 0) };
    if filled != uuid.len() as isize {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        uuid = (nanos ^ ((std::process::id() as u128) << 64)).to_le_bytes();
    }
    uuid
}

pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Check that a formatted device set matches itself and the explicit configuration.
pub(super) fn check_formatted(
    config: &EngineConfig,
    devices: &[Device],
    superblocks: &[Superblock],
) -> Result<()> {
    let first = &superblocks[0];
    let mismatch = |message: String| Err(Error::new(ErrorKind::GeometryMismatch, message));
    for (position, (device, superblock)) in devices.iter().zip(superblocks).enumerate() {
        let path = device.path().display();
        if superblock.set_uuid != first.set_uuid
            || superblock.device_count as usize != devices.len()
        {
            return mismatch(format!(
                "{path} belongs to another device set (formatted as {} of {} devices); give the devices of one store, in order",
                superblock.device_index + 1,
                superblock.device_count
            ));
        }
        if superblock.device_index as usize != position {
            return mismatch(format!(
                "{path} is device {} of its store but was given as device {}; keep the order they were formatted in",
                superblock.device_index + 1,
                position + 1
            ));
        }
        if superblock.device_bytes > device.bytes() {
            return mismatch(format!(
                "{path} was formatted with {} bytes but now has {}",
                superblock.device_bytes,
                device.bytes()
            ));
        }
        if superblock.placement_hash != PLACEMENT_CRC32C {
            return mismatch(format!(
                "{path} uses placement hash {}, unknown to this build",
                superblock.placement_hash
            ));
        }
    }
    let checks: [(&str, Option<u64>, u64); 4] = [
        ("region size", config.region_bytes, first.region_bytes),
        (
            "shard count",
            config.shards.map(|shards| shards as u64),
            first.shard_count as u64,
        ),
        (
            "chunk size",
            config.chunk_bytes.map(u64::from),
            first.chunk_bytes as u64,
        ),
        (
            "checksum piece size",
            config.crc_block_bytes.map(u64::from),
            first.crc_block_bytes as u64,
        ),
    ];
    for (name, requested, formatted) in checks {
        if let Some(requested) = requested {
            if requested != formatted {
                return mismatch(format!(
                    "{} was formatted with {name} {formatted}, not the {requested} asked for; \
                     open it with {formatted} or format it again (which erases it)",
                    devices[0].path().display()
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn format_devices(devices: &[Device], layout: &Layout) -> Result<Vec<Superblock>> {
    let set_uuid = random_uuid();
    let created_unix_ms = unix_ms();
    let mut superblocks = Vec::with_capacity(devices.len());
    for (position, device) in devices.iter().enumerate() {
        let region_count = (device.bytes() - REGIONS_OFFSET_BYTES) / layout.region_bytes;
        superblocks.push(Superblock {
            format_version: FORMAT_VERSION,
            device_bytes: device.bytes(),
            region_bytes: layout.region_bytes,
            regions_offset: REGIONS_OFFSET_BYTES,
            region_count: region_count as u32,
            shard_count: layout.shards,
            chunk_bytes: layout.chunk_bytes,
            crc_block_bytes: layout.crc_block_bytes,
            placement_hash: PLACEMENT_CRC32C,
            device_index: position as u32,
            device_count: devices.len() as u32,
            set_uuid,
            created_unix_ms,
        });
    }
    // Every check has passed before the first byte is written.
    for (device, superblock) in devices.iter().zip(&superblocks) {
        let block = superblock.encode();
        for offset in SUPERBLOCK_OFFSETS {
            device.write_durable(offset, &block)?;
        }
        log::info!(
            "formatted {}: {} regions of {} bytes for {} shards",
            device.path().display(),
            superblock.region_count,
            superblock.region_bytes,
            superblock.shard_count
        );
    }
    Ok(superblocks)
}

/// Rewrite the superblocks of devices formatted with an older version that this build reads
/// (both copies, each made durable, before anything else is written): from now on the store may
/// hold entries that an older build does not know, and such a build must refuse it.
pub(super) fn upgrade_format(
    devices: &[Device],
    superblocks: Vec<Superblock>,
) -> Result<Vec<Superblock>> {
    let mut upgraded = Vec::with_capacity(superblocks.len());
    for (device, mut superblock) in devices.iter().zip(superblocks) {
        if superblock.format_version < FORMAT_VERSION {
            let from = superblock.format_version;
            superblock.format_version = FORMAT_VERSION;
            let block = superblock.encode();
            // The second copy first: until both are upgraded the first (which every build
            // reads first) still says the old version, so a crash in between leaves a store
            // that older builds read correctly and this one upgrades again.
            for offset in SUPERBLOCK_OFFSETS.into_iter().rev() {
                device.write_durable(offset, &block)?;
            }
            log::info!(
                "{}: upgraded the store from format version {from} to {FORMAT_VERSION}",
                device.path().display()
            );
        }
        upgraded.push(superblock);
    }
    Ok(upgraded)
}

/// Regions of `shard` on each device: a contiguous share of every device.
pub(super) fn shard_regions(superblocks: &[Superblock], shard: u32) -> Vec<(u32, u32, u64)> {
    let mut regions = Vec::new();
    for (device, superblock) in superblocks.iter().enumerate() {
        let count = superblock.region_count as u64;
        let shards = superblock.shard_count as u64;
        let first = shard as u64 * count / shards;
        let end = (shard as u64 + 1) * count / shards;
        for region_index in first..end {
            let offset = superblock.regions_offset + region_index * superblock.region_bytes;
            regions.push((device as u32, region_index as u32, offset));
        }
    }
    regions
}
