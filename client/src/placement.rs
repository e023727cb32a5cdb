//! Placement of keys on nodes by rendezvous hashing: each (node, bucket, key) gets a score and
//! the highest wins, so adding or removing a node moves only the keys that node wins or won.

/// A 64-bit mix of bytes (FNV-1a, then a finaliser), for rendezvous scores.
fn score(node: &str, bucket: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node
        .bytes()
        .chain([0])
        .chain(bucket.bytes())
        .chain([0])
        .chain(key.bytes())
    {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

/// The node (index into `nodes`) that owns (bucket, key): the highest rendezvous score.
pub fn node_for(nodes: &[String], bucket: &str, key: &str) -> usize {
    if nodes.len() == 1 {
        return 0; // the one node wins every key: no scores to compute
    }
    (0..nodes.len())
        .max_by_key(|&index| score(&nodes[index], bucket, key))
        .expect("at least one node")
}

/// The shard of a node that owns (bucket, key) under the server's placement hash 1 (as HELLO
/// tells): CRC32C(bucket ‖ 0x00 ‖ key) mod shards. `None` for a hash this client does not know.
pub(crate) fn shard_for(
    placement_hash: u32,
    shards: u16,
    bucket: &str,
    key: &str,
) -> Option<usize> {
    if placement_hash != 1 || shards == 0 {
        return None;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(bucket.as_bytes()), &[0]);
    let crc = crc32c::crc32c_append(crc, key.as_bytes());
    Some((crc % shards as u32) as usize)
}

/// The PREFETCH requests for `bucket/prefix`, each with the node (index) it goes to. With one
/// node, a single request naming only the prefix: the node lists it itself. With several,
/// `owned[node]` holds the listed keys that node owns, sent at most `PREFETCH_KEYS_MAX` at a
/// time; nodes that own none get nothing.
pub(crate) fn prefetch_requests(
    bucket: &str,
    prefix: &str,
    owned: Vec<Vec<String>>,
) -> Vec<(usize, hydrant_proto::message::PrefetchRequest)> {
    use hydrant_proto::message::{PrefetchRequest, PREFETCH_KEYS_MAX};
    let request = |keys: Vec<String>| PrefetchRequest {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        keys,
    };
    if owned.len() == 1 {
        return vec![(0, request(Vec::new()))];
    }
    owned
        .into_iter()
        .enumerate()
        .flat_map(|(node, keys)| {
            keys.chunks(PREFETCH_KEYS_MAX)
                .map(|batch| (node, request(batch.to_vec())))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetch_requests_name_the_prefix_for_one_node_and_split_keys_for_several() {
        let one = super::prefetch_requests("b", "p/", vec![Vec::new()]);
        assert_eq!(one.len(), 1);
        assert!(one[0].1.keys.is_empty() && one[0].1.prefix == "p/");
        let many: Vec<String> = (0..10_001).map(|index| format!("p/{index}")).collect();
        let split = super::prefetch_requests("b", "p/", vec![Vec::new(), many, vec!["p/x".into()]]);
        let shape: Vec<(usize, usize)> = split
            .iter()
            .map(|(node, request)| (*node, request.keys.len()))
            .collect();
        assert_eq!(shape, [(1, 10_000), (1, 1), (2, 1)]);
    }

    use super::*;

    #[test]
    fn rendezvous_moves_only_the_removed_nodes_keys() {
        let three: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
        let two: Vec<String> = ["a:1", "c:1"].map(String::from).to_vec();
        let mut moved = 0;
        let mut counts = [0usize; 3];
        for index in 0..3000 {
            let key = format!("key-{index}");
            let before = node_for(&three, "b", &key);
            counts[before] += 1;
            let after = &two[node_for(&two, "b", &key)];
            if three[before] != *after {
                moved += 1;
                assert_eq!(three[before], "b:1", "only keys of the removed node move");
            }
        }
        assert_eq!(moved, counts[1]);
        assert!(
            counts.iter().all(|&count| count > 800),
            "spread: {counts:?}"
        );
    }
}
