//! A shard's read-through state: what it knows of origin objects (size and ETag, and when that
//! was last checked), and the origin reads in flight, so that however many readers miss on one
//! chunk at once, the origin sees one request.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;
use std::time::Instant;

use super::remote::Fetch;
use super::{OriginVersion, Revalidate};
use crate::rt::sync::WaitQueue;
use crate::store::ObjectKey;
use crate::{Error, ErrorKind, Result};

/// An origin object as last seen, and when.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub version: OriginVersion,
    pub checked: Instant,
}

/// One origin read in flight (or just finished and being admitted), shared by every reader of
/// its chunk that arrives while its key has not changed.
struct Flight {
    done: RefCell<Option<FlightOutcome>>,
    waiters: WaitQueue,
    /// Whether the key was written or deleted since the read started: then its bytes may be
    /// older than that write, and a reader arriving later starts a read of its own.
    watch: Watch,
}

/// A finished flight: the origin's answer, or the error (kind and message) every waiter gets.
type FlightOutcome = std::result::Result<Rc<Fetch>, (ErrorKind, String)>;

/// Which origin read a flight is: a chunk of an object, or the first read of an object whose
/// size is not known yet.
pub(crate) type FlightKey = (ObjectKey, u64);

/// The flight of the read that discovers an object's size and ETag: its first chunk, the
/// same bytes as chunk 0 of a known version, so the two share a flight.
pub(crate) const DISCOVER: u64 = 0;

/// Bytes a shard's finished origin reads may hold while they are written to NVMe. A reader gets
/// its bytes before they are admitted, so a reader faster than the device would otherwise pile
/// up admissions without end (a 20 GiB read-through onto a small device held gigabytes); at
/// this bound, new origin reads wait until admissions catch up.
pub(crate) const ADMITTING_BYTES_MAX: u64 = 64 << 20;

pub(crate) struct Reads {
    /// Keys with a write or delete in progress or a watch on them (at most the requests and
    /// origin reads in flight): how many times each was changed.
    changes: RefCell<HashMap<ObjectKey, KeyChanges, foldhash::fast::RandomState>>,
    known: RefCell<HashMap<ObjectKey, Known, foldhash::fast::RandomState>>,
    known_max: usize,
    flights: RefCell<HashMap<FlightKey, Rc<Flight>, foldhash::fast::RandomState>>,
    /// The last chunk read of each large object, to spot sequential readers (bounded like
    /// `known`).
    last_chunk: RefCell<HashMap<ObjectKey, u64, foldhash::fast::RandomState>>,
    /// Bytes of finished reads being admitted (bounded by `ADMITTING_BYTES_MAX`), and the
    /// origin reads waiting for them to go down.
    admitting_bytes: Cell<u64>,
    admitted: WaitQueue,
}

impl Reads {
    pub fn new(known_max: usize) -> Reads {
        Reads {
            changes: RefCell::default(),
            known: RefCell::default(),
            known_max,
            flights: RefCell::default(),
            last_chunk: RefCell::default(),
            admitting_bytes: Cell::new(0),
            admitted: WaitQueue::new(),
        }
    }

    /// The object's version if it is known and, under a TTL, checked recently enough.
    pub fn fresh(&self, key: &ObjectKey, revalidate: Revalidate) -> Option<OriginVersion> {
        let known = self.known.borrow();
        let known = known.get(key)?;
        match revalidate {
            Revalidate::Immutable => Some(known.version.clone()),
            Revalidate::Ttl(ttl) => (known.checked.elapsed() < ttl).then(|| known.version.clone()),
        }
    }

    /// The object's version as last seen, however old.
    pub fn last_seen(&self, key: &ObjectKey) -> Option<OriginVersion> {
        self.known
            .borrow()
            .get(key)
            .map(|known| known.version.clone())
    }

    pub fn remember(&self, key: &ObjectKey, version: OriginVersion) {
        let mut known = self.known.borrow_mut();
        if known.len() >= self.known_max && !known.contains_key(key) {
            // Forgetting an entry costs one more origin round trip later, never correctness.
            if let Some(victim) = known.keys().next().cloned() {
                known.remove(&victim);
            }
        }
        known.insert(
            key.clone(),
            Known {
                version,
                checked: Instant::now(),
            },
        );
    }

    /// The cached copy was confirmed current now.
    pub fn confirm(&self, key: &ObjectKey) {
        if let Some(known) = self.known.borrow_mut().get_mut(key) {
            known.checked = Instant::now();
        }
    }

    pub fn forget(&self, key: &ObjectKey) {
        self.known.borrow_mut().remove(key);
        self.last_chunk.borrow_mut().remove(key);
    }

    /// Record a read of chunks `first..=last`; returns whether it continues the previous read
    /// of this object (a sequential reader, worth reading ahead for).
    pub fn note_sequential(&self, key: &ObjectKey, first: u64, last: u64) -> bool {
        let mut chunks = self.last_chunk.borrow_mut();
        let previous = chunks.get(key).copied();
        if chunks.len() >= self.known_max && previous.is_none() {
            if let Some(victim) = chunks.keys().next().cloned() {
                chunks.remove(&victim);
            }
        }
        chunks.insert(key.clone(), last);
        previous.is_some_and(|previous| previous + 1 == first || previous == first)
    }

    /// Origin reads in flight on this shard.
    pub fn flights(&self) -> usize {
        self.flights.borrow().len()
    }

    pub fn in_flight(&self, flight: &FlightKey) -> bool {
        self.flights.borrow().contains_key(flight)
    }

    /// A watch on `key`: it tells later whether the key was written or deleted since now (or
    /// was being written now). What an origin read finds may be remembered or admitted only if
    /// not: a DELETE or PUT acknowledged meanwhile must never be undone by older origin bytes.
    pub fn watch(self: &Rc<Self>, key: &ObjectKey) -> Watch {
        let mut changes = self.changes.borrow_mut();
        let entry = changes.entry(key.clone()).or_default();
        entry.holders += 1;
        Watch {
            reads: self.clone(),
            key: key.clone(),
            generation: entry.generation,
            clean_at_start: entry.changing == 0,
        }
    }

    /// A write or delete of `key` begins; it ends when the guard is dropped (after its answer
    /// is decided). Every watch of the key taken before it ends sees a change.
    pub fn change(self: &Rc<Self>, key: &ObjectKey) -> Change {
        let mut changes = self.changes.borrow_mut();
        let entry = changes.entry(key.clone()).or_default();
        entry.holders += 1;
        entry.changing += 1;
        entry.generation += 1;
        Change {
            reads: self.clone(),
            key: key.clone(),
        }
    }

    /// Keys watched or being changed now (bounded by what is in flight).
    #[cfg(test)]
    fn changes_tracked(&self) -> usize {
        self.changes.borrow().len()
    }

    fn release(&self, key: &ObjectKey, changed: bool) {
        let mut changes = self.changes.borrow_mut();
        let entry = changes.get_mut(key).expect("a held key is tracked");
        entry.holders -= 1;
        if changed {
            entry.changing -= 1;
            entry.generation += 1;
        }
        if entry.holders == 0 {
            changes.remove(key);
        }
    }

    /// The outcome of origin read `flight`: started now as a task of its own (`fetch`, then
    /// `admit` with its answer) unless one is already running for a key unchanged since it
    /// started, in which case this waits for that one. `watch` is the key's, taken before the
    /// read was decided on. The flight stays visible until `admit` finishes, so readers
    /// arriving while the data is being written to NVMe take it from memory instead of asking
    /// the origin again.
    pub async fn coalesced<F, FetchFuture, A, AdmitFuture>(
        self: &Rc<Self>,
        flight: FlightKey,
        watch: Watch,
        fetch: F,
        admit: A,
    ) -> Result<Rc<Fetch>>
    where
        F: FnOnce() -> FetchFuture,
        FetchFuture: Future<Output = Result<Fetch>> + 'static,
        A: FnOnce(Rc<Fetch>) -> AdmitFuture + 'static,
        AdmitFuture: Future<Output = ()> + 'static,
    {
        let shared = match self.joinable(&flight) {
            Some(shared) => shared,
            None => {
                while self.admitting_bytes.get() >= ADMITTING_BYTES_MAX {
                    self.admitted.wait().await;
                }
                if let Some(shared) = self.joinable(&flight) {
                    // Started by another reader while this one waited.
                    return Self::outcome(shared).await;
                }
                let shared = Rc::new(Flight {
                    done: RefCell::new(None),
                    waiters: WaitQueue::new(),
                    watch,
                });
                // A flight of a key changed since it started is replaced: it finishes for its
                // own readers and then leaves the table only if it is still the one there.
                self.flights
                    .borrow_mut()
                    .insert(flight.clone(), shared.clone());
                let reads = self.clone();
                let running = shared.clone();
                // Started only here: a reader that joins a flight must not ask the origin.
                let fetch = fetch();
                // A task of its own: the flight completes even if the reader that started it
                // goes away, so the readers waiting on it are always answered.
                crate::rt::spawn(async move {
                    let outcome = fetch
                        .await
                        .map(Rc::new)
                        .map_err(|error| (error.kind(), error.context().to_string()));
                    *running.done.borrow_mut() = Some(outcome.clone());
                    running.waiters.wake_all();
                    if let Ok(fetched) = outcome {
                        let bytes = fetched.data_bytes();
                        reads
                            .admitting_bytes
                            .set(reads.admitting_bytes.get() + bytes);
                        admit(fetched).await;
                        reads
                            .admitting_bytes
                            .set(reads.admitting_bytes.get() - bytes);
                        reads.admitted.wake_all();
                    }
                    let mut flights = reads.flights.borrow_mut();
                    if flights
                        .get(&flight)
                        .is_some_and(|current| Rc::ptr_eq(current, &running))
                    {
                        flights.remove(&flight);
                    }
                });
                shared
            }
        };
        Self::outcome(shared).await
    }

    /// The flight of `flight` in progress, if its key has not changed since it started.
    fn joinable(&self, flight: &FlightKey) -> Option<Rc<Flight>> {
        self.flights
            .borrow()
            .get(flight)
            .filter(|shared| shared.watch.unchanged())
            .cloned()
    }

    /// What `flight` read, once it has.
    async fn outcome(flight: Rc<Flight>) -> Result<Rc<Fetch>> {
        loop {
            if let Some(outcome) = flight.done.borrow().clone() {
                return outcome.map_err(|(kind, message)| Error::new(kind, message));
            }
            flight.waiters.wait().await;
        }
    }
}

/// How often a key was changed, while anything watches it or changes it.
#[derive(Default)]
struct KeyChanges {
    /// Raised when a change begins and when it ends.
    generation: u64,
    /// Changes in progress.
    changing: u32,
    /// Watches and changes holding this entry.
    holders: u32,
}

/// See `Reads::watch`.
pub(crate) struct Watch {
    reads: Rc<Reads>,
    key: ObjectKey,
    generation: u64,
    clean_at_start: bool,
}

impl Watch {
    /// No write or delete of the key was in progress when the watch began, none began since.
    pub fn unchanged(&self) -> bool {
        self.clean_at_start
            && self
                .reads
                .changes
                .borrow()
                .get(&self.key)
                .is_some_and(|entry| entry.generation == self.generation)
    }
}

impl Clone for Watch {
    fn clone(&self) -> Watch {
        let mut changes = self.reads.changes.borrow_mut();
        changes
            .get_mut(&self.key)
            .expect("a watched key is tracked")
            .holders += 1;
        Watch {
            reads: self.reads.clone(),
            key: self.key.clone(),
            generation: self.generation,
            clean_at_start: self.clean_at_start,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.reads.release(&self.key, false);
    }
}

/// See `Reads::change`.
pub(crate) struct Change {
    reads: Rc<Reads>,
    key: ObjectKey,
}

impl Drop for Change {
    fn drop(&mut self) {
        self.reads.release(&self.key, true);
    }
}

/// A stable tag for an origin version, part of its chunk keys.
pub(crate) fn version_tag(version: &OriginVersion) -> u64 {
    // FNV-1a: stable across processes and releases, unlike the standard hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let text = match &version.etag {
        Some(etag) => etag.clone(),
        None => format!("bytes:{}", version.bytes),
    };
    for byte in text.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::time::sleep;
    use std::time::Duration;

    #[test]
    fn new_origin_reads_wait_while_admissions_hold_the_bound() {
        const READ_BYTES: u64 = ADMITTING_BYTES_MAX / 4;
        crate::rt::run(crate::rt::ReactorConfig::default(), || async {
            let reads = Rc::new(Reads::new(16));
            let key = ObjectKey::new("b", "k").unwrap();
            let started = Rc::new(Cell::new(0u32));
            let released = Rc::new(Cell::new(false));
            let release = Rc::new(WaitQueue::new());
            // An origin read whose admission lasts until `released`.
            let read = |chunk: u64| {
                let (started, released, release) =
                    (started.clone(), released.clone(), release.clone());
                let fetch = move || {
                    started.set(started.get() + 1);
                    async move {
                        Ok(Fetch::Data {
                            version: OriginVersion {
                                bytes: 1 << 40,
                                etag: None,
                                modified_ms: 0,
                                attributes: Default::default(),
                            },
                            start: 0,
                            data: bytes::Bytes::from(vec![0u8; READ_BYTES as usize]),
                        })
                    }
                };
                let admit = move |_fetched: Rc<Fetch>| async move {
                    while !released.get() {
                        release.wait().await;
                    }
                };
                let reads = reads.clone();
                let watch = reads.watch(&key);
                let flight = (key.clone(), chunk);
                crate::rt::spawn(async move { reads.coalesced(flight, watch, fetch, admit).await })
            };
            let first: Vec<_> = (0..4).map(read).collect();
            sleep(Duration::from_millis(20)).await;
            assert_eq!(started.get(), 4);
            assert_eq!(reads.admitting_bytes.get(), ADMITTING_BYTES_MAX);
            // Every reader has its bytes, though none is admitted yet.
            for reader in first {
                assert!(reader.await.is_ok());
            }
            // The bound is reached: the next read waits for an admission to finish.
            let waiting = read(4);
            sleep(Duration::from_millis(20)).await;
            assert_eq!(started.get(), 4, "a fifth read started beyond the bound");
            released.set(true);
            release.wake_all();
            assert!(waiting.await.is_ok());
            assert_eq!(started.get(), 5);
            sleep(Duration::from_millis(20)).await;
            assert_eq!(reads.admitting_bytes.get(), 0);
            assert_eq!(reads.flights(), 0);
        });
    }

    #[test]
    fn a_watch_sees_changes_that_began_before_or_during_it_and_nothing_stays_tracked() {
        let reads = Rc::new(Reads::new(16));
        let key = ObjectKey::new("b", "k").unwrap();
        let other = ObjectKey::new("b", "other").unwrap();
        let quiet = reads.watch(&key);
        assert!(quiet.unchanged());
        let copy = quiet.clone();
        {
            let _other = reads.change(&other);
            assert!(quiet.unchanged(), "another key's change is not this key's");
        }
        let change = reads.change(&key);
        assert!(!quiet.unchanged() && !copy.unchanged());
        let during = reads.watch(&key);
        assert!(
            !during.unchanged(),
            "a change in progress when the watch began"
        );
        drop(change);
        assert!(!during.unchanged() && !quiet.unchanged());
        let after = reads.watch(&key);
        assert!(after.unchanged());
        drop((quiet, copy, during, after));
        assert_eq!(reads.changes_tracked(), 0);
    }
}
