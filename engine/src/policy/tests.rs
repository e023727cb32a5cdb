//! Properties every policy must have, checked against a model of what the policy reported.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use super::random::Random;
use super::*;

/// Replays `keys` (objects of one unit each) and returns the keys evicted, in order.
fn evictions(policy: &mut dyn EvictionPolicy, keys: &[u64]) -> Vec<u64> {
    let mut evicted = Vec::new();
    for &key in keys {
        policy.access(key, 1, &mut evicted);
    }
    evicted
}

#[test]
fn lru_evicts_the_least_recently_used() {
    let mut lru = Lru::new(Capacity::Objects(3));
    assert_eq!(evictions(&mut lru, &[1, 2, 3, 1, 4, 5]), vec![2, 3]);
    assert!(lru.contains(1) && lru.contains(4) && lru.contains(5));
}

#[test]
fn fifo_evicts_the_oldest_even_when_used() {
    let mut fifo = Fifo::new(Capacity::Objects(3));
    assert_eq!(evictions(&mut fifo, &[1, 2, 3, 1, 4, 5]), vec![1, 2]);
}

#[test]
fn sieve_spares_visited_objects_and_keeps_its_hand() {
    let mut sieve = Sieve::new(Capacity::Objects(3));
    // 1 is visited when 4 arrives: the hand clears it and evicts 2, then rests on 3, which goes
    // next; 1, visited again, survives the hand's next stop at 4.
    assert_eq!(
        evictions(&mut sieve, &[1, 2, 3, 1, 4, 5, 1, 6]),
        vec![2, 3, 4]
    );
    assert!(sieve.contains(1) && sieve.contains(5) && sieve.contains(6));
}

#[test]
fn s3fifo_filters_through_the_small_queue_and_the_ghost() {
    // Ten objects: a small queue of one, a main queue of nine, a ghost of nine.
    let mut s3fifo = S3Fifo::new(Capacity::Objects(10));
    let mut keys: Vec<u64> = (1..=10).collect();
    // 11 evicts 1 (never reused) into the ghost; 1 comes back from the ghost into the main
    // queue, evicting 2; 3 is hit in the small queue, so 12 moves it to the main queue and
    // evicts 4.
    keys.extend([11, 1, 3, 12]);
    assert_eq!(evictions(&mut s3fifo, &keys), vec![1, 2, 4]);
    assert!(s3fifo.contains(1) && s3fifo.contains(3));
}

#[test]
fn hydrant_resists_a_scan() {
    let capacity = 100;
    let mut hydrant = TinyLfuSieve::new(Capacity::Objects(capacity));
    let hot: Vec<u64> = (0..50).collect();
    let mut evicted = Vec::new();
    for _ in 0..10 {
        for &key in &hot {
            hydrant.access(key, 1, &mut evicted);
        }
    }
    for key in 1_000..21_000 {
        hydrant.access(key, 1, &mut evicted);
    }
    let survivors = hot.iter().filter(|&&key| hydrant.contains(key)).count();
    assert!(survivors >= 45, "{survivors} of 50 hot keys survived");
    // LRU keeps none of them.
    let mut lru = Lru::new(Capacity::Objects(capacity));
    for &key in hot.iter().chain(&(1_000..21_000).collect::<Vec<_>>()) {
        lru.access(key, 1, &mut evicted);
    }
    assert!(hot.iter().all(|&key| !lru.contains(key)));
}

#[test]
fn hydrant_rejects_a_newcomer_that_loses_the_duel_without_reporting_it() {
    // 5 objects of 20,000 bytes fill 100,000 bytes; the window's share is 10% (10,000 bytes), so
    // each of them went on to the main queue at once, and a newcomer of 15,000 bytes is its own
    // candidate at once, seen once against victims seen five times.
    let mut hydrant = TinyLfuSieve::new(Capacity::Bytes(100_000));
    let mut evicted = Vec::new();
    for _ in 0..5 {
        for key in 0..5 {
            hydrant.access(key, 20_000, &mut evicted);
        }
    }
    assert!(evicted.is_empty());
    for key in 1_000..1_100 {
        assert_eq!(
            hydrant.access(key, 15_000, &mut evicted),
            Access::MissRejected
        );
        assert!(!hydrant.contains(key));
    }
    assert!(evicted.is_empty(), "evicted {evicted:?}");
    assert_eq!(hydrant.used_bytes(), 100_000);
}

#[test]
fn hydrant_keeps_frequent_objects_through_a_stream_of_one_time_keys() {
    let mut hydrant = TinyLfuSieve::new(Capacity::Objects(100));
    let mut evicted = Vec::new();
    for _ in 0..5 {
        for key in 0..100 {
            hydrant.access(key, 1, &mut evicted);
        }
    }
    for key in 1_000..1_100 {
        hydrant.access(key, 1, &mut evicted);
    }
    // The window (10% of the cache) makes room for the newest keys; every frequent key beyond
    // that room stays, and of the one-time keys no more than the window's share stay, give or
    // take the few whose counts the sketch overestimates.
    let kept = (0..100).filter(|&key| hydrant.contains(key)).count();
    assert!(kept >= 87, "{kept} of 100 frequent keys kept");
    assert!(evicted.iter().filter(|&&key| key < 100).count() <= 13);
    let one_time_kept = (1_000..1_100).filter(|&key| hydrant.contains(key)).count();
    assert!(one_time_kept <= 13, "{one_time_kept} one-time keys kept");
}

#[test]
fn hydrant_grows_its_window_when_recency_pays() {
    // Each key is read twice, the second time up to 80 requests later, and never again: only the
    // window catches second reads (frequency cannot tell these keys apart), and the larger it
    // is, the more it catches.
    let capacity = 200;
    let mut hydrant = TinyLfuSieve::new(Capacity::Objects(capacity));
    let initial = hydrant.window_target();
    let mut random = Random::new(3);
    let mut evicted = Vec::new();
    let mut pending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let (mut hits, mut requests) = (0u64, 0u64);
    for key in 0..200_000u64 {
        pending.push(Reverse((requests + 1 + random.next_u64() % 80, key)));
        hits += u64::from(hydrant.access(key, 1, &mut evicted).is_hit());
        requests += 1;
        while pending
            .peek()
            .is_some_and(|&Reverse((due, _))| due <= requests)
        {
            let Reverse((_, again)) = pending.pop().expect("a pending read");
            hits += u64::from(hydrant.access(again, 1, &mut evicted).is_hit());
            requests += 1;
        }
    }
    assert!(
        hydrant.window_target() >= 50,
        "window {} (started at {initial})",
        hydrant.window_target()
    );
    assert!(
        hits * 100 / requests >= 45,
        "hit ratio {}%",
        hits * 100 / requests
    );
}

#[test]
fn hydrant_keeps_part_of_a_loop_larger_than_the_cache() {
    // LRU and FIFO hit nothing on a loop one and a half times their size; the best any cache
    // can do is 66% (Belady's).
    let mut hydrant = TinyLfuSieve::new(Capacity::Objects(100));
    let mut evicted = Vec::new();
    let mut hits = 0;
    let requests = 150 * 1000;
    for request in 0..requests {
        hits += u64::from(hydrant.access(request % 150, 1, &mut evicted).is_hit());
    }
    assert!(
        hits * 100 / requests >= 40,
        "hit ratio {}%",
        hits * 100 / requests
    );
}

#[test]
fn an_object_larger_than_the_cache_is_a_miss_and_never_admitted() {
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(Capacity::Bytes(1000));
        let mut evicted = Vec::new();
        policy.access(1, 50, &mut evicted);
        assert_eq!(
            policy.access(2, 1001, &mut evicted),
            Access::MissRejected,
            "{kind}"
        );
        assert_eq!(
            policy.access(2, 1001, &mut evicted),
            Access::MissRejected,
            "{kind}"
        );
        assert!(!policy.contains(2), "{kind}");
        assert!(
            policy.contains(1),
            "{kind}: nothing evicted for a rejected object"
        );
        assert!(evicted.is_empty(), "{kind}");
        assert_eq!(policy.used_bytes(), 50, "{kind}");
    }
}

#[test]
fn objects_that_fit_exactly_are_admitted_by_the_policies_without_admission_filter() {
    for kind in [PolicyKind::Lru, PolicyKind::Fifo, PolicyKind::Sieve] {
        let mut policy = kind.build(Capacity::Bytes(1000));
        let mut evicted = Vec::new();
        policy.access(1, 400, &mut evicted);
        assert_eq!(
            policy.access(2, 1000, &mut evicted),
            Access::MissAdmitted,
            "{kind}"
        );
        assert_eq!(evicted, vec![1], "{kind}");
        assert_eq!(policy.used_bytes(), 1000, "{kind}");
    }
}

#[test]
fn removal_forgets_the_key_and_its_bytes() {
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(Capacity::Bytes(1000));
        let mut evicted = Vec::new();
        policy.access(1, 30, &mut evicted);
        policy.access(2, 50, &mut evicted);
        assert!(policy.remove(1), "{kind}");
        assert!(!policy.remove(1), "{kind}");
        assert!(!policy.contains(1), "{kind}");
        assert_eq!(policy.len(), 1, "{kind}");
        assert_eq!(policy.used_bytes(), 50, "{kind}");
        assert_eq!(
            policy.access(1, 30, &mut evicted),
            Access::MissAdmitted,
            "{kind}"
        );
    }
}

#[test]
fn pinned_objects_are_never_evicted_and_unpinned_ones_can_be() {
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(Capacity::Objects(10));
        let mut evicted = Vec::new();
        for key in 0..4 {
            assert_eq!(
                policy.insert(key, 1, true, &mut evicted),
                Access::MissAdmitted,
                "{kind}"
            );
        }
        for round in 0..20 {
            for key in 100..150 {
                policy.access(key + round, 1, &mut evicted);
            }
        }
        assert!(evicted.iter().all(|&key| key >= 100), "{kind}");
        assert!((0..4).all(|key| policy.contains(key)), "{kind}");
        assert!(policy.len() <= 10, "{kind}");
        for key in 0..4 {
            assert!(policy.set_pinned(key, false), "{kind}");
        }
        // A new working set of eight read over and over (so that hydrant's filter finds it worth
        // admitting once the old one's counts have aged) leaves room for two of the four.
        for _ in 0..100 {
            for key in 1_000..1_008 {
                policy.access(key, 1, &mut evicted);
            }
        }
        let unpinned_evicted = (0..4).filter(|&key| !policy.contains(key)).count();
        assert!(unpinned_evicted >= 2, "{kind}: {unpinned_evicted} evicted");
    }
}

#[test]
fn a_cache_full_of_pinned_objects_rejects_newcomers() {
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(Capacity::Bytes(100));
        let mut evicted = Vec::new();
        policy.insert(1, 60, true, &mut evicted);
        policy.access(2, 30, &mut evicted);
        // 50 bytes fit only if 2 goes: allowed. 50 more cannot fit beside 60 pinned.
        assert_eq!(
            policy.insert(3, 41, true, &mut evicted),
            Access::MissRejected,
            "{kind}"
        );
        assert!(policy.contains(1), "{kind}");
        assert!(
            evicted.is_empty(),
            "{kind}: no victim for an object that cannot fit"
        );
        assert!(policy.set_pinned(1, false), "{kind}");
        assert!(!policy.set_pinned(99, true), "{kind}");
    }
}

/// Drives a policy with random reads, writes, pins, unpins and removals of keys with fixed sizes,
/// keeps the resident set from what it reported, and checks it against the policy after every
/// step: reports are complete, capacity holds, pinned keys stay.
fn check_against_model(kind: PolicyKind, capacity: Capacity, seed: u64) {
    let mut policy = kind.build(capacity);
    let mut random = Random::new(seed);
    let universe = 400;
    let size_of = |key: u64| 1 + (key * 2_654_435_761) % 200;
    let mut resident: HashSet<u64> = HashSet::new();
    let mut pinned: HashSet<u64> = HashSet::new();
    let mut evicted = Vec::new();
    let mut hits = 0u64;
    for step in 0..40_000u64 {
        let key = random.next_u64() % universe;
        let choice = random.next_u64() % 100;
        evicted.clear();
        let access = match choice {
            0..=84 => Some(policy.access(key, size_of(key), &mut evicted)),
            85..=89 => Some(policy.insert(key, size_of(key), choice == 85, &mut evicted)),
            90..=94 => {
                let pin = choice < 92;
                assert_eq!(policy.set_pinned(key, pin), resident.contains(&key));
                if resident.contains(&key) {
                    if pin {
                        pinned.insert(key);
                    } else {
                        pinned.remove(&key);
                    }
                }
                None
            }
            _ => {
                assert_eq!(policy.remove(key), resident.remove(&key));
                pinned.remove(&key);
                None
            }
        };
        for gone in &evicted {
            assert!(
                resident.remove(gone),
                "{kind}: evicted {gone}, never resident"
            );
            assert!(!pinned.contains(gone), "{kind}: evicted pinned {gone}");
        }
        match access {
            Some(Access::Hit) => {
                hits += 1;
                assert!(resident.contains(&key), "{kind}: hit on absent {key}");
                if choice == 85 {
                    pinned.insert(key);
                }
            }
            Some(Access::MissAdmitted) => {
                assert!(resident.insert(key), "{kind}: admitted resident {key}");
                if choice == 85 {
                    pinned.insert(key);
                }
            }
            Some(Access::MissRejected) => assert!(!resident.contains(&key)),
            None => {}
        }
        if step % 97 == 0 || step < 500 {
            for probe in 0..universe {
                assert_eq!(
                    policy.contains(probe),
                    resident.contains(&probe),
                    "{kind} {probe}"
                );
            }
        }
        let bytes: u64 = resident.iter().map(|&key| size_of(key)).sum();
        assert_eq!(policy.used_bytes(), bytes, "{kind}");
        assert_eq!(policy.len(), resident.len(), "{kind}");
        let used = match capacity {
            Capacity::Bytes(_) => bytes,
            Capacity::Objects(_) => resident.len() as u64,
        };
        assert!(used <= capacity.units(), "{kind}: {used} over {capacity:?}");
    }
    assert!(hits > 0, "{kind}: no hit at all");
}

#[test]
fn every_policy_reports_every_eviction_and_respects_capacity_and_pins() {
    for kind in PolicyKind::ALL {
        check_against_model(kind, Capacity::Bytes(5_000), 1);
        check_against_model(kind, Capacity::Objects(50), 2);
    }
}

#[test]
fn policy_names_round_trip() {
    for kind in PolicyKind::ALL {
        assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
        assert_eq!(kind.build(Capacity::Objects(1)).name(), kind.name());
    }
    assert!("arc".parse::<PolicyKind>().is_err());
}
