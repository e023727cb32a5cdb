//! The async client on tokio: the blocking client's operations, every request pipelined on a
//! pooled connection per node.

mod connection;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydrant_proto::message::{
    BatchGetRequest, FlushRequest, ListEntries, ListEntry, ListRequest, Message, ObjectInfo,
    PrefetchResult, PutRequest, LIST_ENTRIES_MAX,
};
use hydrant_proto::{FrameFlags, Opcode};

use crate::config::ClientConfig;
use crate::connection::{malformed, place_batch_item};
use crate::error::{ClientError, Result};
use crate::frames::{answer_bytes, Frame};
use crate::nodes::{batch_groups, get_request, object_name};
use crate::placement::node_for;
use crate::retry::RetryPolicy;
use crate::{GetItem, ItemResult};
use connection::{Answer, AsyncConnection};

/// An async client of one or several hydrant servers. Clones share the connections; every
/// call may run concurrently with any other.
#[derive(Clone)]
pub struct AsyncClient {
    inner: Arc<Inner>,
}

struct Inner {
    addresses: Vec<String>,
    pools: Vec<AsyncNodePool>,
    policy: RetryPolicy,
    retries: AtomicU64,
}

/// The connections to one node. A request goes on the connection with the fewest requests in
/// flight; a new connection is opened only when every open one is busy and fewer than the
/// maximum are open, so a sequential caller uses one.
struct AsyncNodePool {
    address: String,
    token: Option<Vec<u8>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    connections_max: usize,
    connections: tokio::sync::Mutex<Vec<Arc<AsyncConnection>>>,
    /// The shard-aware path, as in the blocking client's pool: a pool per shard of this node,
    /// learnt from the HELLO of a connection opened (`Some(None)`: the node offers none, or
    /// they are turned off; `None`: not known yet, or forgotten after a shard's connection
    /// broke). Shard pools have none of their own.
    shards: std::sync::Mutex<Option<Option<Arc<AsyncShards>>>>,
    shard_aware: bool,
}

/// The pools of one node's shards, and how keys map to shards.
struct AsyncShards {
    placement_hash: u32,
    pools: Vec<AsyncNodePool>,
}

impl AsyncShards {
    fn shard_for(&self, bucket: &str, key: &str) -> Option<usize> {
        crate::placement::shard_for(self.placement_hash, self.pools.len() as u16, bucket, key)
    }
}

impl AsyncNodePool {
    fn new(address: &str, config: &ClientConfig) -> AsyncNodePool {
        AsyncNodePool {
            address: address.to_string(),
            token: config.token.clone(),
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            connections_max: config.max_connections_per_node,
            connections: tokio::sync::Mutex::new(Vec::new()),
            shards: std::sync::Mutex::new(None),
            shard_aware: config.shard_aware,
        }
    }

    fn shards_state(&self) -> std::sync::MutexGuard<'_, Option<Option<Arc<AsyncShards>>>> {
        self.shards
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// This node's shard pools, when it offers shard ports and they are known.
    fn shards(&self) -> Option<Arc<AsyncShards>> {
        self.shards_state().clone().flatten()
    }

    /// A shard's connection broke: the server may have restarted on new ports; the next
    /// connection opened to the node learns them again.
    fn forget_shards(&self) {
        *self.shards_state() = None;
    }

    /// A shard's port could not be reached: the node's port only, until a connection breaks.
    fn disable_shards(&self) {
        *self.shards_state() = Some(None);
    }

    /// A pool for a shard of this node at `address`, opened like this one.
    fn shard_pool(&self, address: &str, connections_max: usize) -> AsyncNodePool {
        AsyncNodePool {
            address: address.to_string(),
            token: self.token.clone(),
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            connections_max,
            connections: tokio::sync::Mutex::new(Vec::new()),
            shards: std::sync::Mutex::new(Some(None)),
            shard_aware: false,
        }
    }

    fn learn_shards(&self, connection: &AsyncConnection) {
        let mut known = self.shards_state();
        if !self.shard_aware || known.is_some() {
            return;
        }
        let host = self
            .address
            .rsplit_once(':')
            .map_or(self.address.as_str(), |(host, _)| host);
        *known = Some(connection.shard_map.as_ref().map(|map| {
            let per_shard = self.connections_max.div_ceil(map.ports.len());
            Arc::new(AsyncShards {
                placement_hash: map.placement_hash,
                pools: map
                    .ports
                    .iter()
                    .map(|&port| {
                        let address = match map.peer {
                            Some(mut peer) => {
                                peer.set_port(port);
                                peer.to_string()
                            }
                            None => format!("{host}:{port}"),
                        };
                        self.shard_pool(&address, per_shard)
                    })
                    .collect(),
            })
        }));
    }

    async fn take(&self) -> Result<Arc<AsyncConnection>> {
        let mut connections = self.connections.lock().await;
        connections.retain(|connection| !connection.is_broken());
        let least_busy = connections
            .iter()
            .min_by_key(|connection| connection.in_flight())
            .cloned();
        if let Some(connection) = least_busy {
            if connection.in_flight() == 0 || connections.len() >= self.connections_max {
                return Ok(connection);
            }
        }
        // Opening under the lock keeps the count bounded; other callers for this node wait
        // for it, at most the connect timeout.
        let connection = Arc::new(
            AsyncConnection::open(
                &self.address,
                self.token.as_deref(),
                self.connect_timeout,
                self.request_timeout,
            )
            .await
            .map_err(|error| error.at(&self.address))?,
        );
        connections.push(connection.clone());
        self.learn_shards(&connection);
        Ok(connection)
    }
}

/// Run `attempt` until it succeeds or `policy` says to stop, sleeping between attempts.
async fn retrying<T, Attempt, Output>(
    policy: &RetryPolicy,
    retries: &AtomicU64,
    mut attempt: Attempt,
) -> Result<T>
where
    Attempt: FnMut() -> Output,
    Output: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut retry = 0;
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let Some(wait) = policy.wait_before(retry, started, &error) else {
            return Err(error);
        };
        tokio::time::sleep(wait).await;
        retry += 1;
        retries.fetch_add(1, Ordering::Relaxed);
    }
}

impl AsyncClient {
    /// Connect (and say HELLO) to every server of `config`: one connection each now, more as
    /// concurrent requests need them.
    pub async fn connect(config: ClientConfig) -> Result<AsyncClient> {
        if config.servers.is_empty() {
            return Err(ClientError::Usage("no server given".into()));
        }
        let pools: Vec<AsyncNodePool> = config
            .servers
            .iter()
            .map(|address| AsyncNodePool::new(address, &config))
            .collect();
        for pool in &pools {
            pool.take().await?;
        }
        Ok(AsyncClient {
            inner: Arc::new(Inner {
                addresses: config.servers.clone(),
                pools,
                policy: RetryPolicy::new(&config),
                retries: AtomicU64::new(0),
            }),
        })
    }

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

    /// One request to node `index` and its whole answer, retried by `policy`.
    async fn call(
        &self,
        index: usize,
        policy: &RetryPolicy,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        answer_timeout: Option<Option<Duration>>,
    ) -> Result<Frame> {
        self.call_shard(
            index,
            None,
            policy,
            opcode,
            extension,
            payload,
            answer_timeout,
        )
        .await
    }

    /// `call`, on shard `shard`'s own port when given and the node offers the shard-aware
    /// path; a shard port that cannot be reached turns the path off for the node, and a shard
    /// connection that breaks makes the node's ports be learnt again.
    #[allow(clippy::too_many_arguments)]
    async fn call_shard(
        &self,
        index: usize,
        shard: Option<usize>,
        policy: &RetryPolicy,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        answer_timeout: Option<Option<Duration>>,
    ) -> Result<Frame> {
        let node = &self.inner.pools[index];
        retrying(policy, &self.inner.retries, move || async move {
            let shards = shard.and_then(|_| node.shards());
            let shard_pool = shards
                .as_ref()
                .zip(shard)
                .and_then(|(shards, shard)| shards.pools.get(shard));
            let (pool, connection) = match shard_pool {
                Some(pool) => match pool.take().await {
                    Ok(connection) => (pool, connection),
                    Err(_) => {
                        node.disable_shards();
                        (node, node.take().await?)
                    }
                },
                None => (node, node.take().await?),
            };
            let answer = connection
                .send(
                    opcode,
                    extension,
                    payload,
                    FrameFlags::empty(),
                    answer_timeout,
                )
                .await;
            let result = match answer {
                Ok(answer) => answer.whole().await,
                Err(error) => Err(error),
            };
            if result.is_err() && shard_pool.is_some() && connection.is_broken() {
                node.forget_shards();
            }
            result.map_err(|error| error.at(&pool.address))
        })
        .await
    }

    async fn call_owner(
        &self,
        bucket: &str,
        key: &str,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
    ) -> Result<Frame> {
        let index = self.owner(bucket, key);
        let shard = self.inner.pools[index]
            .shards()
            .and_then(|shards| shards.shard_for(bucket, key));
        self.call_shard(
            index,
            shard,
            &self.inner.policy,
            opcode,
            extension,
            payload,
            None,
        )
        .await
    }

    pub async fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        let extension = PutRequest {
            name: object_name(bucket, key),
            object_bytes: data.len() as u64,
        }
        .encode();
        let answer = self
            .call_owner(bucket, key, Opcode::Put, &extension, data)
            .await?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    /// The object (or bytes `start..end` of it, `end` exclusive; `None`: to the end).
    pub async fn get(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        let request = get_request(bucket, key, range);
        let answer = self
            .call_owner(bucket, key, Opcode::Get, &request.encode(), &[])
            .await?;
        let info = ObjectInfo::decode(&answer.extension)?;
        if answer.payload.len() as u64 != answer_bytes(&info, request.range_end) {
            return Err(malformed(
                "an answer whose length does not match its object",
            ));
        }
        Ok((info, answer.payload))
    }

    /// The object (or a range of it, as `get`) copied into `buffer`; returns its info and the
    /// bytes read, at the start of `buffer`. A buffer smaller than the answer gets
    /// `BufferTooSmall` from the answer's first frame, before the rest of it is awaited.
    pub async fn get_into(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
        buffer: &mut [u8],
    ) -> Result<(ObjectInfo, usize)> {
        let request = get_request(bucket, key, range);
        let extension = request.encode();
        let index = self.owner(bucket, key);
        let pool = &self.inner.pools[index];
        let started = Instant::now();
        let mut retry = 0;
        // The retry loop is written out here: the buffer cannot be lent to a closure that
        // makes a new future for each attempt.
        loop {
            let attempt = async {
                let connection = pool.take().await?;
                let answer = connection
                    .send(Opcode::Get, &extension, &[], FrameFlags::empty(), None)
                    .await?;
                receive_into(answer, request.range_end, &mut *buffer).await
            }
            .await
            .map_err(|error| error.at(&pool.address));
            let error = match attempt {
                Ok(done) => return Ok(done),
                Err(error) => error,
            };
            let Some(wait) = self.inner.policy.wait_before(retry, started, &error) else {
                return Err(error);
            };
            tokio::time::sleep(wait).await;
            retry += 1;
            self.inner.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectInfo> {
        let extension = object_name(bucket, key).encode();
        let answer = self
            .call_owner(bucket, key, Opcode::Head, &extension, &[])
            .await?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    pub async fn delete(&self, bucket: &str, key: &str) -> Result<()> {
        let extension = object_name(bucket, key).encode();
        self.call_owner(bucket, key, Opcode::Delete, &extension, &[])
            .await?;
        Ok(())
    }

    /// Many gets in one request per group of a node's items, the nodes at once: each item's
    /// result, in the order asked (see `SharedClient::batch_get`).
    pub async fn batch_get(&self, items: &[GetItem], in_order: bool) -> Result<Vec<ItemResult>> {
        let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); self.inner.pools.len()];
        for (index, item) in items.iter().enumerate() {
            per_node[self.owner(&item.bucket, &item.key)].push(index);
        }
        let mut requests = Vec::new();
        for (node, indices) in per_node.iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let limits = self.inner.pools[node].take().await?.limits;
            for group in batch_groups(items, indices, &limits) {
                let positions: Vec<usize> = group
                    .into_iter()
                    .map(|position| indices[position])
                    .collect();
                requests.push((node, positions));
            }
        }
        let flags = if in_order {
            FrameFlags::IN_ORDER
        } else {
            FrameFlags::empty()
        };
        let batches = requests.iter().map(|(node, positions)| async move {
            let request = BatchGetRequest {
                items: positions
                    .iter()
                    .map(|&index| {
                        let item = &items[index];
                        get_request(&item.bucket, &item.key, item.range).to_owned()
                    })
                    .collect(),
            };
            let extension = &request.encode();
            let pool = &self.inner.pools[*node];
            retrying(
                &self.inner.policy,
                &self.inner.retries,
                move || async move {
                    let connection = pool.take().await?;
                    let answer = connection
                        .send(Opcode::BatchGet, extension, &[], flags, None)
                        .await?;
                    receive_batch(answer, positions.len()).await
                },
            )
            .await
            .map_err(|error| error.at(&pool.address))
        });
        let answers = join_all(batches.collect()).await;
        let mut results: Vec<Option<ItemResult>> = (0..items.len()).map(|_| None).collect();
        for ((_, positions), answer) in requests.iter().zip(answers) {
            for (&index, result) in positions.iter().zip(answer?) {
                results[index] = Some(result);
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every item was sent to a node"))
            .collect())
    }

    /// The same request to every node at once, with retries; each node's answer, in order.
    async fn on_every_node(
        &self,
        opcode: Opcode,
        extension: &[u8],
        policy: &RetryPolicy,
        answer_timeout: Option<Option<Duration>>,
    ) -> Result<Vec<Frame>> {
        let calls = (0..self.inner.pools.len())
            .map(|index| self.call(index, policy, opcode, extension, &[], answer_timeout));
        join_all(calls.collect()).await.into_iter().collect()
    }

    /// Up to `limit` keys of `bucket` starting with `prefix`, after `start_after`, in key order,
    /// gathered from every node.
    pub async fn list(
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
        let answers = self
            .on_every_node(Opcode::List, &request.encode(), &self.inner.policy, None)
            .await?;
        let mut entries = Vec::new();
        for answer in answers {
            entries.extend(ListEntries::decode(&answer.payload)?.entries);
        }
        entries.sort_by(|left, right| left.key.cmp(&right.key));
        entries.truncate(limit as usize);
        Ok(entries)
    }

    /// Each server's metrics (Prometheus text), with its address.
    pub async fn stats(&self) -> Result<Vec<(String, String)>> {
        let answers = self
            .on_every_node(Opcode::Stats, &[], &self.inner.policy, None)
            .await?;
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

    pub async fn ping(&self) -> Result<()> {
        self.on_every_node(Opcode::Ping, &[], &self.inner.policy, None)
            .await
            .map(drop)
    }

    /// Read objects of `bucket` under `prefix` through from the origin into the cache of the
    /// node that owns each; returns (objects, bytes) warmed (see `SharedClient::prefetch`).
    pub async fn prefetch(&self, bucket: &str, prefix: &str) -> Result<(u64, u64)> {
        let nodes = self.inner.pools.len();
        let mut groups: Vec<Vec<String>> = vec![Vec::new(); nodes];
        if nodes > 1 {
            let mut after: Option<String> = None;
            loop {
                let page = self
                    .list(bucket, prefix, after.as_deref(), LIST_ENTRIES_MAX as u32)
                    .await?;
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
            // A prefix's read-through may take long: its answer is awaited without end.
            let answer = self
                .call(
                    index,
                    &self.inner.policy,
                    Opcode::Prefetch,
                    &request.encode(),
                    &[],
                    Some(None),
                )
                .await?;
            let warmed = PrefetchResult::decode(&answer.extension)?;
            objects += warmed.objects;
            bytes += warmed.bytes;
        }
        Ok((objects, bytes))
    }

    /// Wait until everything written to `bucket` under `prefix` (every bucket with `None`) is
    /// durable at the origin, on every node, at most `timeout`. Not retried.
    pub async fn flush(&self, bucket: Option<&str>, prefix: &str, timeout: Duration) -> Result<()> {
        let request = FlushRequest {
            bucket: bucket.map(str::to_string),
            prefix: prefix.to_string(),
            timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
        };
        let request_timeout = self.inner.pools[0].request_timeout;
        self.on_every_node(
            Opcode::Flush,
            &request.encode(),
            &RetryPolicy::never(),
            Some(Some(timeout + request_timeout)),
        )
        .await
        .map(drop)
    }
}

/// A GET's answer copied into `buffer`, checked against its length before anything is copied.
async fn receive_into(
    mut answer: Answer,
    range_end: Option<u64>,
    buffer: &mut [u8],
) -> Result<(ObjectInfo, usize)> {
    let mut frame = answer.next().await?;
    if frame.header.status != 0 {
        return Err(ClientError::from_answer(
            frame.header.status,
            &frame.payload,
        ));
    }
    let info = ObjectInfo::decode(&frame.extension)?;
    let needed = answer_bytes(&info, range_end);
    if needed > buffer.len() as u64 {
        return Err(ClientError::BufferTooSmall {
            needed,
            capacity: buffer.len(),
        });
    }
    let mut received = 0usize;
    loop {
        let end = received + frame.payload.len();
        if end as u64 > needed {
            return Err(malformed("an answer longer than its object"));
        }
        buffer[received..end].copy_from_slice(&frame.payload);
        received = end;
        if !frame.header.flags.contains(FrameFlags::MORE) {
            break;
        }
        frame = answer.next().await?;
        if frame.header.status != 0 {
            // Ended early by the server: its reason, not the rest of the object.
            return Err(ClientError::from_answer(
                frame.header.status,
                &frame.payload,
            ));
        }
    }
    if received as u64 != needed {
        return Err(malformed("an answer shorter than its object"));
    }
    Ok((info, received))
}

/// A BATCH_GET's answer frames, each item's result at its place.
async fn receive_batch(mut answer: Answer, count: usize) -> Result<Vec<ItemResult>> {
    let mut results: Vec<Option<ItemResult>> = (0..count).map(|_| None).collect();
    loop {
        let frame = answer.next().await?;
        let more = frame.header.flags.contains(FrameFlags::MORE);
        place_batch_item(&mut results, frame)?;
        if !more {
            break;
        }
    }
    results
        .into_iter()
        .map(|result| result.ok_or_else(|| malformed("an item left unanswered")))
        .collect()
}

/// Await every future concurrently on the caller's task, polling each unfinished one on every
/// wake-up: fine for the few futures here (one per node or batch), and no dependency on
/// `futures` for this one use.
async fn join_all<Output, Each>(futures: Vec<Each>) -> Vec<Output>
where
    Each: Future<Output = Output>,
{
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}
