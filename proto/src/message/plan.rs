//! PLAN: the order in which a reader will read keys, so that the node reads ahead of it.

use crate::codec::{Reader, Writer};
use crate::ProtoError;

use super::*;

/// Most keys one PLAN names (a longer order is announced in parts, as the reader gets there).
pub const PLAN_KEYS_MAX: usize = 65_536;
/// The most bytes a plan may read ahead of its readers on one node.
pub const PLAN_WINDOW_BYTES_MAX: u64 = 16 << 30;
/// Bounds of a plan's idle time: a plan no reader follows for this long is dropped.
pub const PLAN_IDLE_MS_MIN: u32 = 100;
pub const PLAN_IDLE_MS_MAX: u32 = 3_600_000;

/// PLAN's extension: the plan's name (a reader's, chosen by it: a new plan of the same id
/// replaces the old one), how far ahead of its readers the node may read, and how long the
/// plan lasts without a read of one of its keys. The keys travel as the payload (`PlanKeys`);
/// none drops the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    pub bucket: String,
    pub plan_id: u64,
    pub window_bytes: u64,
    pub idle_ms: u32,
}

impl Message for PlanRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_bytes());
        writer.u64(self.plan_id);
        writer.u64(self.window_bytes);
        writer.u32(self.idle_ms);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, name::check_bucket)?.to_string();
        let plan_id = reader.u64()?;
        let window_bytes = reader.u64()?;
        if window_bytes == 0 || window_bytes > PLAN_WINDOW_BYTES_MAX {
            return Err(ProtoError::Malformed("a plan's window is 1 byte to 16 GiB"));
        }
        let idle_ms = reader.u32()?;
        if !(PLAN_IDLE_MS_MIN..=PLAN_IDLE_MS_MAX).contains(&idle_ms) {
            return Err(ProtoError::Malformed(
                "a plan's idle time is 100 ms to an hour",
            ));
        }
        Ok(PlanRequest {
            bucket,
            plan_id,
            window_bytes,
            idle_ms,
        })
    }
}

/// PLAN's payload: the keys, in the order they will be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanKeys {
    pub keys: Vec<String>,
}

impl Message for PlanKeys {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.keys.len() as u32);
        for key in &self.keys {
            writer.bytes16(key.as_bytes());
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = reader.u32()? as usize;
        if count > PLAN_KEYS_MAX {
            return Err(ProtoError::Malformed("more than 65,536 keys in one PLAN"));
        }
        let mut keys = Vec::with_capacity(count.min(reader.remaining() / 3));
        for _ in 0..count {
            keys.push(read_name(reader, name::check_key)?.to_string());
        }
        Ok(PlanKeys { keys })
    }
}

/// PLAN's answer: how many of the keys this node owns (and will read ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanResult {
    pub keys: u64,
}

impl Message for PlanResult {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u64(self.keys);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(PlanResult {
            keys: reader.u64()?,
        })
    }
}
