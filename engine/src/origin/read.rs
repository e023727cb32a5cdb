//! A shard's read-through state: what it knows of origin objects (size and ETag, and when that
//! was last checked), and the origin reads in flight, so that however many readers miss on one
//! chunk at once, the origin sees one request.

use std::cell::RefCell;
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
/// its chunk.
#[derive(Default)]
struct Flight {
    done: RefCell<Option<FlightOutcome>>,
    waiters: WaitQueue,
}

/// A finished flight: the origin's answer, or the error (kind and message) every waiter gets.
type FlightOutcome = std::result::Result<Rc<Fetch>, (ErrorKind, String)>;

/// Which origin read a flight is: a chunk of an object, or the first read of an object whose
/// size is not known yet.
pub(crate) type FlightKey = (ObjectKey, u64);

/// The flight of the read that discovers an object's size and ETag: its first chunk, the
/// same bytes as chunk 0 of a known version, so the two share a flight.
pub(crate) const DISCOVER: u64 = 0;

pub(crate) struct Reads {
    known: RefCell<HashMap<ObjectKey, Known, foldhash::fast::RandomState>>,
    known_max: usize,
    flights: RefCell<HashMap<FlightKey, Rc<Flight>, foldhash::fast::RandomState>>,
    /// The last chunk read of each large object, to spot sequential readers (bounded like
    /// `known`).
    last_chunk: RefCell<HashMap<ObjectKey, u64, foldhash::fast::RandomState>>,
}

impl Reads {
    pub fn new(known_max: usize) -> Reads {
        Reads {
            known: RefCell::default(),
            known_max,
            flights: RefCell::default(),
            last_chunk: RefCell::default(),
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

    pub fn in_flight(&self, flight: &FlightKey) -> bool {
        self.flights.borrow().contains_key(flight)
    }

    /// The outcome of origin read `flight`: started now as a task of its own (`fetch`, then
    /// `admit` with its answer) unless one is already running, in which case this waits for
    /// that one. The flight stays visible until `admit` finishes, so readers arriving while the
    /// data is being written to NVMe take it from memory instead of asking the origin again.
    pub async fn coalesced<F, FetchFuture, A, AdmitFuture>(
        self: &Rc<Self>,
        flight: FlightKey,
        fetch: F,
        admit: A,
    ) -> Result<Rc<Fetch>>
    where
        F: FnOnce() -> FetchFuture,
        FetchFuture: Future<Output = Result<Fetch>> + 'static,
        A: FnOnce(Rc<Fetch>) -> AdmitFuture + 'static,
        AdmitFuture: Future<Output = ()> + 'static,
    {
        let existing = self.flights.borrow().get(&flight).cloned();
        let shared = match existing {
            Some(shared) => shared,
            None => {
                let shared = Rc::new(Flight::default());
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
                        admit(fetched).await;
                    }
                    reads.flights.borrow_mut().remove(&flight);
                });
                shared
            }
        };
        loop {
            if let Some(outcome) = shared.done.borrow().clone() {
                return outcome.map_err(|(kind, message)| Error::new(kind, message));
            }
            shared.waiters.wait().await;
        }
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
