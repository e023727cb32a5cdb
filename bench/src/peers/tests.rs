//! What each peer must do on small, known sequences, and what every peer must keep to on random
//! ones.

use super::*;

fn hits(peer: &mut dyn Peer, keys: &[u64]) -> Vec<bool> {
    keys.iter().map(|&key| peer.access(key, 1)).collect()
}

#[test]
fn arc_promotes_a_second_access_and_learns_from_its_ghosts() {
    let mut arc = PeerKind::Arc.build(4);
    // 1 and 2 are seen twice (T2); 3, 4 and 5 once: 5 pushes 3 out of T1 into B1.
    let first = hits(arc.as_mut(), &[1, 2, 1, 2, 3, 4, 5]);
    assert_eq!(first, [false, false, true, true, false, false, false]);
    // 3 comes back from B1: a miss that goes straight to T2, and the frequent keys stay.
    assert_eq!(hits(arc.as_mut(), &[3, 1, 2]), [false, true, true]);
}

#[test]
fn two_q_sends_keys_seen_again_after_a1in_to_am() {
    // 8 units: A1in's share is 2, A1out remembers 4, Am holds at most 6.
    let mut two_q = PeerKind::TwoQ.build(8);
    // A1in takes what Am leaves free: the ten keys after 1 and 2 push them into A1out, and 1
    // comes back from there into Am.
    let mut keys = vec![1, 2];
    keys.extend(10..20);
    keys.push(1);
    assert!(hits(two_q.as_mut(), &keys).iter().all(|hit| !hit));
    // A second scan does not push 1 out of Am.
    let scan: Vec<u64> = (100..140).collect();
    hits(two_q.as_mut(), &scan);
    assert!(
        two_q.access(1, 1),
        "a key in Am survives a scan through A1in"
    );
}

/// Hot keys seen often, then a long scan of keys seen once: a scan-resistant policy keeps most
/// of the hot keys.
fn hot_keys_surviving_a_scan(kind: PeerKind) -> usize {
    let mut peer = kind.build(100);
    for _ in 0..10 {
        for key in 0..50 {
            peer.access(key, 1);
        }
    }
    for key in 1_000..21_000 {
        peer.access(key, 1);
    }
    (0..50).filter(|&key| peer.access(key, 1)).count()
}

/// 2Q is left out: with its Am list empty, A1in takes the whole cache, hot keys hit there never
/// reach Am, and the scan pushes them out (libCacheSim's 2Q behaves the same).
#[test]
fn lirs_arc_and_wtinylfu_resist_a_scan() {
    for kind in [PeerKind::Arc, PeerKind::Lirs, PeerKind::WTinyLfu] {
        let survivors = hot_keys_surviving_a_scan(kind);
        assert!(
            survivors >= 45,
            "{}: {survivors} of 50 hot keys",
            kind.name()
        );
    }
}

#[test]
fn every_peer_keeps_within_its_capacity_and_hits_only_keys_it_saw() {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for kind in PeerKind::ALL {
        for capacity in [1u64, 7, 1_000, 65_536] {
            let mut peer = kind.build(capacity);
            let mut seen = std::collections::HashSet::new();
            for _ in 0..20_000 {
                // Skewed keys and sizes from one unit to past the whole capacity.
                let key = next() % 64 * (next() % 16);
                let charge = 1 + next() % (capacity + capacity / 4 + 1);
                let hit = peer.access(key, charge);
                assert!(
                    !hit || seen.contains(&key),
                    "{}: hit on a new key",
                    kind.name()
                );
                seen.insert(key);
                assert!(
                    peer.resident_units() <= capacity,
                    "{} at {capacity}: {} units resident",
                    kind.name(),
                    peer.resident_units()
                );
            }
        }
    }
}

#[test]
fn names_parse_to_peers_and_engine_policies() {
    assert_eq!("2q".parse::<Replayed>(), Ok(Replayed::Peer(PeerKind::TwoQ)));
    assert_eq!(
        "WTinyLFU".parse::<Replayed>(),
        Ok(Replayed::Peer(PeerKind::WTinyLfu))
    );
    assert_eq!(
        "sieve".parse::<Replayed>(),
        Ok(Replayed::Engine(PolicyKind::Sieve))
    );
    assert!("clock".parse::<Replayed>().is_err());
}
