//! The entry header: one block in front of every chunk of data, tombstone or seal.
//!
//! ```text
//! offset size field
//!      0    4 magic "HENT"
//!      4    1 kind                1 = chunk, 2 = tombstone, 3 = seal (end of the region's log),
//!                                 4 = clean (the version in object_bytes is at the origin),
//!                                 5 = void (the version in object_bytes failed; format 2)
//!      5    1 flags               bit 0 = dirty (not yet at the origin), bit 1 = attributes
//!                                 follow the checksums (format 3)
//!      6    1 bucket_len          <= 63
//!      7    1 etag_len            <= 64
//!      8    2 key_len             <= 1024
//!     10    2 crc_count           = ceil(data_bytes / crc_block_bytes)
//!     12    4 chunk_index
//!     16    4 chunk_count         chunks of the object version
//!     20    4 data_bytes          bytes of data following this header (this chunk)
//!     24    8 seq                 object version: per-shard sequence number of the put/delete
//!     32    8 region_seq          the region header this entry was written under
//!     40    8 object_bytes        size of the whole object version (clean, void: the seq it marks)
//!     48   64 etag                the version's MD5 tag (etag_len bytes used: 0 = none, or 18 =
//!                                 16-byte MD5 digest, then u16 part count, 0 = whole object)
//!    112    . bucket, then key, then crc_count little-endian u32 CRC32C of the data pieces,
//!                                 then (flag bit 1) attributes_len bytes of the object's
//!                                 attributes (see `attributes.rs`; a version's first chunk)
//!   4082    2 attributes_len      (flag bit 1; else 0)
//!   4084    8 modified_ms         when the version was written, ms since the Unix epoch
//!                                 (0 = not known; a store written before it was kept)
//!   4092    4 crc32c of bytes 0..4092
//! ```
//! Data starts at the next block and is padded with zeros to a multiple of 4 KiB.

use super::*;
use crate::stamp::Md5Tag;

const MAGIC: u32 = u32::from_le_bytes(*b"HENT");
const MAGIC_OFFSET: usize = 0;
const KIND_OFFSET: usize = MAGIC_OFFSET + 4;
const FLAGS_OFFSET: usize = KIND_OFFSET + 1;
const BUCKET_LEN_OFFSET: usize = FLAGS_OFFSET + 1;
const ETAG_LEN_OFFSET: usize = BUCKET_LEN_OFFSET + 1;
const KEY_LEN_OFFSET: usize = ETAG_LEN_OFFSET + 1;
const CRC_COUNT_OFFSET: usize = KEY_LEN_OFFSET + 2;
const CHUNK_INDEX_OFFSET: usize = CRC_COUNT_OFFSET + 2;
const CHUNK_COUNT_OFFSET: usize = CHUNK_INDEX_OFFSET + 4;
const DATA_BYTES_OFFSET: usize = CHUNK_COUNT_OFFSET + 4;
const SEQ_OFFSET: usize = DATA_BYTES_OFFSET + 4;
const REGION_SEQ_OFFSET: usize = SEQ_OFFSET + 8;
const OBJECT_BYTES_OFFSET: usize = REGION_SEQ_OFFSET + 8;
const ETAG_OFFSET: usize = OBJECT_BYTES_OFFSET + 8;
const NAMES_OFFSET: usize = ETAG_OFFSET + ETAG_BYTES_MAX;
const _: () = assert!(NAMES_OFFSET == 112);
/// At the end of the block, so that headers written before it was kept read as 0 (their
/// bytes there are the zeros after the last checksum).
const MODIFIED_OFFSET: usize = CHECKSUM_OFFSET - 8;
/// Before the time, and read only where the flag says so (headers written before it was kept
/// may have checksums there).
const ATTRIBUTES_LEN_OFFSET: usize = MODIFIED_OFFSET - 2;
/// The most data checksums a header has room for beside the longest bucket and key.
pub(crate) const CRC_COUNT_MAX: usize =
    (ATTRIBUTES_LEN_OFFSET - NAMES_OFFSET - BUCKET_BYTES_MAX - KEY_BYTES_MAX) / 4;
const _: () = assert!(CRC_COUNT_MAX >= 256);
// The default geometry's checksums leave room for the most attributes beside the longest names.
const _: () = assert!(
    ATTRIBUTES_LEN_OFFSET
        - NAMES_OFFSET
        - BUCKET_BYTES_MAX
        - KEY_BYTES_MAX
        - 4 * (crate::CHUNK_BYTES_DEFAULT / crate::CRC_BLOCK_BYTES_DEFAULT) as usize
        >= crate::attributes::ATTRIBUTES_BYTES_MAX
);

pub const ENTRY_FLAG_DIRTY: u8 = 1;
/// The header holds the object's attributes after its checksums.
pub const ENTRY_FLAG_ATTRIBUTES: u8 = 2;
/// The data was written from a same-host client's memory, which the client could change while
/// the device read it: such an entry may fail its checksums though its write completed, and
/// recovery passes over it (and voids its version) instead of taking it for a torn end.
pub const ENTRY_FLAG_FROM_CLIENT: u8 = 4;

/// Bytes of attributes a chunk header has room for beside `bucket_bytes` + `key_bytes` of names
/// and `crc_count` checksums.
pub fn attributes_room(names_bytes: usize, crc_count: usize) -> usize {
    ATTRIBUTES_LEN_OFFSET.saturating_sub(NAMES_OFFSET + names_bytes + 4 * crc_count)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Chunk = 1,
    Tombstone = 2,
    Seal = 3,
    /// The version whose seq is in `object_bytes` was written back to the origin.
    Clean = 4,
    /// The version whose seq is in `object_bytes` failed and was never acknowledged: it must
    /// not be recovered, even if all its chunks are on the device (format version 2).
    Void = 5,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub kind: EntryKind,
    pub flags: u8,
    pub chunk_index: u32,
    pub chunk_count: u32,
    pub data_bytes: u32,
    pub seq: u64,
    pub region_seq: u64,
    pub object_bytes: u64,
    /// The version's MD5 tag, on a chunk (the last chunk of a streamed put: only then is it
    /// known).
    pub md5: Option<Md5Tag>,
    /// When the version was written (chunks), ms since the Unix epoch; 0 where not known.
    pub modified_ms: u64,
    pub bucket: Vec<u8>,
    pub key: Vec<u8>,
    pub data_crcs: Vec<u32>,
    /// The object's encoded attributes (a version's first chunk; empty for none).
    pub attributes: Vec<u8>,
}

impl EntryHeader {
    /// A seal: marks the end of a region's log (written during recovery at a torn tail).
    pub fn seal(region_seq: u64) -> EntryHeader {
        EntryHeader {
            kind: EntryKind::Seal,
            flags: 0,
            chunk_index: 0,
            chunk_count: 0,
            data_bytes: 0,
            seq: 0,
            region_seq,
            object_bytes: 0,
            md5: None,
            modified_ms: 0,
            bucket: Vec::new(),
            key: Vec::new(),
            data_crcs: Vec::new(),
            attributes: Vec::new(),
        }
    }

    /// An entry without data that names `bucket`/`key`: a tombstone (`object_bytes` 0), or a
    /// clean or void marker (`object_bytes` the seq it marks).
    pub fn marker(
        kind: EntryKind,
        bucket: Vec<u8>,
        key: Vec<u8>,
        object_bytes: u64,
    ) -> EntryHeader {
        EntryHeader {
            kind,
            flags: 0,
            chunk_index: 0,
            chunk_count: 0,
            data_bytes: 0,
            seq: 0,
            region_seq: 0,
            object_bytes,
            md5: None,
            modified_ms: 0,
            bucket,
            key,
            data_crcs: Vec::new(),
            attributes: Vec::new(),
        }
    }

    /// A void marker: version `seq` of `bucket`/`key` must not be recovered.
    pub fn void_marker(bucket: Vec<u8>, key: Vec<u8>, seq: u64) -> EntryHeader {
        EntryHeader::marker(EntryKind::Void, bucket, key, seq)
    }

    /// Bytes the entry takes in its region: the header block and the padded data.
    pub fn entry_bytes(&self) -> u64 {
        (BLOCK_BYTES + crate::buf::align_up(self.data_bytes as usize)) as u64
    }

    pub fn encode_into(&self, block: &mut [u8]) {
        assert_eq!(block.len(), BLOCK_BYTES);
        assert!(self.bucket.len() <= BUCKET_BYTES_MAX);
        assert!(self.key.len() <= KEY_BYTES_MAX);
        assert!(self.data_crcs.len() <= CRC_COUNT_MAX);
        assert!(
            self.attributes.len()
                <= attributes_room(self.bucket.len() + self.key.len(), self.data_crcs.len())
        );
        block.fill(0);
        put_u32(block, MAGIC_OFFSET, MAGIC);
        block[KIND_OFFSET] = self.kind as u8;
        let flags = if self.attributes.is_empty() {
            self.flags & !ENTRY_FLAG_ATTRIBUTES
        } else {
            self.flags | ENTRY_FLAG_ATTRIBUTES
        };
        block[FLAGS_OFFSET] = flags;
        block[BUCKET_LEN_OFFSET] = self.bucket.len() as u8;
        let md5 = self.md5.map(|tag| tag.encode());
        let etag: &[u8] = md5.as_ref().map_or(&[], |tag| &tag[..]);
        block[ETAG_LEN_OFFSET] = etag.len() as u8;
        put_u16(block, KEY_LEN_OFFSET, self.key.len() as u16);
        put_u16(block, CRC_COUNT_OFFSET, self.data_crcs.len() as u16);
        put_u32(block, CHUNK_INDEX_OFFSET, self.chunk_index);
        put_u32(block, CHUNK_COUNT_OFFSET, self.chunk_count);
        put_u32(block, DATA_BYTES_OFFSET, self.data_bytes);
        put_u64(block, SEQ_OFFSET, self.seq);
        put_u64(block, REGION_SEQ_OFFSET, self.region_seq);
        put_u64(block, OBJECT_BYTES_OFFSET, self.object_bytes);
        block[ETAG_OFFSET..ETAG_OFFSET + etag.len()].copy_from_slice(etag);
        put_u64(block, MODIFIED_OFFSET, self.modified_ms);
        let mut offset = NAMES_OFFSET;
        block[offset..offset + self.bucket.len()].copy_from_slice(&self.bucket);
        offset += self.bucket.len();
        block[offset..offset + self.key.len()].copy_from_slice(&self.key);
        offset += self.key.len();
        for crc in &self.data_crcs {
            put_u32(block, offset, *crc);
            offset += 4;
        }
        if !self.attributes.is_empty() {
            block[offset..offset + self.attributes.len()].copy_from_slice(&self.attributes);
            put_u16(block, ATTRIBUTES_LEN_OFFSET, self.attributes.len() as u16);
        }
        seal_block(block);
    }

    /// The header in `block`, or `None` when the block is not a valid entry header for a store
    /// that checksums data in pieces of `crc_block_bytes`.
    pub fn decode(block: &[u8], crc_block_bytes: u32) -> Option<EntryHeader> {
        if block.len() < BLOCK_BYTES
            || get_u32(block, MAGIC_OFFSET) != MAGIC
            || !block_checksum_ok(block)
        {
            return None;
        }
        let kind = match block[KIND_OFFSET] {
            1 => EntryKind::Chunk,
            2 => EntryKind::Tombstone,
            3 => EntryKind::Seal,
            4 => EntryKind::Clean,
            5 => EntryKind::Void,
            _ => return None,
        };
        let bucket_len = block[BUCKET_LEN_OFFSET] as usize;
        let etag_len = block[ETAG_LEN_OFFSET] as usize;
        let key_len = get_u16(block, KEY_LEN_OFFSET) as usize;
        let crc_count = get_u16(block, CRC_COUNT_OFFSET) as usize;
        let data_bytes = get_u32(block, DATA_BYTES_OFFSET);
        let chunk_index = get_u32(block, CHUNK_INDEX_OFFSET);
        let chunk_count = get_u32(block, CHUNK_COUNT_OFFSET);
        let lengths_ok = bucket_len <= BUCKET_BYTES_MAX
            && key_len <= KEY_BYTES_MAX
            && etag_len <= ETAG_BYTES_MAX
            && crc_count <= CRC_COUNT_MAX
            && crc_count == crc_count_of(data_bytes, crc_block_bytes)
            && (kind == EntryKind::Chunk || data_bytes == 0)
            && (kind != EntryKind::Chunk || chunk_index < chunk_count);
        if !lengths_ok {
            return None;
        }
        let mut offset = NAMES_OFFSET;
        let bucket = block[offset..offset + bucket_len].to_vec();
        offset += bucket_len;
        let key = block[offset..offset + key_len].to_vec();
        offset += key_len;
        let data_crcs = (0..crc_count)
            .map(|index| get_u32(block, offset + 4 * index))
            .collect();
        offset += 4 * crc_count;
        let flags = block[FLAGS_OFFSET];
        let attributes = if flags & ENTRY_FLAG_ATTRIBUTES != 0 {
            let len = get_u16(block, ATTRIBUTES_LEN_OFFSET) as usize;
            if len > attributes_room(bucket_len + key_len, crc_count) {
                return None;
            }
            block[offset..offset + len].to_vec()
        } else {
            Vec::new()
        };
        Some(EntryHeader {
            kind,
            flags,
            chunk_index,
            chunk_count,
            data_bytes,
            seq: get_u64(block, SEQ_OFFSET),
            region_seq: get_u64(block, REGION_SEQ_OFFSET),
            object_bytes: get_u64(block, OBJECT_BYTES_OFFSET),
            // A tag of another length (none was ever written) is no tag.
            md5: Md5Tag::decode(&block[ETAG_OFFSET..ETAG_OFFSET + etag_len]),
            modified_ms: get_u64(block, MODIFIED_OFFSET),
            bucket,
            key,
            data_crcs,
            attributes,
        })
    }
}

fn crc_count_of(data_bytes: u32, crc_block_bytes: u32) -> usize {
    crc_count(data_bytes as u64, crc_block_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EntryHeader {
        let data = vec![5u8; 150_000];
        EntryHeader {
            kind: EntryKind::Chunk,
            flags: ENTRY_FLAG_DIRTY,
            chunk_index: 2,
            chunk_count: 3,
            data_bytes: data.len() as u32,
            seq: 77,
            region_seq: 9,
            object_bytes: 8_538_000,
            md5: Some(Md5Tag {
                digest: [7; 16],
                parts: 3,
            }),
            modified_ms: 1_764_000_000_123,
            bucket: b"datasets".to_vec(),
            key: "shards/train-0001.tar".as_bytes().to_vec(),
            data_crcs: data_checksums(&data, 65536),
            attributes: Vec::new(),
        }
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let header = sample();
        let mut block = vec![0u8; BLOCK_BYTES];
        header.encode_into(&mut block);
        assert_eq!(EntryHeader::decode(&block, 65536), Some(header.clone()));
        assert_eq!(header.entry_bytes(), 4096 + 151_552);
        // The checksum count must agree with the store's geometry.
        assert_eq!(EntryHeader::decode(&block, 4096), None);
        for position in [0, 5, 30, NAMES_OFFSET + 3, 4000, 4093] {
            let mut damaged = block.clone();
            damaged[position] ^= 0x40;
            assert_eq!(
                EntryHeader::decode(&damaged, 65536),
                None,
                "flip at {position}"
            );
        }
    }

    #[test]
    fn longest_names_and_most_checksums_fit() {
        let mut header = sample();
        header.bucket = vec![b'b'; BUCKET_BYTES_MAX];
        header.key = vec![b'k'; KEY_BYTES_MAX];
        header.data_crcs = vec![1; CRC_COUNT_MAX];
        header.data_bytes = (CRC_COUNT_MAX * 4096) as u32;
        let mut block = vec![0u8; BLOCK_BYTES];
        header.encode_into(&mut block);
        assert_eq!(EntryHeader::decode(&block, 4096), Some(header));
    }

    #[test]
    fn attributes_round_trip_beside_the_longest_names_and_are_read_only_under_their_flag() {
        let mut header = sample();
        header.bucket = vec![b'b'; BUCKET_BYTES_MAX];
        header.key = vec![b'k'; KEY_BYTES_MAX];
        let room = attributes_room(BUCKET_BYTES_MAX + KEY_BYTES_MAX, header.data_crcs.len());
        assert!(room >= crate::attributes::ATTRIBUTES_BYTES_MAX);
        header.attributes = (0..room).map(|at| at as u8).collect();
        let mut block = vec![0u8; BLOCK_BYTES];
        header.encode_into(&mut block);
        let decoded = EntryHeader::decode(&block, 65536).unwrap();
        assert_eq!(decoded.flags, ENTRY_FLAG_DIRTY | ENTRY_FLAG_ATTRIBUTES);
        assert_eq!(decoded.attributes, header.attributes);
        // A header without the flag has no attributes, whatever its last bytes hold (a header
        // of an older build with the most checksums has them there).
        header.attributes.clear();
        header.encode_into(&mut block);
        put_u16(&mut block, ATTRIBUTES_LEN_OFFSET, 77);
        seal_block(&mut block);
        let decoded = EntryHeader::decode(&block, 65536).unwrap();
        assert_eq!(decoded.flags, ENTRY_FLAG_DIRTY);
        assert!(decoded.attributes.is_empty());
        // A length past the room is a damaged header.
        let mut lying = block.clone();
        lying[FLAGS_OFFSET] |= ENTRY_FLAG_ATTRIBUTES;
        put_u16(&mut lying, ATTRIBUTES_LEN_OFFSET, (room + 1) as u16);
        seal_block(&mut lying);
        assert_eq!(EntryHeader::decode(&lying, 65536), None);
    }
}
