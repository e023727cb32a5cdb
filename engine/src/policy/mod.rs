//! Eviction and admission policies: which objects a tier keeps when it is full.
//!
//! A policy sees only keys (the tier hashes its object keys into a `u64`) and sizes in bytes; it
//! holds no data. The tier asks [`EvictionPolicy::access`] on every read and drops the data of
//! every key the policy reports as evicted; it tells the policy about removals it did itself
//! ([`EvictionPolicy::remove`]) and pins the keys it must not lose (dirty objects not yet written
//! back, [`EvictionPolicy::set_pinned`]).
//!
//! - [`Lru`], [`Fifo`]: the classic baselines, kept for comparison.
//! - [`Sieve`]: SIEVE (NSDI'24), one FIFO queue with a visited bit and a moving hand.
//! - [`S3Fifo`]: S3-FIFO (SOSP'23), a small probationary FIFO, a main FIFO and a ghost queue.
//! - [`TinyLfuSieve`]: hydrant's policy, a SIEVE main queue behind a W-TinyLFU admission filter
//!   whose window adapts to the workload.
//!
//! Capacities count bytes or objects ([`Capacity`]). The rules are libCacheSim's, so that results
//! can be checked against its published figures: every request counts; an object larger than the
//! whole cache is a miss and is never admitted; on a miss the object is inserted and victims are
//! evicted until it fits. Every operation is O(1), apart from SIEVE's hand, which is amortised
//! O(1). Entries live in a slab and queues are linked by slot number, so that nothing allocates
//! per operation once the cache is full.

mod fifo;
mod ghost;
mod lru;
mod random;
mod s3fifo;
mod sieve;
pub mod sketch;
mod table;
mod tiny_lfu_sieve;
mod window_chooser;

use std::fmt;
use std::str::FromStr;

pub use fifo::Fifo;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use sieve::Sieve;
pub use sketch::FrequencySketch;
pub use tiny_lfu_sieve::TinyLfuSieve;

/// The DRAM tier's policy: its shadow caches (which size its admission window) see at least
/// one key in this many. The tier's policy runs on every hit, and unsampled shadows are five of
/// its six cache accesses: 4 KiB GETs from the tier go 8-14% faster with this floor
/// (hydrant-bench server), and on cloudPhysicsIO at 128 MiB-1 GiB the policy misses the same
/// but for +0.6% at 512 MiB (`hydrant-bench trace --policies hydrant,hydrant-dram`). A tier of
/// more than about 16 GiB per shard samples more sparsely anyway (16,384 shadow objects of an
/// assumed 64 KiB).
pub const DRAM_SHADOW_SAMPLE_ONE_IN_MIN: u64 = 16;
/// How big a cache is: in bytes (each object costs its size) or in objects (each costs one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    Bytes(u64),
    Objects(u64),
}

impl Capacity {
    /// The capacity in its own unit.
    pub fn units(self) -> u64 {
        match self {
            Capacity::Bytes(bytes) => bytes,
            Capacity::Objects(objects) => objects,
        }
    }
}

/// What an access did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The key was resident.
    Hit,
    /// The key was absent and is now resident (victims may have been evicted for it).
    MissAdmitted,
    /// The key was absent and stays absent: too large, refused by admission, or the unpinned part
    /// of the cache could not make room.
    MissRejected,
}

impl Access {
    pub fn is_hit(self) -> bool {
        self == Access::Hit
    }
}

/// An eviction policy over `u64` keys. Implementations never allocate per operation once full
/// (apart from growing `evicted`, which the caller reuses).
pub trait EvictionPolicy {
    /// The policy's short name, as the benchmark's `--policies` spells it.
    fn name(&self) -> &'static str;

    fn capacity(&self) -> Capacity;

    /// A read of `key`, an object of `size_bytes`. On a hit the policy notes the use; on a miss it
    /// decides whether to admit the object and, if so, evicts victims until it fits, pushing
    /// their keys onto `evicted` (which it does not clear). A resident object keeps the size it
    /// was admitted with; to change it, remove the key first.
    fn access(&mut self, key: u64, size_bytes: u64, evicted: &mut Vec<u64>) -> Access;

    /// A write of `key`: the object is stored now and should be resident, without admission's
    /// veto. With `pinned` it is never evicted until [`EvictionPolicy::set_pinned`] clears the
    /// pin. A resident key counts as a hit and gains the pin if asked (never loses one here).
    /// The answer is `MissRejected` only when the object cannot fit: it is larger than the cache,
    /// or pinned objects hold the rest.
    fn insert(&mut self, key: u64, size_bytes: u64, pinned: bool, evicted: &mut Vec<u64>)
        -> Access;

    /// Forgets `key` (removed by the tier itself). Returns whether it was resident.
    fn remove(&mut self, key: u64) -> bool;

    /// Pins or unpins a resident key. An unpinned key re-enters the policy as if newly admitted.
    /// Returns whether the key was resident.
    fn set_pinned(&mut self, key: u64, pinned: bool) -> bool;

    fn contains(&self, key: u64) -> bool;

    /// Resident objects.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the resident objects (whatever the capacity counts).
    fn used_bytes(&self) -> u64;
}

/// The policies hydrant ships, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    Lru,
    Fifo,
    Sieve,
    S3Fifo,
    Hydrant,
    /// hydrant's policy as the DRAM tier builds it: shadows sampled at least one key in
    /// [`DRAM_SHADOW_SAMPLE_ONE_IN_MIN`]. Not in `ALL`; named `hydrant-dram`.
    HydrantDram,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Lru,
        PolicyKind::Fifo,
        PolicyKind::Sieve,
        PolicyKind::S3Fifo,
        PolicyKind::Hydrant,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::Sieve => "sieve",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::Hydrant => "hydrant",
            PolicyKind::HydrantDram => "hydrant-dram",
        }
    }

    /// A new, empty policy of this kind.
    pub fn build(self, capacity: Capacity) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(capacity)),
            PolicyKind::Fifo => Box::new(Fifo::new(capacity)),
            PolicyKind::Sieve => Box::new(Sieve::new(capacity)),
            PolicyKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
            PolicyKind::Hydrant => Box::new(TinyLfuSieve::new(capacity)),
            PolicyKind::HydrantDram => Box::new(TinyLfuSieve::with_shadow_sampling(
                capacity,
                DRAM_SHADOW_SAMPLE_ONE_IN_MIN,
            )),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(text: &str) -> Result<PolicyKind, String> {
        PolicyKind::ALL
            .into_iter()
            .chain([PolicyKind::HydrantDram])
            .find(|kind| kind.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| {
                format!(
                    "unknown policy {text:?} (known: lru, fifo, sieve, s3fifo, hydrant, hydrant-dram)"
                )
            })
    }
}

#[cfg(test)]
mod tests;
