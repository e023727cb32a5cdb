//! Peer policies for trace replay only: ARC, LIRS, 2Q and W-TinyLFU, beside the policies the
//! engine ships (LRU, FIFO, SIEVE, S3-FIFO and hydrant's), so that `hydrant-bench trace`
//! compares hydrant's policy with the published ones on the same traces and sizes. They hold no
//! data and know nothing of pinning: a cache tier never runs them.
//!
//! Every peer follows libCacheSim's replay rules (every request counts; an object larger than
//! the cache is a miss and is never admitted; on a miss the object is inserted and victims are
//! evicted until it fits) and, where libCacheSim has the policy, its choices of shares.

use std::fmt;
use std::str::FromStr;

use hydrant_engine::policy::{Capacity, EvictionPolicy, PolicyKind};

mod arc;
mod lirs;
mod list;
mod two_q;
mod w_tinylfu;

/// A replayed policy's one operation.
pub trait Peer {
    /// A read of `key`, costing `charge` units of the capacity; true on a hit. On a miss the
    /// policy admits the key if it will, evicting what it must.
    fn access(&mut self, key: u64, charge: u64) -> bool;

    /// Units the resident keys take.
    fn resident_units(&self) -> u64;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    Arc,
    Lirs,
    TwoQ,
    WTinyLfu,
}

impl PeerKind {
    pub const ALL: [PeerKind; 4] = [
        PeerKind::Arc,
        PeerKind::Lirs,
        PeerKind::TwoQ,
        PeerKind::WTinyLfu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Arc => "arc",
            PeerKind::Lirs => "lirs",
            PeerKind::TwoQ => "2q",
            PeerKind::WTinyLfu => "wtinylfu",
        }
    }

    /// A new, empty peer of `capacity` units.
    pub fn build(self, capacity: u64) -> Box<dyn Peer> {
        match self {
            PeerKind::Arc => Box::new(arc::Arc::new(capacity)),
            PeerKind::Lirs => Box::new(lirs::Lirs::new(capacity)),
            PeerKind::TwoQ => Box::new(two_q::TwoQ::new(capacity)),
            PeerKind::WTinyLfu => Box::new(w_tinylfu::WTinyLfu::new(capacity)),
        }
    }
}

/// Any policy `hydrant-bench trace` replays: one the engine ships, or a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed {
    Engine(PolicyKind),
    Peer(PeerKind),
}

impl Replayed {
    pub fn name(self) -> &'static str {
        match self {
            Replayed::Engine(kind) => kind.name(),
            Replayed::Peer(kind) => kind.name(),
        }
    }

    pub fn build(self, capacity: Capacity) -> Box<dyn Peer> {
        match self {
            Replayed::Engine(kind) => Box::new(EnginePolicy {
                policy: kind.build(capacity),
                evicted: Vec::new(),
            }),
            Replayed::Peer(kind) => {
                let peer = kind.build(capacity.units());
                match capacity {
                    Capacity::Bytes(_) => peer,
                    Capacity::Objects(_) => Box::new(OneUnitEach(peer)),
                }
            }
        }
    }
}

impl fmt::Display for Replayed {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for Replayed {
    type Err = String;

    fn from_str(text: &str) -> Result<Replayed, String> {
        if let Some(kind) = PeerKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(text.trim()))
        {
            return Ok(Replayed::Peer(kind));
        }
        text.parse::<PolicyKind>()
            .map(Replayed::Engine)
            .map_err(|_| {
                format!(
                    "unknown policy {text:?} (known: lru, fifo, sieve, s3fifo, hydrant, hydrant-dram, arc, lirs, 2q, wtinylfu)"
                )
            })
    }
}

/// An engine policy behind the peers' interface.
struct EnginePolicy {
    policy: Box<dyn EvictionPolicy>,
    evicted: Vec<u64>,
}

impl Peer for EnginePolicy {
    fn access(&mut self, key: u64, charge: u64) -> bool {
        let hit = self.policy.access(key, charge, &mut self.evicted).is_hit();
        self.evicted.clear();
        hit
    }

    fn resident_units(&self) -> u64 {
        match self.policy.capacity() {
            Capacity::Bytes(_) => self.policy.used_bytes(),
            Capacity::Objects(_) => self.policy.len() as u64,
        }
    }
}

/// A peer over a capacity counted in objects: every key costs one unit, whatever its size.
struct OneUnitEach(Box<dyn Peer>);

impl Peer for OneUnitEach {
    fn access(&mut self, key: u64, _size_bytes: u64) -> bool {
        self.0.access(key, 1)
    }

    fn resident_units(&self) -> u64 {
        self.0.resident_units()
    }
}

#[cfg(test)]
mod tests;
