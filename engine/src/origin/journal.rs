//! The record of a multipart write-back upload open at an object store, kept on NVMe so that
//! after a crash or restart the upload goes on from the parts the origin already holds instead
//! of starting over.
//!
//! It is a staged object (never uploaded, pinned, see `ObjectKey::staged`) named
//! `writeback/BUCKET/KEY`, written on the shard that owns the object it describes (not the one
//! its own name hashes to: only that shard's uploader reads it), rewritten as parts are
//! acknowledged and deleted when the upload completes or is given up. Its text:
//!
//! ```text
//! hydrant write-back upload 1
//! seq SEQ
//! bytes BYTES
//! part_bytes PART_BYTES
//! origin URL
//! path PATH
//! id UPLOAD_ID
//! part INDEX ETAG        (one line per part the origin acknowledged)
//! ```
//!
//! A record that does not parse, or describes another version or another place, is ignored
//! (its upload is aborted at the origin when it can be named).

use std::cell::RefCell;
use std::rc::Rc;

use object_store::multipart::PartId;
use object_store::path::Path;

use crate::store::{ObjectKey, Store};

const MAGIC: &str = "hydrant write-back upload 1";

/// The staged prefix all records live under.
pub(crate) const PREFIX: &str = "writeback/";

/// What a record says.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub seq: u64,
    pub bytes: u64,
    pub part_bytes: u64,
    pub origin: String,
    pub path: String,
    pub id: String,
    pub parts: Vec<Option<PartId>>,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{MAGIC}\nseq {}\nbytes {}\npart_bytes {}\norigin {}\npath {}\nid {}\n",
            self.seq, self.bytes, self.part_bytes, self.origin, self.path, self.id
        );
        for (index, part) in self.parts.iter().enumerate() {
            if let Some(part) = part {
                text.push_str(&format!("part {index} {}\n", part.content_id));
            }
        }
        text.into_bytes()
    }

    pub fn decode(data: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(data).ok()?;
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut field = |name: &str| -> Option<String> {
            let line = lines.next()?;
            line.strip_prefix(name)?
                .strip_prefix(' ')
                .map(str::to_string)
        };
        let seq = field("seq")?.parse().ok()?;
        let bytes: u64 = field("bytes")?.parse().ok()?;
        let part_bytes: u64 = field("part_bytes")?.parse().ok()?;
        let origin = field("origin")?;
        let path = field("path")?;
        let id = field("id")?;
        // S3's smallest part; the part count follows from `bytes` and `part_bytes`.
        if part_bytes < 5 << 20 || id.is_empty() {
            return None;
        }
        let count = usize::try_from(bytes.div_ceil(part_bytes)).ok()?;
        if count > super::parts::PARTS_PER_UPLOAD_MAX as usize {
            return None;
        }
        let mut parts = vec![None; count];
        for line in lines {
            let mut words = line.split(' ');
            let (Some("part"), Some(index), Some(etag), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return None;
            };
            let index: usize = index.parse().ok()?;
            *parts.get_mut(index)? = Some(PartId {
                content_id: etag.to_string(),
            });
        }
        Some(Record {
            seq,
            bytes,
            part_bytes,
            origin,
            path,
            id,
            parts,
        })
    }

    pub fn path(&self) -> Path {
        Path::from(self.path.as_str())
    }
}

/// The record's key for object `key`; `None` when the name would be too long to hold (such an
/// object's upload is not recorded and starts over after a restart).
pub(crate) fn key_of(key: &ObjectKey) -> Option<ObjectKey> {
    ObjectKey::staged(&format!("{PREFIX}{}/{}", key.bucket(), key.key())).ok()
}

/// The object a record's key names.
pub(crate) fn object_of(record_key: &ObjectKey) -> Option<ObjectKey> {
    let rest = record_key.key().strip_prefix(PREFIX)?;
    let (bucket, key) = rest.split_once('/')?;
    ObjectKey::new(bucket, key).ok()
}

/// The record of `key`'s upload, if one is stored and readable.
pub(crate) async fn load(store: &Store, key: &ObjectKey) -> Option<Record> {
    let record_key = key_of(key)?;
    let read = store.get(&record_key, None).await.ok()??;
    Record::decode(&read.to_vec())
}

/// Store `record` for `key` (durable when this returns `Ok`). A failure is logged only: the
/// upload then starts over after a restart, as it would without a record.
pub(crate) async fn save(store: &Store, key: &ObjectKey, record: &Record) {
    let Some(record_key) = key_of(key) else {
        return;
    };
    if let Err(error) = store.put(record_key, &record.encode(), true).await {
        log::warn!(
            "could not record the upload of {}/{}: {error}",
            key.bucket(),
            key.key()
        );
    }
}

/// Writes one upload's record in a task of its own, so that the upload never waits for it.
///
/// An upload awaiting its record's write while its parts' reads wait in the shard's line for
/// device room would hold that line: the first read in line is woken to take its room, but is
/// polled only when the upload polls its parts again, and the record's write waits behind it.
/// So the upload hands records here and goes on polling its parts. Only the newest pending
/// record is written, and in the order given: a record never overwrites a newer one, and a
/// `forget` is never overtaken by a save made before it.
pub(crate) struct Recorder {
    store: Rc<Store>,
    key: ObjectKey,
    state: Rc<RefCell<RecorderState>>,
}

#[derive(Default)]
struct RecorderState {
    next: Option<Next>,
    writing: bool,
}

enum Next {
    Save(Record),
    Forget,
}

impl Recorder {
    pub(crate) fn new(store: Rc<Store>, key: ObjectKey) -> Self {
        Recorder {
            store,
            key,
            state: Rc::default(),
        }
    }

    /// Record `record`, replacing a pending one not yet being written.
    pub(crate) fn save(&self, record: Record) {
        self.hand(Next::Save(record));
    }

    /// Delete the record, after whatever was handed before.
    pub(crate) fn forget(&self) {
        self.hand(Next::Forget);
    }

    fn hand(&self, next: Next) {
        let mut state = self.state.borrow_mut();
        state.next = Some(next);
        if state.writing {
            return; // the writing task takes it when it is done with the one before
        }
        state.writing = true;
        let (store, key, state) = (self.store.clone(), self.key.clone(), self.state.clone());
        crate::rt::spawn(async move {
            loop {
                let next = {
                    let mut state = state.borrow_mut();
                    match state.next.take() {
                        Some(next) => next,
                        None => {
                            state.writing = false;
                            return;
                        }
                    }
                };
                match next {
                    Next::Save(record) => save(&store, &key, &record).await,
                    Next::Forget => forget(&store, &key).await,
                }
            }
        });
    }
}

/// Delete `key`'s record if it is of version `seq` (a newer version's upload may have recorded
/// itself meanwhile).
pub(crate) async fn forget_version(store: &Store, key: &ObjectKey, seq: u64) {
    if load(store, key)
        .await
        .is_some_and(|record| record.seq == seq)
    {
        forget(store, key).await;
    }
}

/// Delete `key`'s record, if any.
pub(crate) async fn forget(store: &Store, key: &ObjectKey) {
    let Some(record_key) = key_of(key) else {
        return;
    };
    if let Err(error) = store.delete(record_key).await {
        log::warn!(
            "could not delete the upload record of {}/{}: {error}",
            key.bucket(),
            key.key()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            seq: 42,
            bytes: 50 << 20,
            part_bytes: 16 << 20,
            origin: "s3://bucket/prefix".into(),
            path: "prefix/data/big file".into(),
            id: "abc-DEF_123".into(),
            parts: vec![
                Some(PartId {
                    content_id: "\"0123456789abcdef0123456789abcdef\"".into(),
                }),
                None,
                Some(PartId {
                    content_id: "\"fedcba9876543210fedcba9876543210\"".into(),
                }),
                None,
            ],
        }
    }

    fn texts(parts: &[Option<PartId>]) -> Vec<Option<String>> {
        parts
            .iter()
            .map(|part| part.as_ref().map(|part| part.content_id.clone()))
            .collect()
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let written = record();
        let read = Record::decode(&written.encode()).expect("decodes");
        assert_eq!(read.seq, 42);
        assert_eq!(read.path, "prefix/data/big file");
        assert_eq!(read.id, written.id);
        assert_eq!(texts(&read.parts), texts(&written.parts));
    }

    #[test]
    fn damaged_or_foreign_records_are_refused() {
        let good = String::from_utf8(record().encode()).unwrap();
        for bad in [
            good.replace("upload 1", "upload 2"),
            good.replace("part 2 ", "part 9 "),
            good.replace("seq 42", "seq x"),
            good.replace("part_bytes 16777216", "part_bytes 0"),
            good.replace("\nid abc-DEF_123", ""),
            format!("{good}part 1\n"),
            good[..good.len() / 2].to_string(),
        ] {
            assert!(Record::decode(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_record_key_names_its_object_and_back() {
        let object = ObjectKey::new("data", "ckpt/step-1/rank-0").unwrap();
        let record_key = key_of(&object).unwrap();
        assert!(record_key.is_staged());
        assert_eq!(object_of(&record_key), Some(object));
    }
}
