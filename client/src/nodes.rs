//! What the blocking client, its pipelines and the async client share: the nodes' connection
//! pools with the retry policy, the encodings of names and GETs, and the bounded fan-out of one
//! call over several nodes or shards.

use std::sync::atomic::AtomicU64;

use hydrant_proto::message::{GetRequestRef, ObjectName, ObjectNameRef};
use hydrant_proto::Limits;

use crate::connection::Connection;
use crate::error::Result;
use crate::pool::NodePool;
use crate::retry::{retrying, RetryPolicy};
use crate::GetItem;

pub(crate) struct Inner {
    pub(crate) addresses: Vec<String>,
    pub(crate) pools: Vec<NodePool>,
    pub(crate) policy: RetryPolicy,
    pub(crate) retries: AtomicU64,
}

impl Inner {
    /// Run `operation` on a connection to node `index`, retried by `policy`.
    pub(crate) fn on_node<T>(
        &self,
        index: usize,
        policy: &RetryPolicy,
        mut operation: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let pool = &self.pools[index];
        retrying(policy, &self.retries, || {
            let mut connection = pool.take()?;
            operation(&mut connection).map_err(|error| error.at(&pool.address))
        })
    }
}

pub(crate) fn object_name(bucket: &str, key: &str) -> ObjectName {
    ObjectName {
        bucket: bucket.to_string(),
        key: key.to_string(),
    }
}

/// A GET of the caller's bucket and key, borrowed (encoded without copying them first;
/// `to_owned` for a batch's items).
pub(crate) fn get_request<'a>(
    bucket: &'a str,
    key: &'a str,
    range: Option<(u64, Option<u64>)>,
) -> GetRequestRef<'a> {
    let (range_start, range_end) = range.unwrap_or((0, None));
    GetRequestRef {
        name: ObjectNameRef { bucket, key },
        range_start,
        range_end,
    }
}

/// Most threads one call uses to reach several nodes or shards at once.
pub(crate) const GROUP_WORKERS_MAX: usize = 16;

/// `work(item)` for every item, on at most `workers_max` scoped threads taking items in turn
/// (on the caller's thread when there is one item); the results in the items' order.
pub(crate) fn run_bounded<T: Sync, R: Send>(
    items: &[T],
    workers_max: usize,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(work).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..workers_max.clamp(1, items.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(index) else {
                            return done;
                        };
                        done.push((index, work(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().expect("a worker does not panic"))
            .collect()
    });
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

/// Split one node's items (positions into `indices`) into batches that fit the negotiated
/// extension size and item count.
pub(crate) fn batch_groups(
    items: &[GetItem],
    indices: &[usize],
    limits: &Limits,
) -> Vec<Vec<usize>> {
    const COUNT_BYTES: usize = 4;
    let mut groups = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = COUNT_BYTES;
    for (position, &index) in indices.iter().enumerate() {
        // str16 bucket, str16 key, u64 start, u64 end.
        let item_bytes = 2 + items[index].bucket.len() + 2 + items[index].key.len() + 16;
        let full = bytes + item_bytes > limits.extension_bytes_max as usize
            || current.len() >= limits.batch_items_max as usize;
        if full && !current.is_empty() {
            groups.push(std::mem::take(&mut current));
            bytes = COUNT_BYTES;
        }
        current.push(position);
        bytes += item_bytes;
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_split_to_fit_the_limits() {
        let items: Vec<GetItem> = (0..100)
            .map(|index| GetItem {
                bucket: "datasets".into(),
                key: format!("{index:0>1000}"),
                range: None,
            })
            .collect();
        let indices: Vec<usize> = (0..100).collect();
        let limits = Limits {
            extension_bytes_max: 64 * 1024,
            batch_items_max: 40,
            ..Limits::default()
        };
        let groups = batch_groups(&items, &indices, &limits);
        // About 1,028 bytes per item: 63 fit in 64 KiB, but at most 40 are allowed.
        assert_eq!(
            groups.iter().map(Vec::len).collect::<Vec<_>>(),
            [40, 40, 20]
        );
        let tight = Limits {
            batch_items_max: 4096,
            ..limits
        };
        let groups = batch_groups(&items, &indices, &tight);
        assert!(groups
            .iter()
            .all(|group| 4 + group.len() * 1028 <= 64 * 1024));
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 100);
    }
}
