//! The region header: the first block of every region, rewritten each time the region is
//! opened for writing. Entries carry the `region_seq` of the header they were written under, so
//! a scan stops at entries left over from an earlier use of the region.
//!
//! ```text
//! offset size field
//!      0    8 magic "HYDREGN\0"
//!      8    8 region_seq          per-shard, increases every time a region is opened
//!     16    4 shard
//!     20    4 region_index        index of the region on its device
//!     24   16 set_uuid
//!     40 4052 zero
//!   4092    4 crc32c of bytes 0..4092
//! ```

use super::*;

const MAGIC: [u8; 8] = *b"HYDREGN\0";
const MAGIC_OFFSET: usize = 0;
const REGION_SEQ_OFFSET: usize = MAGIC_OFFSET + 8;
const SHARD_OFFSET: usize = REGION_SEQ_OFFSET + 8;
const REGION_INDEX_OFFSET: usize = SHARD_OFFSET + 4;
const SET_UUID_OFFSET: usize = REGION_INDEX_OFFSET + 4;
const END_OFFSET: usize = SET_UUID_OFFSET + 16;
const _: () = assert!(END_OFFSET == 40);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionHeader {
    pub region_seq: u64,
    pub shard: u32,
    pub region_index: u32,
    pub set_uuid: [u8; 16],
}

impl RegionHeader {
    pub fn encode_into(&self, block: &mut [u8]) {
        assert_eq!(block.len(), BLOCK_BYTES);
        block.fill(0);
        block[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&MAGIC);
        put_u64(block, REGION_SEQ_OFFSET, self.region_seq);
        put_u32(block, SHARD_OFFSET, self.shard);
        put_u32(block, REGION_INDEX_OFFSET, self.region_index);
        block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16].copy_from_slice(&self.set_uuid);
        seal_block(block);
    }

    /// The header in `block`, or `None` when the block is not a valid region header.
    pub fn decode(block: &[u8]) -> Option<RegionHeader> {
        if block.len() < BLOCK_BYTES || block[..8] != MAGIC || !block_checksum_ok(block) {
            return None;
        }
        Some(RegionHeader {
            region_seq: get_u64(block, REGION_SEQ_OFFSET),
            shard: get_u32(block, SHARD_OFFSET),
            region_index: get_u32(block, REGION_INDEX_OFFSET),
            set_uuid: block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16]
                .try_into()
                .expect("16 bytes"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let header = RegionHeader {
            region_seq: 42,
            shard: 1,
            region_index: 7,
            set_uuid: [3; 16],
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        header.encode_into(&mut block);
        assert_eq!(RegionHeader::decode(&block), Some(header));
        block[REGION_SEQ_OFFSET] ^= 0x10;
        assert_eq!(RegionHeader::decode(&block), None);
    }
}
