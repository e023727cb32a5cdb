//! Listing: a bucket's objects merged across shards (and with its origin's listing), and the
//! staged objects of unfinished uploads.

use std::future::Future;

use crate::store::{ObjectKey, ObjectMeta};
use crate::Result;

use super::{EngineHandle, LIST_LIMIT_MAX};

impl EngineHandle {
    /// Up to `limit` (at most LIST_LIMIT_MAX) staged objects (see `ObjectKey::staged`) whose
    /// keys start with `prefix`, in key order, after `start_after`.
    pub fn list_staged(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ObjectMeta>>> + Send + 'static {
        let limit = limit.min(LIST_LIMIT_MAX);
        let keys = ObjectKey::staged_prefix(prefix).and_then(|prefix| {
            let after = start_after.map(ObjectKey::staged).transpose()?;
            Ok((prefix, after))
        });
        let calls = keys.map(|(prefix, after)| {
            (0..self.inboxes.len())
                .map(|shard| {
                    let prefix = prefix.clone();
                    let after = after.clone();
                    self.on_shard(shard, move |cache| async move {
                        Ok(cache.store().list(&prefix, after.as_ref(), limit))
                    })
                })
                .collect::<Vec<_>>()
        });
        async move {
            let mut merged: Vec<ObjectMeta> = Vec::new();
            for call in calls? {
                merged.extend(call.await?);
            }
            merged.sort_by(|left, right| left.key.cmp(&right.key));
            merged.truncate(limit);
            Ok(merged)
        }
    }

    /// Up to `limit` (at most LIST_LIMIT_MAX) objects of `bucket` whose keys start with
    /// `prefix`, in key order, after `start_after` (for paging). For a bucket with an origin:
    /// the origin's listing plus the objects written here and not uploaded yet.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ObjectMeta>>> + Send + 'static {
        let limit = limit.min(LIST_LIMIT_MAX);
        let route = match &self.origins {
            Some(origins) => origins
                .route(bucket)
                .map(|route| route.map(|r| (origins.clone(), r))),
            None => Ok(None),
        };
        let keys = ObjectKey::prefix(bucket, prefix).and_then(|prefix_key| {
            let after = start_after
                .map(|after| ObjectKey::new(bucket, after))
                .transpose()?;
            Ok((prefix_key, after))
        });
        let with_origin = matches!(route, Ok(Some(_)));
        let calls = keys.map(|(prefix_key, after)| {
            (0..self.inboxes.len())
                .map(|shard| {
                    let prefix_key = prefix_key.clone();
                    let after = after.clone();
                    self.on_shard(shard, move |cache| async move {
                        Ok(if with_origin {
                            // What is not at the origin yet, and the clean copies here (which
                            // say of an object what the origin's listing may not: the MD5
                            // tag and the time it was written through this node).
                            let dirty = cache.dirty_listing(&prefix_key, after.as_ref(), limit);
                            let mut clean = cache.store().list(&prefix_key, after.as_ref(), limit);
                            clean.retain(|meta| !meta.dirty);
                            (dirty, clean)
                        } else {
                            (
                                cache.store().list(&prefix_key, after.as_ref(), limit),
                                Vec::new(),
                            )
                        })
                    })
                })
                .collect::<Vec<_>>()
        });
        let origin_list = route.map(|route| {
            route.map(|(origins, route)| {
                let task = crate::origin::remote::list(
                    origins.clone(),
                    route,
                    prefix.to_string(),
                    start_after.map(str::to_string),
                    limit,
                );
                origins.run(task)
            })
        });
        let bucket = bucket.to_string();
        async move {
            let mut merged: Vec<ObjectMeta> = Vec::new();
            let mut clean: std::collections::HashMap<String, ObjectMeta> = Default::default();
            for call in calls? {
                let (listed, copies) = call.await?;
                merged.extend(listed);
                clean.extend(copies.into_iter().map(|meta| (meta.key.clone(), meta)));
            }
            if let Some(listing) = origin_list? {
                let local: std::collections::HashSet<String> =
                    merged.iter().map(|meta| meta.key.clone()).collect();
                for (key, version) in listing.await? {
                    if local.contains(&key) {
                        continue;
                    }
                    // The origin lists it: a clean copy of its size here is what HEAD and GET
                    // answer, so LIST answers it too.
                    match clean.remove(&key) {
                        Some(copy) if copy.bytes == version.bytes => merged.push(copy),
                        _ => merged.push(ObjectMeta {
                            bucket: bucket.clone(),
                            key,
                            bytes: version.bytes,
                            seq: 0,
                            dirty: false,
                            stamp: version.stamp(),
                        }),
                    }
                }
            }
            merged.sort_by(|left, right| left.key.cmp(&right.key));
            merged.truncate(limit);
            Ok(merged)
        }
    }
}
