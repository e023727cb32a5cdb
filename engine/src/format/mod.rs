//! The on-disk format: superblocks, region headers and entry headers. Every structure is one
//! 4 KiB block, little-endian, with a CRC32C of its first 4092 bytes in its last four. The byte
//! diagrams are in docs/on-disk-format.md; the offsets below are the same diagrams in code.
//!
//! ```text
//! device:  [superblock copy 0 @ 0][superblock copy 1 @ 64 KiB] ... [region 0 @ 1 MiB][region 1]...
//! region:  [region header (4 KiB)][entry][entry]...            (append-only log)
//! entry:   [entry header (4 KiB)][data, padded to 4 KiB]
//! ```

mod checkpoint;
mod entry;
mod region;
mod superblock;

pub use checkpoint::CheckpointHeader;
pub(crate) use entry::CRC_COUNT_MAX;
pub use entry::{
    attributes_room, EntryHeader, EntryKind, ENTRY_FLAG_ATTRIBUTES, ENTRY_FLAG_DIRTY,
    ENTRY_FLAG_FROM_CLIENT,
};
pub use region::RegionHeader;
pub use superblock::{Superblock, SuperblockProblem};

/// The unit of the format: every structure and every entry starts on a multiple of it.
pub const BLOCK_BYTES: usize = 4096;
/// The format this build writes. Version 2 adds the void marker (an entry kind version 1 does
/// not know), version 3 an object's attributes in its first chunk's header (which a version 2
/// build would drop when it relocates the entry), version 4 a checksum among the attributes
/// (whose tag a version 3 build takes for damage), version 5 a checksum whose value is in the
/// version's last chunk header (which a version 4 build takes for damage), version 6 entries
/// written from a client's memory (`ENTRY_FLAG_FROM_CLIENT`), which recovery passes over when
/// they fail their checksums (where a version 5 build would end the log, dropping what
/// follows); an older store is read as it is and upgraded
/// when opened (its superblocks rewritten), so that an older build refuses it instead of
/// misreading a void marker or an object's attributes, or losing them.
pub const FORMAT_VERSION: u32 = 6;
/// The oldest format this build reads.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// Where the two superblock copies live.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 64 * 1024];
/// Regions start here; the space before holds the superblocks.
pub const REGIONS_OFFSET_BYTES: u64 = 1024 * 1024;
/// Every structure ends with a CRC32C of the bytes before it.
const CHECKSUM_OFFSET: usize = BLOCK_BYTES - 4;

pub const BUCKET_BYTES_MAX: usize = 63;
pub const KEY_BYTES_MAX: usize = 1024;
pub const ETAG_BYTES_MAX: usize = 64;
/// Bounds on the geometry a store may be formatted with.
pub const CHUNK_BYTES_MAX: u32 = 16 * 1024 * 1024;
pub const CRC_BLOCK_BYTES_MIN: u32 = 4096;
pub const REGION_BYTES_MAX: u64 = 1 << 30;

/// The placement hash written in the superblock: which shard owns (bucket, key).
pub const PLACEMENT_CRC32C: u32 = 1;

/// The shard that owns `(bucket, key)` among `shards`: CRC32C of bucket, a zero byte and key.
/// Written down in the superblock (PLACEMENT_CRC32C) because clients compute it too.
pub fn shard_of(bucket: &[u8], key: &[u8], shards: usize) -> usize {
    let hash = hydrant_crc::crc32c_append(
        hydrant_crc::crc32c_append(hydrant_crc::crc32c(bucket), &[0]),
        key,
    );
    hash as usize % shards
}

fn put_u16(block: &mut [u8], offset: usize, value: u16) {
    block[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
}

fn put_u32(block: &mut [u8], offset: usize, value: u32) {
    block[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(block: &mut [u8], offset: usize, value: u64) {
    block[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u16(block: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(block[offset..offset + 2].try_into().expect("2 bytes"))
}

fn get_u32(block: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(block[offset..offset + 4].try_into().expect("4 bytes"))
}

fn get_u64(block: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(block[offset..offset + 8].try_into().expect("8 bytes"))
}

/// Seal a block: write the CRC32C of everything before the checksum field into it.
fn seal_block(block: &mut [u8]) {
    assert_eq!(block.len(), BLOCK_BYTES);
    let checksum = hydrant_crc::crc32c(&block[..CHECKSUM_OFFSET]);
    put_u32(block, CHECKSUM_OFFSET, checksum);
}

fn block_checksum_ok(block: &[u8]) -> bool {
    block.len() >= BLOCK_BYTES
        && hydrant_crc::crc32c(&block[..CHECKSUM_OFFSET]) == get_u32(block, CHECKSUM_OFFSET)
}

/// The CRC32C of each `crc_block_bytes` piece of `data` (the last piece may be shorter).
pub fn data_checksums(data: &[u8], crc_block_bytes: usize) -> Vec<u32> {
    data.chunks(crc_block_bytes)
        .map(hydrant_crc::crc32c)
        .collect()
}

/// How many checksummed pieces `data_bytes` of data has.
pub fn crc_count(data_bytes: u64, crc_block_bytes: u32) -> usize {
    data_bytes.div_ceil(crc_block_bytes as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_stable() {
        // Clients compute the same function: these values must never change for a format version.
        assert_eq!(shard_of(b"bucket", b"key", 1), 0);
        let spread: std::collections::HashSet<usize> = (0..64)
            .map(|index| shard_of(b"data", format!("object-{index}").as_bytes(), 4))
            .collect();
        assert_eq!(spread.len(), 4, "64 keys reach all 4 shards");
        assert_eq!(
            shard_of(b"data", b"object-1", 1000),
            shard_of(b"data", b"object-1", 1000)
        );
    }
}
