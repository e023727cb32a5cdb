//! The superblock: which store a device belongs to and its geometry.
//!
//! ```text
//! offset size field
//!      0    8 magic "HYDRANT\0"
//!      8    4 format_version
//!     12    4 block_bytes (4096)
//!     16    8 device_bytes        bytes of the device in use when formatted
//!     24    8 region_bytes
//!     32    8 regions_offset      byte offset of region 0
//!     40    4 region_count        regions on this device
//!     44    4 shard_count
//!     48    4 chunk_bytes         objects larger than this are stored as chunks
//!     52    4 crc_block_bytes     data is checksummed in pieces of this size
//!     56    4 placement_hash      1 = CRC32C(bucket, 0, key) % shard_count
//!     60    4 device_index        this device's place in the set
//!     64    4 device_count        devices formatted together
//!     68    4 reserved (0)
//!     72   16 set_uuid            the same on every device of the set
//!     88    8 created_unix_ms
//!     96 3996 zero
//!   4092    4 crc32c of bytes 0..4092
//! ```

use super::*;

const MAGIC: [u8; 8] = *b"HYDRANT\0";
const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + 8;
const BLOCK_BYTES_OFFSET: usize = VERSION_OFFSET + 4;
const DEVICE_BYTES_OFFSET: usize = BLOCK_BYTES_OFFSET + 4;
const REGION_BYTES_OFFSET: usize = DEVICE_BYTES_OFFSET + 8;
const REGIONS_OFFSET_OFFSET: usize = REGION_BYTES_OFFSET + 8;
const REGION_COUNT_OFFSET: usize = REGIONS_OFFSET_OFFSET + 8;
const SHARD_COUNT_OFFSET: usize = REGION_COUNT_OFFSET + 4;
const CHUNK_BYTES_OFFSET: usize = SHARD_COUNT_OFFSET + 4;
const CRC_BLOCK_BYTES_OFFSET: usize = CHUNK_BYTES_OFFSET + 4;
const PLACEMENT_HASH_OFFSET: usize = CRC_BLOCK_BYTES_OFFSET + 4;
const DEVICE_INDEX_OFFSET: usize = PLACEMENT_HASH_OFFSET + 4;
const DEVICE_COUNT_OFFSET: usize = DEVICE_INDEX_OFFSET + 4;
const SET_UUID_OFFSET: usize = DEVICE_COUNT_OFFSET + 4 + 4;
const CREATED_OFFSET: usize = SET_UUID_OFFSET + 16;
const END_OFFSET: usize = CREATED_OFFSET + 8;
const _: () = assert!(END_OFFSET == 96 && END_OFFSET <= CHECKSUM_OFFSET);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format version the device was written with (`FORMAT_VERSION` for new ones; `encode`
    /// always writes `FORMAT_VERSION`).
    pub format_version: u32,
    pub device_bytes: u64,
    pub region_bytes: u64,
    pub regions_offset: u64,
    pub region_count: u32,
    pub shard_count: u32,
    pub chunk_bytes: u32,
    pub crc_block_bytes: u32,
    pub placement_hash: u32,
    pub device_index: u32,
    pub device_count: u32,
    pub set_uuid: [u8; 16],
    pub created_unix_ms: u64,
}

/// Why a block is not a usable superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuperblockProblem {
    /// All zero: nothing was ever written here.
    Blank,
    /// Not hydrant's magic: another program's data.
    Foreign,
    /// hydrant's magic but a bad checksum: a torn or damaged copy.
    Corrupt,
    /// A format version this build does not read.
    Version(u32),
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_BYTES];
        block[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&MAGIC);
        put_u32(&mut block, VERSION_OFFSET, FORMAT_VERSION);
        put_u32(&mut block, BLOCK_BYTES_OFFSET, BLOCK_BYTES as u32);
        put_u64(&mut block, DEVICE_BYTES_OFFSET, self.device_bytes);
        put_u64(&mut block, REGION_BYTES_OFFSET, self.region_bytes);
        put_u64(&mut block, REGIONS_OFFSET_OFFSET, self.regions_offset);
        put_u32(&mut block, REGION_COUNT_OFFSET, self.region_count);
        put_u32(&mut block, SHARD_COUNT_OFFSET, self.shard_count);
        put_u32(&mut block, CHUNK_BYTES_OFFSET, self.chunk_bytes);
        put_u32(&mut block, CRC_BLOCK_BYTES_OFFSET, self.crc_block_bytes);
        put_u32(&mut block, PLACEMENT_HASH_OFFSET, self.placement_hash);
        put_u32(&mut block, DEVICE_INDEX_OFFSET, self.device_index);
        put_u32(&mut block, DEVICE_COUNT_OFFSET, self.device_count);
        block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16].copy_from_slice(&self.set_uuid);
        put_u64(&mut block, CREATED_OFFSET, self.created_unix_ms);
        seal_block(&mut block);
        block
    }

    pub fn decode(block: &[u8]) -> Result<Superblock, SuperblockProblem> {
        assert!(block.len() >= BLOCK_BYTES);
        let block = &block[..BLOCK_BYTES];
        if block.iter().all(|&byte| byte == 0) {
            return Err(SuperblockProblem::Blank);
        }
        if block[MAGIC_OFFSET..MAGIC_OFFSET + 8] != MAGIC {
            return Err(SuperblockProblem::Foreign);
        }
        if !block_checksum_ok(block) {
            return Err(SuperblockProblem::Corrupt);
        }
        let version = get_u32(block, VERSION_OFFSET);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version)
            || get_u32(block, BLOCK_BYTES_OFFSET) != BLOCK_BYTES as u32
        {
            return Err(SuperblockProblem::Version(version));
        }
        Ok(Superblock {
            format_version: version,
            device_bytes: get_u64(block, DEVICE_BYTES_OFFSET),
            region_bytes: get_u64(block, REGION_BYTES_OFFSET),
            regions_offset: get_u64(block, REGIONS_OFFSET_OFFSET),
            region_count: get_u32(block, REGION_COUNT_OFFSET),
            shard_count: get_u32(block, SHARD_COUNT_OFFSET),
            chunk_bytes: get_u32(block, CHUNK_BYTES_OFFSET),
            crc_block_bytes: get_u32(block, CRC_BLOCK_BYTES_OFFSET),
            placement_hash: get_u32(block, PLACEMENT_HASH_OFFSET),
            device_index: get_u32(block, DEVICE_INDEX_OFFSET),
            device_count: get_u32(block, DEVICE_COUNT_OFFSET),
            set_uuid: block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16]
                .try_into()
                .expect("16 bytes"),
            created_unix_ms: get_u64(block, CREATED_OFFSET),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            format_version: FORMAT_VERSION,
            device_bytes: 1 << 30,
            region_bytes: 64 << 20,
            regions_offset: REGIONS_OFFSET_BYTES,
            region_count: 15,
            shard_count: 2,
            chunk_bytes: 4 << 20,
            crc_block_bytes: 64 << 10,
            placement_hash: PLACEMENT_CRC32C,
            device_index: 0,
            device_count: 1,
            set_uuid: [9; 16],
            created_unix_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let block = sample().encode();
        assert_eq!(Superblock::decode(&block), Ok(sample()));
        let mut damaged = block.clone();
        damaged[REGION_BYTES_OFFSET] ^= 1;
        assert_eq!(
            Superblock::decode(&damaged),
            Err(SuperblockProblem::Corrupt)
        );
        let mut foreign = block;
        foreign[0] = b'X';
        assert_eq!(
            Superblock::decode(&foreign),
            Err(SuperblockProblem::Foreign)
        );
        assert_eq!(
            Superblock::decode(&[0u8; BLOCK_BYTES]),
            Err(SuperblockProblem::Blank)
        );
    }
}
