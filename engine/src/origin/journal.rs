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
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use futures::future::LocalBoxFuture;
use object_store::multipart::PartId;
use object_store::path::Path;

use crate::rt::sync::WaitQueue;
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

/// Store `record` for `key` (durable when this returns). A failure is logged only: the upload
/// then starts over after a restart, as it would without a record.
async fn save(store: &Store, key: &ObjectKey, record: &Record) {
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

/// Every queue of record writes a shard keeps, however many are idle: past this many entries,
/// those of objects with no write pending and no upload holding them are dropped.
const RECORD_QUEUES_KEPT_MAX: usize = 64;

/// How a queue writes a change of its object's record (the store's own writes, or a test's).
type Write = Rc<dyn Fn(Next) -> LocalBoxFuture<'static, ()>>;

/// The queues of record writes of one shard's uploads: one per object, shared by every attempt
/// at uploading it (and by every version), so that all the changes of one record reach the
/// device in the order they were handed. Separate writers, one per attempt, would race: an
/// earlier attempt's pending save could land after a later attempt's record (which then loses
/// its parts, or names an upload that was aborted), and its forget could delete the record of a
/// newer version's upload.
#[derive(Default)]
pub(crate) struct Records {
    queues: RefCell<HashMap<ObjectKey, Weak<Queue>>>,
}

impl Records {
    /// The recorder of `key`'s upload record, writing to `store`.
    pub(crate) fn recorder(&self, store: &Rc<Store>, key: &ObjectKey) -> Recorder {
        self.recorder_with(key, || {
            let (store, key) = (store.clone(), key.clone());
            Rc::new(move |next| {
                let (store, key) = (store.clone(), key.clone());
                Box::pin(async move {
                    match next {
                        Next::Save(record) => save(&store, &key, &record).await,
                        Next::Forget(None) => forget(&store, &key).await,
                        Next::Forget(Some(versions)) => {
                            let stored = load(&store, &key).await;
                            if stored.is_some_and(|record| versions.contains(&record.seq)) {
                                forget(&store, &key).await;
                            }
                        }
                    }
                })
            })
        })
    }

    /// The recorder of `key`'s record: the queue already in use for it, or a new one writing
    /// with what `write` makes.
    fn recorder_with(&self, key: &ObjectKey, write: impl FnOnce() -> Write) -> Recorder {
        let mut queues = self.queues.borrow_mut();
        if let Some(queue) = queues.get(key).and_then(Weak::upgrade) {
            return Recorder { queue };
        }
        if queues.len() >= RECORD_QUEUES_KEPT_MAX {
            queues.retain(|_, queue| queue.strong_count() > 0);
        }
        let queue = Rc::new(Queue {
            state: RefCell::default(),
            settled: WaitQueue::new(),
            write: write(),
        });
        queues.insert(key.clone(), Rc::downgrade(&queue));
        Recorder { queue }
    }
}

/// One object's record writes: the newest change not yet being written, and whether a task is
/// writing. Lives while a recorder or its writing task holds it.
struct Queue {
    state: RefCell<RecorderState>,
    /// Woken when the writing task finds nothing more to write.
    settled: WaitQueue,
    write: Write,
}

/// Writes one object's upload record in a task of its own, so that the upload never waits for
/// it.
///
/// An upload awaiting its record's write while its parts' reads wait in the shard's line for
/// device room would hold that line: the first read in line is woken to take its room, but is
/// polled only when the upload polls its parts again, and the record's write waits behind it.
/// So the upload hands records here and goes on polling its parts. Only the newest pending
/// change is written, and in the order given, whichever attempt handed it (see [`Records`]): a
/// record never overwrites a newer one, and a `forget` is never overtaken by a save made
/// before it.
pub(crate) struct Recorder {
    queue: Rc<Queue>,
}

#[derive(Default)]
struct RecorderState {
    next: Option<Next>,
    writing: bool,
}

/// A change of one object's record, not yet written.
enum Next {
    Save(Record),
    /// Delete the record if it is of one of these versions; of any version with `None` (a
    /// save followed by the forget of its own version, which leaves no record whatever the
    /// device held before).
    Forget(Option<Vec<u64>>),
}

/// Versions whose forgets a queue keeps pending at most, beyond the oldest is dropped (its
/// record, if it is still there, goes at the next start's sweep). Uploads of one object take
/// turns, so more than two are pending only if the device stalls for several attempts.
const FORGETS_PENDING_MAX: usize = 8;

impl Next {
    /// The change that writing `self` and then `later` makes, as one.
    fn then(self, later: Next) -> Next {
        let seq = match later {
            Next::Save(_) | Next::Forget(None) => return later,
            Next::Forget(Some(versions)) => versions,
        };
        match self {
            Next::Save(record) if seq.contains(&record.seq) => Next::Forget(None),
            Next::Save(record) => Next::Save(record),
            Next::Forget(None) => Next::Forget(None),
            Next::Forget(Some(mut versions)) => {
                for version in seq {
                    if !versions.contains(&version) {
                        if versions.len() == FORGETS_PENDING_MAX {
                            versions.remove(0);
                        }
                        versions.push(version);
                    }
                }
                Next::Forget(Some(versions))
            }
        }
    }
}

impl Recorder {
    /// Record `record`, replacing a pending change not yet being written.
    pub(crate) fn save(&self, record: Record) {
        self.hand(Next::Save(record));
    }

    /// Delete the record if it is of version `seq`, after whatever was handed before: an
    /// attempt at an older version that ends after a newer version's upload recorded itself
    /// leaves the newer record alone.
    pub(crate) fn forget(&self, seq: u64) {
        self.hand(Next::Forget(Some(vec![seq])));
    }

    /// Returns once every change handed so far (by any attempt) is written.
    pub(crate) async fn settled(&self) {
        loop {
            {
                let state = self.queue.state.borrow();
                if !state.writing && state.next.is_none() {
                    return;
                }
            }
            self.queue.settled.wait().await;
        }
    }

    fn hand(&self, next: Next) {
        let mut state = self.queue.state.borrow_mut();
        state.next = Some(match state.next.take() {
            Some(pending) => pending.then(next),
            None => next,
        });
        if state.writing {
            return; // the writing task takes it when it is done with the one before
        }
        state.writing = true;
        let queue = self.queue.clone();
        crate::rt::spawn(async move {
            loop {
                let next = {
                    let mut state = queue.state.borrow_mut();
                    match state.next.take() {
                        Some(next) => next,
                        None => {
                            state.writing = false;
                            drop(state);
                            queue.settled.wake_all();
                            return;
                        }
                    }
                };
                (queue.write)(next).await;
            }
        });
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

    /// A record's writes as the device sees them: what reached it, in order, each taking the
    /// time `delay_ms` gives it; and what is stored at the end (the seq of the record, or none).
    struct Device {
        landed: RefCell<Vec<String>>,
        stored: std::cell::Cell<Option<u64>>,
    }

    fn writes_to(device: &Rc<Device>, delay_ms: fn(&Next) -> u64) -> impl Fn() -> Write {
        let device = device.clone();
        move || {
            let device = device.clone();
            Rc::new(move |next: Next| {
                let device = device.clone();
                Box::pin(async move {
                    let delay = std::time::Duration::from_millis(delay_ms(&next));
                    crate::rt::time::sleep(delay).await;
                    let (what, stored) = match next {
                        Next::Save(record) => (format!("save {}", record.seq), Some(record.seq)),
                        Next::Forget(None) => ("forget".to_string(), None),
                        Next::Forget(Some(versions)) => {
                            let stored = device.stored.get();
                            let gone = stored.is_some_and(|seq| versions.contains(&seq));
                            (format!("forget {versions:?}"), stored.filter(|_| !gone))
                        }
                    };
                    device.landed.borrow_mut().push(what);
                    device.stored.set(stored);
                })
            })
        }
    }

    fn seq(seq: u64) -> Record {
        Record { seq, ..record() }
    }

    #[test]
    fn record_writes_of_one_object_land_in_the_order_handed_whichever_attempt_handed_them() {
        crate::rt::run(crate::rt::ReactorConfig::default(), || async {
            let records = Records::default();
            let key = ObjectKey::new("data", "ckpt/model.pt").unwrap();
            let device = Rc::new(Device {
                landed: RefCell::default(),
                stored: Default::default(),
            });
            // The first attempt's records take 50 ms each to write (a busy device), the
            // second attempt's none.
            let slow_then_fast = writes_to(&device, |next| match next {
                Next::Save(record) if record.seq < 3 => 50,
                _ => 0,
            });
            let first = records.recorder_with(&key, &slow_then_fast);
            first.save(seq(1));
            // Its writing task takes record 1 to the device; record 2 waits behind it.
            crate::rt::time::sleep(std::time::Duration::from_millis(5)).await;
            first.save(seq(2));
            drop(first); // the attempt failed; its writes are still pending
            let second = records.recorder_with(&key, &slow_then_fast);
            second.save(seq(3));
            second.settled().await;
            // The second attempt's record was handed last, so it is what stays; the first
            // attempt's pending save was replaced before it reached the device.
            assert_eq!(device.stored.get(), Some(3));
            assert_eq!(*device.landed.borrow(), ["save 1", "save 3"]);
            // An attempt whose record is still being written ends and forgets it; the next
            // version's upload records itself at once: its record is what stays.
            let ending = records.recorder_with(&key, &slow_then_fast);
            ending.save(seq(2));
            crate::rt::time::sleep(std::time::Duration::from_millis(5)).await;
            ending.forget(2);
            drop(ending);
            let next_version = records.recorder_with(&key, &slow_then_fast);
            next_version.save(seq(4));
            next_version.settled().await;
            assert_eq!(device.stored.get(), Some(4));
            assert_eq!(
                *device.landed.borrow(),
                ["save 1", "save 3", "save 2", "save 4"].map(String::from)
            );
            // An older version's attempt that ends now (it was backing off while version 4
            // recorded itself) forgets its own record only: version 4's stays.
            records.recorder_with(&key, &slow_then_fast).forget(2);
            next_version.settled().await;
            assert_eq!(device.stored.get(), Some(4));
            next_version.forget(4);
            next_version.settled().await;
            assert_eq!(device.stored.get(), None);
            // A save and the forget of its own version, both pending: no record, whatever the
            // device held before; a forget of another version leaves a pending save alone.
            next_version.save(seq(5));
            crate::rt::time::sleep(std::time::Duration::from_millis(5)).await;
            next_version.save(seq(6));
            next_version.forget(6);
            next_version.settled().await;
            assert_eq!(device.stored.get(), None);
            next_version.save(seq(7));
            next_version.forget(6);
            next_version.settled().await;
            assert_eq!(device.stored.get(), Some(7));
        });
    }

    #[test]
    fn pending_changes_combine_as_if_written_in_turn() {
        let saved = |seq: u64| Next::Save(Record { seq, ..record() });
        let forgets = |next: &Next| match next {
            Next::Forget(versions) => Some(versions.clone()),
            Next::Save(_) => None,
        };
        assert_eq!(
            forgets(&saved(1).then(Next::Forget(Some(vec![1])))),
            Some(None)
        );
        assert!(matches!(saved(1).then(Next::Forget(Some(vec![2]))), Next::Save(r) if r.seq == 1));
        assert!(matches!(Next::Forget(None).then(saved(3)), Next::Save(r) if r.seq == 3));
        let mut pending = Next::Forget(Some(vec![1]));
        for seq in 2..20 {
            pending = pending.then(Next::Forget(Some(vec![seq])));
        }
        let kept = forgets(&pending).flatten().expect("conditional forgets");
        assert_eq!(kept.len(), FORGETS_PENDING_MAX);
        assert_eq!(kept.last(), Some(&19));
    }

    #[test]
    fn idle_record_queues_are_not_kept() {
        crate::rt::run(crate::rt::ReactorConfig::default(), || async {
            let records = Records::default();
            let device = Rc::new(Device {
                landed: RefCell::default(),
                stored: Default::default(),
            });
            let at_once = writes_to(&device, |_| 0);
            for index in 0..RECORD_QUEUES_KEPT_MAX * 4 {
                let key = ObjectKey::new("data", &format!("object-{index}")).unwrap();
                let recorder = records.recorder_with(&key, &at_once);
                recorder.save(seq(index as u64));
                recorder.settled().await;
            }
            assert!(records.queues.borrow().len() <= RECORD_QUEUES_KEPT_MAX);
            assert_eq!(device.landed.borrow().len(), RECORD_QUEUES_KEPT_MAX * 4);
        });
    }

    #[test]
    fn a_record_key_names_its_object_and_back() {
        let object = ObjectKey::new("data", "ckpt/step-1/rank-0").unwrap();
        let record_key = key_of(&object).unwrap();
        assert!(record_key.is_staged());
        assert_eq!(object_of(&record_key), Some(object));
    }
}
