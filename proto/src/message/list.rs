//! LIST: the request and the page of entries it is answered with.

use crate::codec::{Reader, Writer};
use crate::ProtoError;

use super::*;

/// LIST: up to `limit` keys of a bucket starting with `prefix`, after `start_after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRequest {
    pub bucket: String,
    pub prefix: String,
    pub start_after: Option<String>,
    pub limit: u32,
}

impl Message for ListRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.bytes16(self.bucket.as_bytes());
        writer.bytes16(self.prefix.as_bytes());
        match &self.start_after {
            Some(after) => {
                writer.u8(1);
                writer.bytes16(after.as_bytes());
            }
            None => writer.u8(0),
        }
        writer.u32(self.limit);
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let bucket = read_name(reader, name::check_bucket)?;
        let prefix = read_name(reader, name::check_prefix)?.to_string();
        let start_after = match reader.u8()? {
            0 => None,
            1 => Some(read_name(reader, name::check_prefix)?.to_string()),
            _ => {
                return Err(ProtoError::Malformed(
                    "start_after marker is neither 0 nor 1",
                ))
            }
        };
        let limit = reader.u32()?;
        if limit == 0 {
            return Err(ProtoError::Malformed("a list of at most 0 keys"));
        }
        Ok(ListRequest {
            bucket: bucket.to_string(),
            prefix,
            start_after,
            limit,
        })
    }
}

/// One object in a LIST answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    pub key: String,
    pub object_bytes: u64,
    pub seq: u64,
    pub dirty: bool,
}

/// LIST's answer, carried as the payload: a count, then each entry's key (str16), size, version
/// and dirty flag, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntries {
    pub entries: Vec<ListEntry>,
}

/// The most entries one LIST answer holds.
pub const LIST_ENTRIES_MAX: usize = 10_000;

impl Message for ListEntries {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.entries.len() as u32);
        for entry in &self.entries {
            writer.bytes16(entry.key.as_bytes());
            writer.u64(entry.object_bytes);
            writer.u64(entry.seq);
            writer.u8(u8::from(entry.dirty));
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = reader.u32()? as usize;
        if count > LIST_ENTRIES_MAX {
            return Err(ProtoError::Malformed("more list entries than a page holds"));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let key = reader
                .text16(KEY_BYTES_MAX, "key longer than 1024 bytes")?
                .to_string();
            let object_bytes = reader.u64()?;
            let seq = reader.u64()?;
            let dirty = reader.u8()? != 0;
            entries.push(ListEntry {
                key,
                object_bytes,
                seq,
                dirty,
            });
        }
        Ok(ListEntries { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_entries_round_trip_and_are_bounded() {
        let page = ListEntries {
            entries: vec![
                ListEntry {
                    key: "a/1".into(),
                    object_bytes: 10,
                    seq: 1,
                    dirty: false,
                },
                ListEntry {
                    key: "a/2".into(),
                    object_bytes: 0,
                    seq: 9,
                    dirty: true,
                },
            ],
        };
        assert_eq!(ListEntries::decode(&page.encode()), Ok(page));
        let mut too_many = Writer::new();
        too_many.u32(LIST_ENTRIES_MAX as u32 + 1);
        assert!(ListEntries::decode(&too_many.finish()).is_err());
    }
}
