//! The DRAM tier: a shard's hottest whole objects in memory, chosen by hydrant's policy (SIEVE
//! behind an adaptive W-TinyLFU admission filter, `policy::TinyLfuSieve`), sized in bytes.
//!
//! An entry is tied to the version (`seq`) it was read from: a lookup names the version NVMe
//! holds now, and an entry of another version is a miss, so a write or a delete never needs to
//! reach the tier to keep it correct (writes still drop their key, to give the memory back
//! sooner).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::key::ObjectKey;
use crate::policy::{Access, Capacity, EvictionPolicy, TinyLfuSieve};

/// A tier holds objects up to this share of its capacity, so one object never flushes it.
const OBJECT_SHARE_OF_CAPACITY: u64 = 16;
/// And never objects larger than this: bigger reads are bound by bandwidth, not latency.
pub const DRAM_OBJECT_BYTES_MAX: u64 = 4 << 20;
pub use crate::policy::DRAM_SHADOW_SAMPLE_ONE_IN_MIN;

/// An object's bytes as the tier holds them and hands them out. The count of holders lives in
/// a small allocation of its own, away from the bytes: a hit touches it (and the kernel's send
/// then streams the bytes), and small counts stay in cache where the cold line in front of each
/// object would not (a DRAM hit's first cache miss, measured: `incq` in `held` was 66% of its
/// time with `Rc<[u8]>`). Shared across threads (`Arc`), so that a gateway on other threads
/// (the S3 endpoint) sends a hit's bytes without copying them; the count is touched by one
/// thread at a time in the common case, where an atomic increment costs what a plain one does.
pub type DramBytes = Arc<Box<[u8]>>;

struct Resident {
    key: ObjectKey,
    seq: u64,
    data: DramBytes,
    /// CRC32C of `data`, so that an answer's checksum costs no pass over the bytes.
    crc: u32,
}

/// What a lookup found.
pub enum Lookup {
    /// The object's bytes, for the version asked, and their CRC32C.
    Hit(DramBytes, u32),
    /// Not held, but admitted: read the object whole and `fill` it.
    Fill,
    /// Not held and not admitted (or not a whole-object read): read NVMe only.
    Pass,
}

/// Counters of one shard's DRAM tier.
#[derive(Clone, Copy, Debug, Default)]
pub struct DramStats {
    pub hits: u64,
    pub misses: u64,
    pub objects: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
}

pub struct DramTier {
    policy: RefCell<TinyLfuSieve>,
    /// By the key's hash (already mixed: foldhash again is cheap, unlike the default SipHash).
    residents: RefCell<HashMap<u64, Resident, foldhash::fast::RandomState>>,
    evicted: RefCell<Vec<u64>>,
    /// A fixed seed: keys only steer the policy's sketch, and a collision costs a miss.
    hasher: foldhash::fast::FixedState,
    object_bytes_max: u64,
    stats: RefCell<DramStats>,
}

impl DramTier {
    /// A tier of `capacity_bytes`, or `None` for 0 (no DRAM tier).
    pub fn new(capacity_bytes: u64) -> Option<DramTier> {
        if capacity_bytes == 0 {
            return None;
        }
        Some(DramTier {
            policy: RefCell::new(TinyLfuSieve::with_shadow_sampling(
                Capacity::Bytes(capacity_bytes),
                DRAM_SHADOW_SAMPLE_ONE_IN_MIN,
            )),
            residents: RefCell::default(),
            evicted: RefCell::default(),
            hasher: foldhash::fast::FixedState::with_seed(0x6879_6472_616e_7421),
            object_bytes_max: (capacity_bytes / OBJECT_SHARE_OF_CAPACITY)
                .min(DRAM_OBJECT_BYTES_MAX),
            stats: RefCell::new(DramStats {
                capacity_bytes,
                ..DramStats::default()
            }),
        })
    }

    fn hash(&self, key: &ObjectKey) -> u64 {
        self.hasher.hash_one(key.as_bytes())
    }

    /// The bytes of version `seq` of `key` (whose hash is `hash`) and their CRC32C, if held.
    /// The store numbers every version of every key of its shard apart (`seq`), so a resident
    /// of the asked seq is the asked key's: the key is compared only in debug builds (it lies in
    /// an allocation of its own, a cache miss on every hit).
    fn held(&self, hash: u64, key: &ObjectKey, seq: u64) -> Option<(DramBytes, u32)> {
        self.residents
            .borrow()
            .get(&hash)
            .filter(|resident| {
                debug_assert!(
                    resident.seq != seq || resident.key == *key,
                    "version {seq} held for two keys"
                );
                resident.seq == seq
            })
            .map(|resident| (resident.data.clone(), resident.crc))
    }

    /// Version `seq` of `key` (of `bytes`) and its CRC32C, if the tier holds it: then counted as
    /// a hit, as `lookup` counts it (by the policy too when the read is `whole`); otherwise
    /// `None` and nothing counted.
    pub fn hit_if_held(
        &self,
        key: &ObjectKey,
        seq: u64,
        bytes: u64,
        whole: bool,
    ) -> Option<(DramBytes, u32)> {
        let hash = self.hash(key);
        let held = self.held(hash, key, seq)?;
        if bytes <= self.object_bytes_max && whole {
            let mut evicted = self.evicted.borrow_mut();
            self.policy.borrow_mut().access(hash, bytes, &mut evicted);
            self.drop_evicted(&mut evicted);
        }
        self.stats.borrow_mut().hits += 1;
        Some(held)
    }

    /// A read of `key`, whose version on NVMe is `seq` and whose size is `bytes`; `whole` when
    /// the read wants the whole object (only those are admitted). Counts a hit or a miss.
    pub fn lookup(&self, key: &ObjectKey, seq: u64, bytes: u64, whole: bool) -> Lookup {
        let hash = self.hash(key);
        let held = self.held(hash, key, seq);
        if bytes > self.object_bytes_max || !whole {
            // Not the tier's kind of read: a hit is served, nothing is admitted.
            return self.count(held.map_or(Lookup::Pass, |(data, crc)| Lookup::Hit(data, crc)));
        }
        let access = {
            let mut evicted = self.evicted.borrow_mut();
            let access = self.policy.borrow_mut().access(hash, bytes, &mut evicted);
            self.drop_evicted(&mut evicted);
            access
        };
        let lookup = match (access, held) {
            (Access::Hit, Some((data, crc))) => Lookup::Hit(data, crc),
            (Access::Hit, None) | (Access::MissAdmitted, _) => Lookup::Fill,
            (Access::MissRejected, _) => Lookup::Pass,
        };
        self.count(lookup)
    }

    fn count(&self, lookup: Lookup) -> Lookup {
        let mut stats = self.stats.borrow_mut();
        match lookup {
            Lookup::Hit(..) => stats.hits += 1,
            Lookup::Fill | Lookup::Pass => stats.misses += 1,
        }
        lookup
    }

    /// The bytes of version `seq` of `key`, read after a `Fill`, and their CRC32C.
    pub fn fill(&self, key: &ObjectKey, seq: u64, data: &[u8], crc: u32) {
        let hash = self.hash(key);
        if !self.policy.borrow().contains(hash) {
            return; // evicted between the lookup and the read
        }
        let resident = Resident {
            key: key.clone(),
            seq,
            data: Arc::new(Box::from(data)),
            crc,
        };
        let mut stats = self.stats.borrow_mut();
        stats.bytes += data.len() as u64;
        stats.objects += 1;
        if let Some(replaced) = self.residents.borrow_mut().insert(hash, resident) {
            stats.bytes -= replaced.data.len() as u64;
            stats.objects -= 1;
        }
    }

    /// Forget `key` (written or deleted: its entry can only miss now).
    pub fn invalidate(&self, key: &ObjectKey) {
        let hash = self.hash(key);
        let mut residents = self.residents.borrow_mut();
        if residents
            .get(&hash)
            .is_some_and(|resident| resident.key == *key)
        {
            let removed = residents.remove(&hash).expect("present");
            let mut stats = self.stats.borrow_mut();
            stats.bytes -= removed.data.len() as u64;
            stats.objects -= 1;
            self.policy.borrow_mut().remove(hash);
        }
    }

    fn drop_evicted(&self, evicted: &mut Vec<u64>) {
        let mut residents = self.residents.borrow_mut();
        let mut stats = self.stats.borrow_mut();
        for hash in evicted.drain(..) {
            if let Some(removed) = residents.remove(&hash) {
                stats.bytes -= removed.data.len() as u64;
                stats.objects -= 1;
            }
        }
    }

    pub fn stats(&self) -> DramStats {
        *self.stats.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("data", name).unwrap()
    }

    #[test]
    fn a_filled_object_is_served_for_its_version_only() {
        let tier = DramTier::new(1 << 20).unwrap();
        let object = key("a");
        assert!(matches!(tier.lookup(&object, 7, 100, true), Lookup::Fill));
        tier.fill(&object, 7, &[5u8; 100], crc32c::crc32c(&[5u8; 100]));
        match tier.lookup(&object, 7, 100, true) {
            Lookup::Hit(data, crc) => {
                assert_eq!(&data[..], &[5u8; 100][..]);
                assert_eq!(crc, crc32c::crc32c(&data));
            }
            _ => panic!("a filled object is a hit"),
        }
        let hits = tier.stats().hits;
        let (data, crc) = tier.hit_if_held(&object, 7, 100, true).expect("held");
        assert_eq!(
            (&data[..], crc),
            (&[5u8; 100][..], crc32c::crc32c(&[5u8; 100]))
        );
        assert_eq!(tier.stats().hits, hits + 1, "a hit is counted");
        let misses = tier.stats().misses;
        assert!(
            tier.hit_if_held(&object, 8, 100, true).is_none(),
            "another version is not held"
        );
        assert!(tier.hit_if_held(&key("b"), 7, 100, true).is_none());
        assert_eq!(
            (tier.stats().hits, tier.stats().misses),
            (hits + 1, misses),
            "what is not held is not counted"
        );
        // Another version on NVMe (a newer write): a miss, refilled.
        assert!(matches!(tier.lookup(&object, 8, 100, true), Lookup::Fill));
        tier.invalidate(&object);
        assert_eq!(tier.stats().objects, 0);
        assert_eq!(tier.stats().bytes, 0);
    }

    #[test]
    fn large_objects_and_partial_reads_are_not_admitted() {
        let tier = DramTier::new(1 << 20).unwrap();
        // 1 MiB / 16 = 64 KiB is the largest object this tier takes.
        assert!(matches!(
            tier.lookup(&key("big"), 1, 65_537, true),
            Lookup::Pass
        ));
        assert!(matches!(
            tier.lookup(&key("part"), 1, 100, false),
            Lookup::Pass
        ));
        assert_eq!(tier.stats().misses, 2);
    }

    #[test]
    fn memory_stays_within_capacity_under_churn() {
        let capacity = 256 * 1024;
        let tier = DramTier::new(capacity).unwrap();
        for round in 0..20_000u64 {
            let object = key(&format!("k{}", round % 997));
            if let Lookup::Fill = tier.lookup(&object, 1, 4096, true) {
                tier.fill(&object, 1, &[1u8; 4096], crc32c::crc32c(&[1u8; 4096]));
            }
            assert!(tier.stats().bytes <= capacity, "round {round}");
        }
        assert!(tier.stats().hits > 0);
    }
}
