//! The same-host read ring: a submission queue and a completion queue in a memory file shared by
//! a client and one shard of the server (RING_OPEN on the same-host socket). The client writes
//! read entries and moves the submission tail; the shard takes them, reads each object into the
//! client's region, and writes a completion. Only doorbells (eventfd writes) cross between the
//! processes, and only when the other side said it is about to sleep. Layout in
//! docs/protocol.md, "Same-host read ring".
//!
//! ```text
//! offset  size  field (each counter on a cache line of its own; u32, little-endian)
//!      0     4  sq_tail         the client's: entries written
//!     64     4  sq_head         the server's: entries taken
//!    128     4  cq_tail         the server's: completions written
//!    192     4  cq_head         the client's: completions consumed
//!    256     4  server_idle     1 while the shard may sleep: ring the submit doorbell
//!    320     4  client_waiting  0, or while the client may sleep the completions it waits for:
//!                               the server rings the completion doorbell once that many are unconsumed
//!    384     4  closed          set to 1 by the server when it stops the ring (its region freed, its
//!                               connection closed); entries it had not taken get no completion
//!   4096        entries × LOCAL_RING_SQE_BYTES submission entries, then
//!               entries × LOCAL_RING_CQE_BYTES completion entries
//! ```
//!
//! Every field of the file may be changed by the client at any time: the server reads each
//! counter once per look, copies an entry before it decodes it, and writes only completions and
//! its own counters.

use crate::codec::{Reader, Writer};
use crate::name::{BUCKET_BYTES_MAX, KEY_BYTES_MAX};
use crate::ProtoError;

/// Entries of one ring at most (a power of two).
pub const LOCAL_RING_ENTRIES_MAX: u32 = 1024;
/// Rings one connection may hold at once.
pub const LOCAL_RINGS_PER_CONNECTION_MAX: u32 = 64;
/// Reads taken from the rings of one shard and not yet completed, all rings together.
pub const LOCAL_RING_READS_PER_SHARD_MAX: usize = 256;
/// RING_OPEN's `shard` meaning "the server chooses".
pub const LOCAL_RING_ANY_SHARD: u32 = u32::MAX;

pub const RING_SQ_TAIL: usize = 0;
pub const RING_SQ_HEAD: usize = 64;
pub const RING_CQ_TAIL: usize = 128;
pub const RING_CQ_HEAD: usize = 192;
pub const RING_SERVER_IDLE: usize = 256;
pub const RING_CLIENT_WAITING: usize = 320;
pub const RING_CLOSED: usize = 384;
/// Where the submission entries start.
pub const RING_ENTRIES_OFFSET: usize = 4096;

/// A submission entry: a 48-byte head, then the bucket's and the key's bytes.
///
/// ```text
/// offset size field
///      0    8 user_data    echoed in the completion
///      8    8 offset       in the ring's region, where the bytes go
///     16    8 length       bytes at `offset` the read may use
///     24    8 range_start
///     32    8 range_end    exclusive; LOCAL_RANGE_TO_END for the rest of the object
///     40    2 bucket_len   1..=63
///     42    2 key_len      1..=1024
///     44    4 reserved     0
///     48      bucket bytes, then key bytes
/// ```
pub const LOCAL_RING_SQE_BYTES: usize = 1152;
const SQE_HEAD_BYTES: usize = 48;
const _: () = assert!(SQE_HEAD_BYTES + BUCKET_BYTES_MAX + KEY_BYTES_MAX <= LOCAL_RING_SQE_BYTES);

/// A completion entry.
///
/// ```text
/// offset size field
///      0    8 user_data
///      8    8 object_bytes  size of the whole object
///     16    8 range_start   offset in the object of the first byte written
///     24    8 written       bytes written at the entry's offset
///     32    1 status        a Status
///     33    1 message_len   at most 94
///     34   94 message       why, when status is not OK (UTF-8, cut to fit)
/// ```
pub const LOCAL_RING_CQE_BYTES: usize = 128;
const CQE_MESSAGE_BYTES_MAX: usize = LOCAL_RING_CQE_BYTES - 34;

/// Bytes of the ring file for `entries` entries (a whole number of 4 KiB pages).
pub fn ring_file_bytes(entries: u32) -> usize {
    let bytes =
        RING_ENTRIES_OFFSET + entries as usize * (LOCAL_RING_SQE_BYTES + LOCAL_RING_CQE_BYTES);
    bytes.div_ceil(4096) * 4096
}

/// Offset in the ring file of submission slot `index` (taken modulo `entries`).
pub fn sqe_offset(entries: u32, index: u32) -> usize {
    RING_ENTRIES_OFFSET + (index % entries) as usize * LOCAL_RING_SQE_BYTES
}

/// Offset in the ring file of completion slot `index` (taken modulo `entries`).
pub fn cqe_offset(entries: u32, index: u32) -> usize {
    RING_ENTRIES_OFFSET
        + entries as usize * LOCAL_RING_SQE_BYTES
        + (index % entries) as usize * LOCAL_RING_CQE_BYTES
}

/// One read: `bucket/key` (bytes `range_start..range_end` of it) into the ring's region at
/// `offset`, using at most `length` bytes there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingSubmission {
    pub user_data: u64,
    pub offset: u64,
    pub length: u64,
    pub range_start: u64,
    pub range_end: u64,
    pub bucket: String,
    pub key: String,
}

/// Why a submission entry could not be decoded (it is answered with BAD_REQUEST, or
/// INVALID_KEY for a name, and its user_data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingEntryError {
    pub user_data: u64,
    pub invalid_name: bool,
    pub message: &'static str,
}

impl RingSubmission {
    /// Write this entry into `slot` (LOCAL_RING_SQE_BYTES). Names longer than the protocol's
    /// bounds are refused here, before anything is written.
    pub fn encode_into(&self, slot: &mut [u8]) -> Result<(), ProtoError> {
        if self.bucket.is_empty() || self.bucket.len() > BUCKET_BYTES_MAX {
            return Err(ProtoError::Malformed("a bucket of 1 to 63 bytes"));
        }
        if self.key.is_empty() || self.key.len() > KEY_BYTES_MAX {
            return Err(ProtoError::Malformed("a key of 1 to 1024 bytes"));
        }
        let slot = &mut slot[..LOCAL_RING_SQE_BYTES];
        slot[0..8].copy_from_slice(&self.user_data.to_le_bytes());
        slot[8..16].copy_from_slice(&self.offset.to_le_bytes());
        slot[16..24].copy_from_slice(&self.length.to_le_bytes());
        slot[24..32].copy_from_slice(&self.range_start.to_le_bytes());
        slot[32..40].copy_from_slice(&self.range_end.to_le_bytes());
        slot[40..42].copy_from_slice(&(self.bucket.len() as u16).to_le_bytes());
        slot[42..44].copy_from_slice(&(self.key.len() as u16).to_le_bytes());
        slot[44..48].fill(0);
        let names = SQE_HEAD_BYTES + self.bucket.len();
        slot[SQE_HEAD_BYTES..names].copy_from_slice(self.bucket.as_bytes());
        slot[names..names + self.key.len()].copy_from_slice(self.key.as_bytes());
        Ok(())
    }

    /// Decode a copy of a submission slot. Every length is checked against the slot and the
    /// protocol's name bounds; names must be UTF-8.
    pub fn decode(slot: &[u8; LOCAL_RING_SQE_BYTES]) -> Result<RingSubmission, RingEntryError> {
        let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8"));
        let u16_at = |at: usize| u16::from_le_bytes(slot[at..at + 2].try_into().expect("2"));
        let user_data = u64_at(0);
        let refuse = |invalid_name: bool, message: &'static str| RingEntryError {
            user_data,
            invalid_name,
            message,
        };
        if slot[44..48] != [0; 4] {
            return Err(refuse(false, "a submission's reserved bytes are not zero"));
        }
        let bucket_len = u16_at(40) as usize;
        let key_len = u16_at(42) as usize;
        if bucket_len == 0 || bucket_len > BUCKET_BYTES_MAX {
            return Err(refuse(true, "a bucket name is 1 to 63 bytes"));
        }
        if key_len == 0 || key_len > KEY_BYTES_MAX {
            return Err(refuse(true, "a key is 1 to 1024 bytes"));
        }
        let names = SQE_HEAD_BYTES + bucket_len;
        let bucket = std::str::from_utf8(&slot[SQE_HEAD_BYTES..names])
            .map_err(|_| refuse(true, "a bucket name is UTF-8"))?;
        let key = std::str::from_utf8(&slot[names..names + key_len])
            .map_err(|_| refuse(true, "a key is UTF-8"))?;
        Ok(RingSubmission {
            user_data,
            offset: u64_at(8),
            length: u64_at(16),
            range_start: u64_at(24),
            range_end: u64_at(32),
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }
}

/// How one submission went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingCompletion {
    pub user_data: u64,
    pub status: u8,
    pub object_bytes: u64,
    pub range_start: u64,
    pub written: u64,
    pub message: String,
}

impl RingCompletion {
    pub fn encode(&self) -> [u8; LOCAL_RING_CQE_BYTES] {
        let mut slot = [0u8; LOCAL_RING_CQE_BYTES];
        slot[0..8].copy_from_slice(&self.user_data.to_le_bytes());
        slot[8..16].copy_from_slice(&self.object_bytes.to_le_bytes());
        slot[16..24].copy_from_slice(&self.range_start.to_le_bytes());
        slot[24..32].copy_from_slice(&self.written.to_le_bytes());
        slot[32] = self.status;
        // Cut at a character boundary so that what is sent stays UTF-8.
        let mut cut = self.message.len().min(CQE_MESSAGE_BYTES_MAX);
        while !self.message.is_char_boundary(cut) {
            cut -= 1;
        }
        slot[33] = cut as u8;
        slot[34..34 + cut].copy_from_slice(&self.message.as_bytes()[..cut]);
        slot
    }

    pub fn decode(slot: &[u8]) -> Result<RingCompletion, ProtoError> {
        let slot = slot
            .get(..LOCAL_RING_CQE_BYTES)
            .ok_or(ProtoError::Malformed("a completion is 128 bytes"))?;
        let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8"));
        let message_len = slot[33] as usize;
        if message_len > CQE_MESSAGE_BYTES_MAX {
            return Err(ProtoError::Malformed(
                "a completion's message is at most 94 bytes",
            ));
        }
        Ok(RingCompletion {
            user_data: u64_at(0),
            object_bytes: u64_at(8),
            range_start: u64_at(16),
            written: u64_at(24),
            status: slot[32],
            message: String::from_utf8_lossy(&slot[34..34 + message_len]).into_owned(),
        })
    }
}

/// RING_OPEN: a ring of `entries` (a power of two, at most LOCAL_RING_ENTRIES_MAX) whose reads
/// land in region `region`, served by shard `shard` (LOCAL_RING_ANY_SHARD: the server chooses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingOpen {
    pub region: u32,
    pub entries: u32,
    pub shard: u32,
}

impl RingOpen {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.region);
        writer.u32(self.entries);
        writer.u32(self.shard);
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<RingOpen, ProtoError> {
        let mut reader = Reader::new(bytes);
        let open = RingOpen {
            region: reader.u32()?,
            entries: reader.u32()?,
            shard: reader.u32()?,
        };
        reader.finish()?;
        Ok(open)
    }
}

/// The answer to RING_OPEN. Three fds travel with its first byte (SCM_RIGHTS): the ring file,
/// the submit doorbell and the completion doorbell (eventfds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingInfo {
    pub ring: u32,
    pub entries: u32,
    /// The shard that serves it.
    pub shard: u32,
    /// The server's shards and its placement hash (as HELLO tells), so that a client can open
    /// one ring per shard and submit each key to the ring of the shard that owns it. A key
    /// submitted to another shard's ring is still read, through that shard.
    pub shards: u32,
    pub placement_hash: u32,
}

impl RingInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(self.ring);
        writer.u32(self.entries);
        writer.u32(self.shard);
        writer.u32(self.shards);
        writer.u32(self.placement_hash);
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<RingInfo, ProtoError> {
        let mut reader = Reader::new(bytes);
        let info = RingInfo {
            ring: reader.u32()?,
            entries: reader.u32()?,
            shard: reader.u32()?,
            shards: reader.u32()?,
            placement_hash: reader.u32()?,
        };
        reader.finish()?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submission() -> RingSubmission {
        RingSubmission {
            user_data: 7,
            offset: 4096,
            length: 1 << 20,
            range_start: 0,
            range_end: u64::MAX,
            bucket: "b".into(),
            key: "k/é".into(),
        }
    }

    #[test]
    fn a_submission_round_trips_through_its_slot() {
        let mut slot = [0u8; LOCAL_RING_SQE_BYTES];
        submission().encode_into(&mut slot).unwrap();
        assert_eq!(RingSubmission::decode(&slot).unwrap(), submission());
    }

    #[test]
    fn bad_slots_are_refused_with_their_user_data() {
        let mut slot = [0u8; LOCAL_RING_SQE_BYTES];
        submission().encode_into(&mut slot).unwrap();
        let mut long_key = slot;
        long_key[42..44].copy_from_slice(&2000u16.to_le_bytes());
        let error = RingSubmission::decode(&long_key).unwrap_err();
        assert_eq!((error.user_data, error.invalid_name), (7, true));
        let mut reserved = slot;
        reserved[45] = 1;
        assert!(!RingSubmission::decode(&reserved).unwrap_err().invalid_name);
        let mut not_utf8 = slot;
        not_utf8[SQE_HEAD_BYTES] = 0xff;
        assert!(RingSubmission::decode(&not_utf8).unwrap_err().invalid_name);
        let mut no_bucket = slot;
        no_bucket[40..42].fill(0);
        assert!(RingSubmission::decode(&no_bucket).is_err());
    }

    #[test]
    fn a_completion_keeps_its_message_utf8_when_cut() {
        let completion = RingCompletion {
            user_data: 1,
            status: 4,
            object_bytes: 2,
            range_start: 3,
            written: 4,
            message: "é".repeat(60),
        };
        let decoded = RingCompletion::decode(&completion.encode()).unwrap();
        assert_eq!(decoded.message, "é".repeat(47));
        assert_eq!(decoded.written, 4);
    }

    #[test]
    fn the_ring_file_holds_both_queues() {
        let entries = LOCAL_RING_ENTRIES_MAX;
        let end = cqe_offset(entries, entries - 1) + LOCAL_RING_CQE_BYTES;
        assert!(end <= ring_file_bytes(entries));
        assert_eq!(sqe_offset(entries, entries), sqe_offset(entries, 0));
        assert!(sqe_offset(entries, entries - 1) + LOCAL_RING_SQE_BYTES <= cqe_offset(entries, 0));
    }
}
