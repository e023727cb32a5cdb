//! The checkpoint header: the first block of a region that holds one part of an index
//! checkpoint instead of a log. A checkpoint is one byte stream (the shard's index as it was at
//! one instant, and the log regions that index covers) cut into parts of at most a region less
//! this block; every part names its checkpoint, its place among the parts and the CRC32C of its
//! bytes, so a checkpoint is used only when all its parts are present and intact.
//!
//! ```text
//! offset size field
//!      0    8 magic "HYDCKPT\0"
//!      8    8 checkpoint_seq      taken from the shard's region_seq counter (never reused)
//!     16    4 shard
//!     20    4 region_index        index of the region on its device
//!     24   16 set_uuid
//!     40    4 part                0-based
//!     44    4 parts               how many parts the checkpoint has
//!     48    8 data_bytes          bytes of this part after this block
//!     56    4 data_crc            CRC32C of those bytes
//!     60    4 zero
//!     64    8 covered_below       log regions with a lower region_seq are covered
//!     72    8 next_seq            the shard's next operation seq when it was taken
//!     80 4012 zero
//!   4092    4 crc32c of bytes 0..4092
//! ```

use super::*;

const MAGIC: [u8; 8] = *b"HYDCKPT\0";
const CHECKPOINT_SEQ_OFFSET: usize = 8;
const SHARD_OFFSET: usize = 16;
const REGION_INDEX_OFFSET: usize = 20;
const SET_UUID_OFFSET: usize = 24;
const PART_OFFSET: usize = 40;
const PARTS_OFFSET: usize = 44;
const DATA_BYTES_OFFSET: usize = 48;
const DATA_CRC_OFFSET: usize = 56;
const COVERED_BELOW_OFFSET: usize = 64;
const NEXT_SEQ_OFFSET: usize = 72;
const END_OFFSET: usize = NEXT_SEQ_OFFSET + 8;
const _: () = assert!(END_OFFSET == 80);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub checkpoint_seq: u64,
    pub shard: u32,
    pub region_index: u32,
    pub set_uuid: [u8; 16],
    pub part: u32,
    pub parts: u32,
    pub data_bytes: u64,
    pub data_crc: u32,
    pub covered_below: u64,
    pub next_seq: u64,
}

impl CheckpointHeader {
    pub fn encode_into(&self, block: &mut [u8]) {
        assert_eq!(block.len(), BLOCK_BYTES);
        block.fill(0);
        block[..8].copy_from_slice(&MAGIC);
        put_u64(block, CHECKPOINT_SEQ_OFFSET, self.checkpoint_seq);
        put_u32(block, SHARD_OFFSET, self.shard);
        put_u32(block, REGION_INDEX_OFFSET, self.region_index);
        block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16].copy_from_slice(&self.set_uuid);
        put_u32(block, PART_OFFSET, self.part);
        put_u32(block, PARTS_OFFSET, self.parts);
        put_u64(block, DATA_BYTES_OFFSET, self.data_bytes);
        put_u32(block, DATA_CRC_OFFSET, self.data_crc);
        put_u64(block, COVERED_BELOW_OFFSET, self.covered_below);
        put_u64(block, NEXT_SEQ_OFFSET, self.next_seq);
        seal_block(block);
    }

    /// The header in `block`, or `None` when the block is not a valid checkpoint header.
    pub fn decode(block: &[u8]) -> Option<CheckpointHeader> {
        if block.len() < BLOCK_BYTES || block[..8] != MAGIC || !block_checksum_ok(block) {
            return None;
        }
        let header = CheckpointHeader {
            checkpoint_seq: get_u64(block, CHECKPOINT_SEQ_OFFSET),
            shard: get_u32(block, SHARD_OFFSET),
            region_index: get_u32(block, REGION_INDEX_OFFSET),
            set_uuid: block[SET_UUID_OFFSET..SET_UUID_OFFSET + 16]
                .try_into()
                .expect("16 bytes"),
            part: get_u32(block, PART_OFFSET),
            parts: get_u32(block, PARTS_OFFSET),
            data_bytes: get_u64(block, DATA_BYTES_OFFSET),
            data_crc: get_u32(block, DATA_CRC_OFFSET),
            covered_below: get_u64(block, COVERED_BELOW_OFFSET),
            next_seq: get_u64(block, NEXT_SEQ_OFFSET),
        };
        (header.part < header.parts).then_some(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage_and_region_headers() {
        let header = CheckpointHeader {
            checkpoint_seq: 42,
            shard: 1,
            region_index: 7,
            set_uuid: [3; 16],
            part: 1,
            parts: 3,
            data_bytes: 1 << 20,
            data_crc: 0xdead_beef,
            covered_below: 40,
            next_seq: 1234,
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        header.encode_into(&mut block);
        assert_eq!(CheckpointHeader::decode(&block), Some(header.clone()));
        assert_eq!(RegionHeader::decode(&block), None, "not a log region");
        block[DATA_CRC_OFFSET] ^= 1;
        assert_eq!(CheckpointHeader::decode(&block), None);

        let mut block = vec![0u8; BLOCK_BYTES];
        RegionHeader {
            region_seq: 42,
            shard: 1,
            region_index: 7,
            set_uuid: [3; 16],
        }
        .encode_into(&mut block);
        assert_eq!(CheckpointHeader::decode(&block), None, "a log region");
    }
}
