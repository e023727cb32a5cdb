//! The blocking client: `SharedClient` (cloneable, used from many threads at once, a pool of
//! connections per node) and `Client`, the same behind `&mut self` for code written before the
//! pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hydrant_proto::message::{
    BatchGetRequest, FlushRequest, ListEntries, ListEntry, ListRequest, Message, ObjectInfo,
    PlanKeys, PlanRequest, PlanResult, PrefetchResult, PutRequest, RefusedUpload, UploadsAnswer,
    UploadsRequest, LIST_ENTRIES_MAX, PLAN_KEYS_MAX,
};
use hydrant_proto::Opcode;

use crate::config::ClientConfig;
use crate::connection::{Connection, Destination};
use crate::error::{ClientError, Result};
use crate::frames::{reborrow, Frame, Progress};
use crate::nodes::{batch_groups, get_request, object_name, run_bounded, Inner, GROUP_WORKERS_MAX};
use crate::pipeline::Pipeline;
use crate::placement::node_for;
use crate::pool::NodePool;
use crate::retry::{retrying, RetryPolicy};
use crate::{GetItem, ItemResult};

/// A blocking client of one or several hydrant servers that threads share: clones are cheap
/// and use the same connections, at most `max_connections_per_node` to each node.
#[derive(Clone)]
pub struct SharedClient {
    inner: Arc<Inner>,
}

/// A writer that counts what went through it.
struct Counted<'a> {
    inner: &'a mut dyn std::io::Write,
    written: u64,
}

impl std::io::Write for Counted<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.written += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl SharedClient {
    /// Connect (and say HELLO) to every server of `config`: one connection each now, more as
    /// threads need them.
    pub fn connect(config: ClientConfig) -> Result<SharedClient> {
        if config.servers.is_empty() {
            return Err(ClientError::Usage("no server given".into()));
        }
        let pools: Vec<NodePool> = config
            .servers
            .iter()
            .map(|address| {
                let pool = NodePool::new(
                    address,
                    config.token.as_deref(),
                    config.connect_timeout,
                    config.request_timeout,
                    config.max_connections_per_node,
                );
                if config.shard_aware {
                    pool
                } else {
                    pool.without_shard_ports()
                }
            })
            .collect();
        for pool in &pools {
            pool.warm()?;
        }
        Ok(SharedClient {
            inner: Arc::new(Inner {
                addresses: config.servers.clone(),
                pools,
                policy: RetryPolicy::new(&config),
                retries: AtomicU64::new(0),
            }),
        })
    }

    /// The servers, in the order given (indices of `node_for`).
    pub fn servers(&self) -> &[String] {
        &self.inner.addresses
    }

    /// Retries this client (and its clones) made so far.
    pub fn retries_total(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    fn owner(&self, bucket: &str, key: &str) -> usize {
        node_for(&self.inner.addresses, bucket, key)
    }

    /// Run `operation` on a connection to the node that owns (bucket, key), with retries: on
    /// the owning shard's own port when the node offers the shard-aware path (the request then
    /// skips the hop between the server's cores), else on any connection to the node; a shard
    /// port that cannot be reached falls back to the node's.
    fn on_owner<T>(
        &self,
        bucket: &str,
        key: &str,
        operation: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let index = self.owner(bucket, key);
        let shard = self.inner.pools[index]
            .shard_pools()
            .and_then(|shards| shards.shard_for(bucket, key));
        self.on_node_shard(index, shard, operation)
    }

    /// Run `operation` on a connection to node `index`, with retries: on shard `shard`'s own
    /// port when given and the node offers the shard-aware path, else (or when every connection
    /// to the shard is busy, or its port is unreachable) on the node's.
    fn on_node_shard<T>(
        &self,
        index: usize,
        shard: Option<usize>,
        mut operation: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let node = &self.inner.pools[index];
        retrying(&self.inner.policy, &self.inner.retries, || {
            let shards = node.shard_pools();
            let mut connection = node.take_for_shard(
                shards
                    .as_ref()
                    .zip(shard)
                    .and_then(|(shards, shard)| shards.pool(shard)),
            )?;
            let address = connection.pool_address().to_string();
            let result = operation(&mut connection);
            if result.is_err() && connection.broken {
                node.forget_shards();
            }
            result.map_err(|error| error.at(&address))
        })
    }

    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        self.put_with(bucket, key, data, None)
    }

    /// `put`, reporting the bytes sent to `progress` (from 0 again if the put is retried).
    pub fn put_with_progress(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        progress: Progress<'_>,
    ) -> Result<ObjectInfo> {
        self.put_with(bucket, key, data, Some(progress))
    }

    fn put_with(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        mut progress: Option<Progress<'_>>,
    ) -> Result<ObjectInfo> {
        let extension = PutRequest {
            name: object_name(bucket, key),
            object_bytes: data.len() as u64,
        }
        .encode();
        let answer = self.on_owner(bucket, key, |connection| {
            connection.call_with_progress(Opcode::Put, &extension, data, reborrow(&mut progress))
        })?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    /// Store the concatenation of `parts` as `bucket/key`, sent from where each part lies (no
    /// joined copy), retried as `put` is: each attempt reads the parts from the start.
    pub fn put_parts(&self, bucket: &str, key: &str, parts: &[&[u8]]) -> Result<ObjectInfo> {
        let object_bytes = parts.iter().map(|part| part.len() as u64).sum();
        let extension = PutRequest {
            name: object_name(bucket, key),
            object_bytes,
        }
        .encode();
        let answer = self.on_owner(bucket, key, |connection| {
            connection.put_from(&extension, object_bytes, &mut Gather::new(parts), None)
        })?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    /// Store `object_bytes` read from `source` as `bucket/key`, streamed a frame at a time so
    /// that the object is never whole in memory (a file of any size). Not retried: the source
    /// cannot be read again (a `Local` error when it fails or ends early).
    pub fn put_from(
        &self,
        bucket: &str,
        key: &str,
        source: &mut dyn std::io::Read,
        object_bytes: u64,
        mut progress: Option<Progress<'_>>,
    ) -> Result<ObjectInfo> {
        let extension = PutRequest {
            name: object_name(bucket, key),
            object_bytes,
        }
        .encode();
        let index = self.owner(bucket, key);
        let answer = self
            .inner
            .on_node(index, &RetryPolicy::never(), |connection| {
                connection.put_from(&extension, object_bytes, source, reborrow(&mut progress))
            })?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    /// The object (or a range, as `get`), written to `destination` frame by frame as it
    /// arrives (each checked first), never whole in memory. Retried only until its first byte
    /// is written (then a failure is a `Local` error: what was written is not the object).
    pub fn get_to(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        destination: &mut dyn std::io::Write,
        mut progress: Option<Progress<'_>>,
    ) -> Result<ObjectInfo> {
        let request = get_request(bucket, key, range);
        let extension = request.encode();
        let mut counted = Counted {
            inner: destination,
            written: 0,
        };
        let (info, _) = self.on_owner(bucket, key, |connection| {
            if counted.written > 0 {
                return Err(ClientError::Local(std::io::Error::other(format!(
                    "the read of {bucket}/{key} broke off after {} bytes were written; not retried",
                    counted.written
                ))));
            }
            connection.get(
                &extension,
                request.range_end,
                Destination::Write(&mut counted),
                reborrow(&mut progress),
            )
        })?;
        Ok(info)
    }

    /// The object (or bytes `start..end` of it, `end` exclusive; `None`: to the end).
    pub fn get(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        self.get_with(bucket, key, range, None)
    }

    /// `get`, reporting the bytes received to `progress`.
    pub fn get_with_progress(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        progress: Progress<'_>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        self.get_with(bucket, key, range, Some(progress))
    }

    fn get_with(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        mut progress: Option<Progress<'_>>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        let request = get_request(bucket, key, range);
        let extension = request.encode();
        let mut data = Vec::new();
        let (info, _) = self.on_owner(bucket, key, |connection| {
            connection.get(
                &extension,
                request.range_end,
                Destination::Grow(&mut data),
                reborrow(&mut progress),
            )
        })?;
        Ok((info, data))
    }

    /// The object (or a range of it, as `get`) read into `buffer`; returns its info and the
    /// bytes read, at the start of `buffer`. A buffer smaller than the answer gets
    /// `BufferTooSmall` from the answer's header, before the bytes are read.
    pub fn get_into(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        buffer: &mut [u8],
    ) -> Result<(ObjectInfo, usize)> {
        let request = get_request(bucket, key, range);
        let extension = request.encode();
        self.on_owner(bucket, key, |connection| {
            connection.get(
                &extension,
                request.range_end,
                Destination::Fixed(&mut *buffer),
                None,
            )
        })
    }

    /// Many gets in one request per node: each item's result, in the order asked. With
    /// `in_order` the servers answer in request order; otherwise as items complete. A request
    /// that fails as a whole is retried; items that fail on their own are returned as they are.
    pub fn batch_get(&self, items: &[GetItem], in_order: bool) -> Result<Vec<ItemResult>> {
        let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); self.inner.pools.len()];
        for (index, item) in items.iter().enumerate() {
            per_node[self.owner(&item.bucket, &item.key)].push(index);
        }
        let mut results: Vec<Option<ItemResult>> = (0..items.len()).map(|_| None).collect();
        // Each node's items by the shard that owns them (one batch per shard's port when the
        // node offers the shard-aware path, so that no item crosses the server's cores).
        let mut per_shard: Vec<(usize, Option<usize>, Vec<usize>)> = Vec::new();
        for (node, indices) in per_node.into_iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let Some(shards) = self.inner.pools[node].shard_pools() else {
                per_shard.push((node, None, indices));
                continue;
            };
            let mut groups: std::collections::BTreeMap<Option<usize>, Vec<usize>> =
                std::collections::BTreeMap::new();
            for index in indices {
                let shard = shards.shard_for(&items[index].bucket, &items[index].key);
                groups.entry(shard).or_default().push(index);
            }
            per_shard.extend(
                groups
                    .into_iter()
                    .map(|(shard, indices)| (node, shard, indices)),
            );
        }
        // The negotiated limits, once per node.
        let mut limits = vec![None; self.inner.pools.len()];
        for &(node, _, _) in &per_shard {
            if limits[node].is_none() {
                limits[node] = Some(self.inner.on_node(
                    node,
                    &self.inner.policy,
                    |connection| Ok(connection.limits),
                )?);
            }
        }
        // The groups at once (a few threads at most), each group's batches one after another.
        let outcomes = run_bounded(&per_shard, GROUP_WORKERS_MAX, |(node, shard, indices)| {
            let limits = limits[*node].expect("read above");
            let mut answered = Vec::with_capacity(indices.len());
            for group in batch_groups(items, indices, &limits) {
                let request = BatchGetRequest {
                    items: group
                        .iter()
                        .map(|&position| {
                            let item = &items[indices[position]];
                            get_request(&item.bucket, &item.key, item.range).to_owned()
                        })
                        .collect(),
                };
                let answers = self.on_node_shard(*node, *shard, |connection| {
                    connection.batch(&request, in_order)
                })?;
                for (position, answer) in group.into_iter().zip(answers) {
                    answered.push((indices[position], answer));
                }
            }
            Ok::<_, ClientError>(answered)
        });
        for outcome in outcomes {
            for (index, answer) in outcome? {
                results[index] = Some(answer);
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every item was sent to a node"))
            .collect())
    }

    /// Many GET, PUT and HEAD requests sent together on one connection per node, answered in
    /// any order; see [`Pipeline`].
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline::new(&self.inner)
    }

    pub fn head(&self, bucket: &str, key: &str) -> Result<ObjectInfo> {
        let extension = object_name(bucket, key).encode();
        let answer = self.on_owner(bucket, key, |connection| {
            connection.call(Opcode::Head, &extension, &[])
        })?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    pub fn delete(&self, bucket: &str, key: &str) -> Result<()> {
        let extension = object_name(bucket, key).encode();
        self.on_owner(bucket, key, |connection| {
            connection.call(Opcode::Delete, &extension, &[])
        })?;
        Ok(())
    }

    /// The same request to every node, with retries; each node's answer, in node order.
    fn on_every_node(&self, opcode: Opcode, extension: &[u8]) -> Result<Vec<Frame>> {
        (0..self.inner.pools.len())
            .map(|index| {
                self.inner.on_node(index, &self.inner.policy, |connection| {
                    connection.call(opcode, extension, &[])
                })
            })
            .collect()
    }

    /// Up to `limit` keys of `bucket` starting with `prefix`, after `start_after`, in key order,
    /// gathered from every node.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ListEntry>> {
        let request = ListRequest {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            start_after: start_after.map(str::to_string),
            limit,
        };
        let mut entries = Vec::new();
        for answer in self.on_every_node(Opcode::List, &request.encode())? {
            entries.extend(ListEntries::decode(&answer.payload)?.entries);
        }
        entries.sort_by(|left, right| left.key.cmp(&right.key));
        entries.truncate(limit as usize);
        Ok(entries)
    }

    /// Each server's metrics (Prometheus text), with its address.
    pub fn stats(&self) -> Result<Vec<(String, String)>> {
        let answers = self.on_every_node(Opcode::Stats, &[])?;
        Ok(self
            .inner
            .addresses
            .iter()
            .zip(answers)
            .map(|(address, answer)| {
                (
                    address.clone(),
                    String::from_utf8_lossy(&answer.payload).into_owned(),
                )
            })
            .collect())
    }

    pub fn ping(&self) -> Result<()> {
        self.on_every_node(Opcode::Ping, &[]).map(drop)
    }

    /// Read objects of `bucket` under `prefix` through from the origin into the cache of the
    /// node that owns each; returns (objects, bytes) warmed. With one node the node lists the
    /// prefix itself; with several, the listing is split by owner.
    pub fn prefetch(&self, bucket: &str, prefix: &str) -> Result<(u64, u64)> {
        let nodes = self.inner.pools.len();
        let mut groups: Vec<Vec<String>> = vec![Vec::new(); nodes];
        if nodes > 1 {
            let mut after: Option<String> = None;
            loop {
                let page = self.list(bucket, prefix, after.as_deref(), LIST_ENTRIES_MAX as u32)?;
                let done = page.len() < LIST_ENTRIES_MAX;
                after = page.last().map(|entry| entry.key.clone());
                for entry in page {
                    groups[self.owner(bucket, &entry.key)].push(entry.key);
                }
                if done {
                    break;
                }
            }
        }
        let (mut objects, mut bytes) = (0, 0);
        for (index, request) in crate::placement::prefetch_requests(bucket, prefix, groups) {
            let answer = self.long_call(
                index,
                &self.inner.policy,
                Opcode::Prefetch,
                &request.encode(),
                None,
            )?;
            let warmed = PrefetchResult::decode(&answer.extension)?;
            objects += warmed.objects;
            bytes += warmed.bytes;
        }
        Ok((objects, bytes))
    }

    /// Announce that `keys` of `bucket` will be read in this order, so that each node reads
    /// its own of them ahead from the origin, at most `window_bytes` beyond the readers, until
    /// none of them is read for `idle`. `plan_id` names the plan (a reader's choice): a new
    /// plan of the same id replaces the old one on every node, and an empty `keys` just ends
    /// it. A node is told as many of its keys as one PLAN carries (65,536, and the payload
    /// bound); returns how many keys the nodes planned.
    pub fn plan(
        &self,
        bucket: &str,
        plan_id: u64,
        keys: &[String],
        window_bytes: u64,
        idle: Duration,
    ) -> Result<u64> {
        let request = PlanRequest {
            bucket: bucket.to_string(),
            plan_id,
            window_bytes,
            idle_ms: idle.as_millis().min(u32::MAX as u128) as u32,
        }
        .encode();
        let nodes = self.inner.pools.len();
        let mut groups: Vec<Vec<String>> = vec![Vec::new(); nodes];
        for key in keys {
            let owner = if nodes > 1 {
                self.owner(bucket, key)
            } else {
                0
            };
            if groups[owner].len() < PLAN_KEYS_MAX {
                groups[owner].push(key.clone());
            }
        }
        let mut planned = 0;
        for (index, group) in groups.iter().enumerate() {
            let answer = self
                .inner
                .on_node(index, &self.inner.policy, |connection| {
                    // As many keys as the node's payload bound takes (a count, then each key with
                    // its 2-byte length).
                    let payload_max = connection.limits.payload_bytes_max as usize;
                    let mut bytes = 4;
                    let fit = group
                        .iter()
                        .take_while(|key| {
                            bytes += 2 + key.len();
                            bytes <= payload_max
                        })
                        .count();
                    let payload = PlanKeys {
                        keys: group[..fit].to_vec(),
                    }
                    .encode();
                    connection.call(Opcode::Plan, &request, &payload)
                })?;
            planned += PlanResult::decode(&answer.extension)?.keys;
        }
        Ok(planned)
    }

    /// Wait until everything written to `bucket` under `prefix` (every bucket with `None`) is
    /// durable at the origin, on every node, at most `timeout`. Not retried: its TIMEOUT means
    /// the caller's wait is over.
    pub fn flush(&self, bucket: Option<&str>, prefix: &str, timeout: Duration) -> Result<()> {
        let request = FlushRequest {
            bucket: bucket.map(str::to_string),
            prefix: prefix.to_string(),
            timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
        };
        for index in 0..self.inner.pools.len() {
            self.long_call(
                index,
                &RetryPolicy::never(),
                Opcode::Flush,
                &request.encode(),
                Some(timeout),
            )?;
        }
        Ok(())
    }

    /// The writes under `bucket`/`prefix` (every bucket with `None`) that the origin refused
    /// for good, on every node (at most `limit` from each), and how many there are in all; with
    /// `retry`, each node queues them for upload again.
    pub fn uploads(
        &self,
        bucket: Option<&str>,
        prefix: &str,
        retry: bool,
        limit: u32,
    ) -> Result<(Vec<RefusedUpload>, u64)> {
        let request = UploadsRequest {
            bucket: bucket.map(str::to_string),
            prefix: prefix.to_string(),
            retry,
            limit,
        };
        let (mut refused, mut total) = (Vec::new(), 0);
        for index in 0..self.inner.pools.len() {
            let answer = self.long_call(
                index,
                &RetryPolicy::never(),
                Opcode::Uploads,
                &request.encode(),
                None,
            )?;
            let listed = UploadsAnswer::decode(&answer.payload)?;
            total += listed.total;
            refused.extend(listed.refused);
        }
        Ok((refused, total))
    }

    /// A call that may take longer than the request timeout (the server bounds it by
    /// `server_bound`, or it is a long PREFETCH): the answer timeout is lifted for it.
    fn long_call(
        &self,
        index: usize,
        policy: &RetryPolicy,
        opcode: Opcode,
        extension: &[u8],
        server_bound: Option<Duration>,
    ) -> Result<Frame> {
        self.inner.on_node(index, policy, |connection| {
            let timeout = connection.request_timeout();
            connection.set_answer_timeout(server_bound.map(|bound| bound + timeout))?;
            let answer = connection.call(opcode, extension, &[]);
            connection.set_answer_timeout(Some(timeout))?;
            answer
        })
    }
}

/// A blocking client of one or several hydrant servers, for one thread at a time: a
/// [`SharedClient`] behind `&mut self`. Use [`Client::shared`] to hand the same connections to
/// other threads.
pub struct Client {
    shared: SharedClient,
}

impl Client {
    /// Connect (and say HELLO) to every server in `servers`; `timeout` bounds connecting and
    /// each wait for an answer. Other settings are `ClientConfig`'s defaults.
    pub fn connect(servers: &[String], timeout: Duration) -> Result<Client> {
        Client::connect_with_token(servers, None, timeout)
    }

    /// Connect with a token, for servers that ask for a proof of it.
    pub fn connect_with_token(
        servers: &[String],
        token: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Client> {
        Client::with_config(
            ClientConfig::new(servers)
                .token(token)
                .connect_timeout(timeout)
                .request_timeout(timeout),
        )
    }

    /// Connect with every setting of `config`.
    pub fn with_config(config: ClientConfig) -> Result<Client> {
        Ok(Client {
            shared: SharedClient::connect(config)?,
        })
    }

    /// A handle on the same connections for other threads.
    pub fn shared(&self) -> SharedClient {
        self.shared.clone()
    }

    pub fn retries_total(&self) -> u64 {
        self.shared.retries_total()
    }

    pub fn put(&mut self, bucket: &str, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        self.shared.put(bucket, key, data)
    }

    pub fn put_with_progress(
        &mut self,
        bucket: &str,
        key: &str,
        data: &[u8],
        progress: Progress<'_>,
    ) -> Result<ObjectInfo> {
        self.shared.put_with_progress(bucket, key, data, progress)
    }

    /// The object (or bytes `start..end` of it, `end` exclusive).
    pub fn get(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        self.shared.get(bucket, key, range)
    }

    pub fn get_with_progress(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        progress: Progress<'_>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        self.shared.get_with_progress(bucket, key, range, progress)
    }

    /// See [`SharedClient::get_into`].
    pub fn get_into(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        buffer: &mut [u8],
    ) -> Result<(ObjectInfo, usize)> {
        self.shared.get_into(bucket, key, range, buffer)
    }

    /// See [`SharedClient::batch_get`].
    pub fn batch_get(&mut self, items: &[GetItem], in_order: bool) -> Result<Vec<ItemResult>> {
        self.shared.batch_get(items, in_order)
    }

    /// See [`SharedClient::pipeline`].
    pub fn pipeline(&mut self) -> Pipeline<'_> {
        self.shared.pipeline()
    }

    pub fn head(&mut self, bucket: &str, key: &str) -> Result<ObjectInfo> {
        self.shared.head(bucket, key)
    }

    pub fn delete(&mut self, bucket: &str, key: &str) -> Result<()> {
        self.shared.delete(bucket, key)
    }

    /// See [`SharedClient::list`].
    pub fn list(
        &mut self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ListEntry>> {
        self.shared.list(bucket, prefix, start_after, limit)
    }

    pub fn stats(&mut self) -> Result<Vec<(String, String)>> {
        self.shared.stats()
    }

    pub fn prefetch(&mut self, bucket: &str, prefix: &str) -> Result<(u64, u64)> {
        self.shared.prefetch(bucket, prefix)
    }

    pub fn flush(&mut self, bucket: Option<&str>, prefix: &str, timeout: Duration) -> Result<()> {
        self.shared.flush(bucket, prefix, timeout)
    }

    /// See [`SharedClient::plan`].
    pub fn plan(
        &mut self,
        bucket: &str,
        plan_id: u64,
        keys: &[String],
        window_bytes: u64,
        idle: Duration,
    ) -> Result<u64> {
        self.shared.plan(bucket, plan_id, keys, window_bytes, idle)
    }

    /// See [`SharedClient::put_parts`].
    pub fn put_parts(&mut self, bucket: &str, key: &str, parts: &[&[u8]]) -> Result<ObjectInfo> {
        self.shared.put_parts(bucket, key, parts)
    }

    /// See [`SharedClient::put_from`].
    pub fn put_from(
        &mut self,
        bucket: &str,
        key: &str,
        source: &mut dyn std::io::Read,
        object_bytes: u64,
        progress: Option<Progress<'_>>,
    ) -> Result<ObjectInfo> {
        self.shared
            .put_from(bucket, key, source, object_bytes, progress)
    }

    /// See [`SharedClient::get_to`].
    pub fn get_to(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        destination: &mut dyn std::io::Write,
        progress: Option<Progress<'_>>,
    ) -> Result<ObjectInfo> {
        self.shared
            .get_to(bucket, key, range, destination, progress)
    }

    /// See [`SharedClient::uploads`].
    pub fn uploads(
        &mut self,
        bucket: Option<&str>,
        prefix: &str,
        retry: bool,
        limit: u32,
    ) -> Result<(Vec<RefusedUpload>, u64)> {
        self.shared.uploads(bucket, prefix, retry, limit)
    }

    pub fn ping(&mut self) -> Result<()> {
        self.shared.ping()
    }
}

/// Slices read one after another, as one stream.
struct Gather<'a> {
    slices: &'a [&'a [u8]],
    index: usize,
    offset: usize,
}

impl<'a> Gather<'a> {
    fn new(slices: &'a [&'a [u8]]) -> Self {
        Gather {
            slices,
            index: 0,
            offset: 0,
        }
    }
}

impl std::io::Read for Gather<'_> {
    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        let mut filled = 0;
        while filled < into.len() && self.index < self.slices.len() {
            let rest = &self.slices[self.index][self.offset..];
            let taken = rest.len().min(into.len() - filled);
            into[filled..filled + taken].copy_from_slice(&rest[..taken]);
            filled += taken;
            self.offset += taken;
            if self.offset == self.slices[self.index].len() {
                self.index += 1;
                self.offset = 0;
            }
        }
        Ok(filled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads share a client: this stops compiling if a field makes it thread-bound.
    #[test]
    fn the_clients_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<SharedClient>();
        shareable::<Client>();
        #[cfg(feature = "async")]
        shareable::<crate::AsyncClient>();
    }

    #[test]
    fn gather_reads_its_slices_in_order_across_any_read_sizes() {
        use std::io::Read;
        let parts: [&[u8]; 5] = [b"abc", b"", b"defgh", b"i", b"jklmnopq"];
        let whole: Vec<u8> = parts.concat();
        for size in 1..=whole.len() + 1 {
            let mut gather = Gather::new(&parts);
            let mut read = Vec::new();
            let mut buffer = vec![0; size];
            loop {
                let count = gather.read(&mut buffer).unwrap();
                if count == 0 {
                    break;
                }
                read.extend_from_slice(&buffer[..count]);
            }
            assert_eq!(read, whole, "reads of {size} bytes");
        }
    }
}
