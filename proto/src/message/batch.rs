//! BATCH_GET: many GETs in one request, answered item by item.

use crate::codec::{Reader, Writer};
use crate::ProtoError;

use super::*;

/// BATCH_GET: many GETs in one request. Each item is answered by a frame of its own (with the
/// batch's request id, a BatchItem extension and the item's status), as it completes or, with
/// the IN_ORDER flag, in request order. Every answer but the last carries the MORE flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchGetRequest {
    pub items: Vec<GetRequest>,
}

impl Message for BatchGetRequest {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.items.len() as u32);
        for item in &self.items {
            item.encode_into(writer);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = reader.u32()? as usize;
        if count == 0 {
            return Err(ProtoError::Malformed("an empty batch"));
        }
        // Each item takes at least 21 bytes, so the extension's own length bounds the count
        // before anything is allocated for it.
        let mut items = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            items.push(GetRequest::decode_from(reader)?);
        }
        Ok(BatchGetRequest { items })
    }
}

/// The extension of one BATCH_GET answer: which item, and (when its status is OK) the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchItem {
    pub item: u32,
    pub info: Option<ObjectInfo>,
}

impl Message for BatchItem {
    fn encode_into(&self, writer: &mut Writer) {
        writer.u32(self.item);
        if let Some(info) = &self.info {
            info.encode_into(writer);
        }
    }

    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let item = reader.u32()?;
        let info = if reader.remaining() > 0 {
            Some(ObjectInfo::decode_from(reader)?)
        } else {
            None
        };
        Ok(BatchItem { item, info })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip() {
        let item = GetRequest {
            name: ObjectName {
                bucket: "b".into(),
                key: "k".into(),
            },
            range_start: 0,
            range_end: None,
        };
        let batch = BatchGetRequest {
            items: vec![item.clone(), item],
        };
        assert_eq!(BatchGetRequest::decode(&batch.encode()), Ok(batch));
        let answer = BatchItem {
            item: 3,
            info: Some(ObjectInfo {
                object_bytes: 5,
                seq: 1,
                dirty: false,
                range_start: 0,
            }),
        };
        assert_eq!(BatchItem::decode(&answer.encode()), Ok(answer));
        let failed = BatchItem {
            item: 4,
            info: None,
        };
        assert_eq!(BatchItem::decode(&failed.encode()), Ok(failed));
        let mut lying = Writer::new();
        lying.u32(1_000_000);
        assert!(
            BatchGetRequest::decode(&lying.finish()).is_err(),
            "a count the bytes cannot hold"
        );
    }
}
