//! Work that waits on or warms from the origin, across every shard: FLUSH, the refused
//! uploads, prefetch and the loader's read plans.

use std::future::Future;

use crate::origin::FailedUpload;
use crate::store::ObjectKey;
use crate::{Error, ErrorKind, Result};

use super::{EngineHandle, LIST_LIMIT_MAX};

/// Most objects one prefetch of a prefix reads.
const PREFETCH_KEYS_MAX: usize = 1_000_000;
/// How often FLUSH counts the objects still dirty when no upload finishes.
const FLUSH_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// Refused writes a FLUSH names in its error.
const FLUSH_REFUSED_NAMED_MAX: usize = 5;

/// FLUSH's answer when writes under its prefix were refused by the origin.
fn refused_error(refused: &[FailedUpload], count: usize) -> Error {
    let named: Vec<String> = refused
        .iter()
        .take(FLUSH_REFUSED_NAMED_MAX)
        .map(|failed| format!("{}/{} ({})", failed.bucket, failed.key, failed.reason))
        .collect();
    let more = count.saturating_sub(named.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Error::new(
        ErrorKind::OriginRefused,
        format!(
            "{count} writes were refused by the origin and stay on NVMe: {}{more}; retry them with `hydrant uploads --retry` once the origin can take them, or delete them",
            named.join("; ")
        ),
    )
}

impl EngineHandle {
    /// Wait until every object of `bucket` under `prefix` written here is at its origin (all
    /// buckets with `None`), at most `timeout`.
    pub fn flush(
        &self,
        bucket: Option<&str>,
        prefix: &str,
        timeout: std::time::Duration,
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        let prefixes = match bucket {
            Some(bucket) => ObjectKey::prefix(bucket, prefix).map(|key| vec![key]),
            None => Ok(Vec::new()),
        };
        let handle = self.clone();
        async move {
            let prefixes = prefixes?;
            let deadline = std::time::Instant::now() + timeout;
            loop {
                let mut pending = 0;
                let mut refused = Vec::new();
                let mut refused_count = 0;
                for shard in 0..handle.inboxes.len() {
                    let prefixes = prefixes.clone();
                    let (waiting, listed, count) = handle
                        .on_shard(shard, move |cache| async move {
                            let prefix = prefixes.first();
                            let (listed, count) =
                                cache.refused_uploads(prefix, FLUSH_REFUSED_NAMED_MAX);
                            let waiting = match prefix {
                                None => cache.pending_count(),
                                Some(prefix) => cache.pending_under(prefix),
                            };
                            Ok((waiting, listed, count))
                        })
                        .await?;
                    pending += waiting;
                    refused.extend(listed);
                    refused_count += count;
                }
                if pending == 0 && refused_count == 0 {
                    return Ok(());
                }
                if pending == 0 {
                    return Err(refused_error(&refused, refused_count));
                }
                if std::time::Instant::now() >= deadline {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("{pending} objects are still on their way to the origin"),
                    ));
                }
                // A short wait (on shard 0's timers, so that any caller can await it), then
                // count again.
                handle
                    .on_shard(0, |_| async move {
                        crate::rt::time::sleep(FLUSH_POLL_INTERVAL).await;
                        Ok(())
                    })
                    .await?;
            }
        }
    }

    /// Writes the origin refused for good under `bucket`/`prefix` (every bucket when `None`):
    /// at most `limit` of them, and how many there are. With `retry`, they are queued for
    /// upload again first (and listed as they were).
    pub fn refused_uploads(
        &self,
        bucket: Option<&str>,
        prefix: &str,
        retry: bool,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<FailedUpload>, usize)>> + Send + 'static {
        let prefix = bucket
            .map(|bucket| ObjectKey::prefix(bucket, prefix))
            .transpose();
        let handle = self.clone();
        async move {
            let prefix = prefix?;
            let mut listed = Vec::new();
            let mut count = 0;
            for shard in 0..handle.inboxes.len() {
                let prefix = prefix.clone();
                let (shard_listed, shard_count) = handle
                    .on_shard(shard, move |cache| async move {
                        let found = cache.refused_uploads(prefix.as_ref(), limit);
                        if retry {
                            cache.retry_refused(prefix.as_ref());
                        }
                        Ok(found)
                    })
                    .await?;
                listed.extend(shard_listed);
                count += shard_count;
            }
            listed.sort_by(|a, b| (&a.bucket, &a.key).cmp(&(&b.bucket, &b.key)));
            listed.truncate(limit);
            Ok((listed, count))
        }
    }

    /// Read every object of `bucket` under `prefix` (or the listed `keys`) through from the
    /// origin into the cache, `parallel` at a time; returns (objects, bytes) warmed.
    pub fn prefetch(
        &self,
        bucket: &str,
        prefix: &str,
        keys: Vec<String>,
        parallel: usize,
    ) -> impl Future<Output = Result<(u64, u64)>> + Send + 'static {
        let handle = self.clone();
        let bucket = bucket.to_string();
        let prefix = prefix.to_string();
        async move {
            let mut keys = keys;
            if keys.is_empty() {
                let mut after: Option<String> = None;
                loop {
                    let page = handle
                        .list(&bucket, &prefix, after.as_deref(), LIST_LIMIT_MAX)
                        .await?;
                    let done = page.len() < LIST_LIMIT_MAX;
                    after = page.last().map(|meta| meta.key.clone());
                    keys.extend(page.into_iter().map(|meta| meta.key));
                    if done {
                        break;
                    }
                    if keys.len() > PREFETCH_KEYS_MAX {
                        return Err(Error::new(
                            ErrorKind::TooLarge,
                            format!("prefetch is limited to {PREFETCH_KEYS_MAX} objects; use narrower prefixes"),
                        ));
                    }
                }
            }
            let mut objects = 0;
            let mut bytes = 0;
            for batch in keys.chunks(parallel.max(1)) {
                let warms: Vec<_> = batch
                    .iter()
                    .map(|key| {
                        let key = ObjectKey::new(&bucket, key)?;
                        let shard = handle.shard_of(&key);
                        Ok(handle
                            .on_shard(shard, move |cache| async move { cache.warm(&key).await }))
                    })
                    .collect::<Result<_>>()?;
                for warmed in futures::future::join_all(warms).await {
                    if let Some(size) = warmed? {
                        objects += 1;
                        bytes += size;
                    }
                }
            }
            Ok((objects, bytes))
        }
    }

    /// Follow a plan named `id`: `keys` of `bucket` will be read in this order, so each shard
    /// reads its own of them ahead from the origin, at most its share of `window_bytes` beyond
    /// the readers, until none of them is asked for during `idle` (see `Cache::plan`). A plan
    /// of the same id is replaced; no keys end it. Returns how many keys are planned.
    pub fn plan(
        &self,
        bucket: &str,
        id: u64,
        keys: Vec<String>,
        window_bytes: u64,
        idle: std::time::Duration,
    ) -> impl Future<Output = Result<u64>> + Send + 'static {
        let handle = self.clone();
        let bucket = bucket.to_string();
        async move {
            let shards = handle.inboxes.len();
            let mut shares: Vec<Vec<ObjectKey>> = vec![Vec::new(); shards];
            for key in &keys {
                let key = ObjectKey::new(&bucket, key)?;
                shares[handle.shard_of(&key)].push(key);
            }
            let window_bytes = (window_bytes / shards as u64).max(handle.chunk_bytes());
            let calls: Vec<_> = shares
                .into_iter()
                .enumerate()
                .map(|(shard, share)| {
                    handle.on_shard(shard, move |cache| async move {
                        Ok(cache.plan(id, share, window_bytes, idle) as u64)
                    })
                })
                .collect();
            let mut planned = 0;
            for call in calls {
                planned += call.await?;
            }
            Ok(planned)
        }
    }
}
