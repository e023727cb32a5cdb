//! hydrant-client: a blocking client for hydrant servers.
//!
//! One connection per node, greeted with HELLO. Keys are placed on nodes by rendezvous hashing:
//! each (node, bucket, key) gets a score and the highest wins, so adding or removing a node
//! moves only the keys that node wins or won.
//!
//! Built so far (issue 3, in progress): put, get (whole or range), head, delete, list, ping.
//! Pooling, pipelining from the API, retries and the async API come next.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use hydrant_proto::message::{
    BatchGetRequest, BatchItem, FlushRequest, GetRequest, HelloRequest, HelloResponse, ListEntries,
    ListEntry, ListRequest, Message, ObjectInfo, ObjectName, PrefetchRequest, PrefetchResult,
    PutRequest, LIST_ENTRIES_MAX, PREFETCH_KEYS_MAX,
};
use hydrant_proto::{
    payload_crc, FrameFlags, FrameHeader, Limits, Opcode, ProtoError, Status, StatusClass,
    FRAME_HEADER_BYTES,
};

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered with a status other than OK; `message` is its reason.
    Status {
        status: u8,
        message: String,
    },
    Io(io::Error),
    Protocol(ProtoError),
    /// Bad input caught before anything was sent.
    Usage(String),
}

impl ClientError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Status { status, .. } if *status == Status::NotFound as u8)
    }

    /// Worth retrying (a retriable status, or a broken connection).
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Status { status, .. } => {
                Status::class_of(*status) == StatusClass::Retriable
            }
            ClientError::Io(_) => true,
            _ => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Status { status, message } => {
                let name = Status::from_byte(*status)
                    .map(|status| format!("{status:?}"))
                    .unwrap_or(format!("status {status:#x}"));
                write!(formatter, "{name}: {message}")
            }
            ClientError::Io(error) => write!(formatter, "{error}"),
            ClientError::Protocol(error) => write!(formatter, "protocol error: {error}"),
            ClientError::Usage(message) => write!(formatter, "{message}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        ClientError::Io(error)
    }
}

impl From<ProtoError> for ClientError {
    fn from(error: ProtoError) -> Self {
        ClientError::Protocol(error)
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// One item of a batch get: a key and an optional range (`start`, exclusive `end`).
#[derive(Clone, Debug)]
pub struct GetItem {
    pub bucket: String,
    pub key: String,
    pub range: Option<(u64, Option<u64>)>,
}

/// One item's outcome in a batch.
pub type ItemResult = Result<(ObjectInfo, Vec<u8>)>;

struct Node {
    address: String,
    stream: TcpStream,
    limits: Limits,
    next_request_id: u64,
    /// An I/O or protocol error left the connection out of step: reconnect before next use.
    broken: bool,
}

struct Response {
    header: FrameHeader,
    extension: Vec<u8>,
    payload: Vec<u8>,
}

impl Node {
    fn connect(address: &str, token: Option<&[u8]>, timeout: Duration) -> Result<Node> {
        let resolved = address.to_socket_addrs()?.next().ok_or_else(|| {
            ClientError::Usage(format!("{address} does not resolve to an address"))
        })?;
        let stream = TcpStream::connect_timeout(&resolved, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut node = Node {
            address: address.to_string(),
            stream,
            limits: Limits::default(),
            next_request_id: 1,
            broken: false,
        };
        let client_nonce = random_nonce();
        let hello = HelloRequest {
            version_min: 1,
            version_max: 1,
            limits: Limits::default(),
            client_nonce,
            proof: None,
        };
        let answer = node.call(Opcode::Hello, &hello.encode(), &[])?;
        let mut greeting = HelloResponse::decode(&answer.extension)?;
        if greeting.auth_required {
            let token = token.ok_or_else(|| {
                ClientError::Usage(format!("{address} asks for a token (set HYDRANT_TOKEN)"))
            })?;
            let proof = hydrant_proto::auth::proof(token, &greeting.server_nonce, &client_nonce);
            let hello = HelloRequest {
                proof: Some(proof),
                ..hello
            };
            let answer = node.call(Opcode::Hello, &hello.encode(), &[])?;
            greeting = HelloResponse::decode(&answer.extension)?;
        }
        node.limits = greeting.limits;
        Ok(node)
    }

    /// Send a request and wait for its answer. A payload above the negotiated limit goes as
    /// several frames (MORE on all but the last); a streamed answer is put back together.
    fn call(&mut self, opcode: Opcode, extension: &[u8], payload: &[u8]) -> Result<Response> {
        let result = self.exchange(opcode, extension, payload);
        self.note(&result);
        result
    }

    /// After an I/O or protocol error the byte stream cannot be trusted any more.
    fn note<T>(&mut self, result: &Result<T>) {
        if matches!(result, Err(ClientError::Io(_) | ClientError::Protocol(_))) {
            self.broken = true;
        }
    }

    fn exchange(&mut self, opcode: Opcode, extension: &[u8], payload: &[u8]) -> Result<Response> {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let part_bytes = self.limits.payload_bytes_max as usize;
        let parts = payload.len().div_ceil(part_bytes).max(1);
        for index in 0..parts {
            let part = &payload[(index * part_bytes).min(payload.len())
                ..((index + 1) * part_bytes).min(payload.len())];
            let part_extension = if index == 0 { extension } else { &[][..] };
            let crc = payload_crc(part);
            let mut header =
                FrameHeader::new(opcode, request_id, part_extension, part.len() as u64, crc);
            if index + 1 < parts {
                header.flags = header.flags.with(FrameFlags::MORE);
            }
            self.stream.write_all(&header.encode())?;
            self.stream.write_all(part_extension)?;
            self.stream.write_all(part)?;
        }
        let mut response = self.receive()?;
        while response.header.flags.contains(FrameFlags::MORE) {
            let next = self.receive()?;
            if next.header.request_id != request_id {
                return Err(ClientError::Protocol(ProtoError::Malformed(
                    "a streamed answer was interrupted",
                )));
            }
            response.payload.extend_from_slice(&next.payload);
            response.header.flags = next.header.flags;
        }
        if response.header.request_id != request_id {
            return Err(ClientError::Protocol(ProtoError::Malformed(
                "an answer to another request",
            )));
        }
        if response.header.status != Status::Ok as u8 {
            return Err(ClientError::Status {
                status: response.header.status,
                message: String::from_utf8_lossy(&response.payload).into_owned(),
            });
        }
        Ok(response)
    }

    /// Send one BATCH_GET and gather its answers (one frame per item, the last without MORE).
    fn batch(&mut self, request: &BatchGetRequest, in_order: bool) -> Result<Vec<ItemResult>> {
        let result = self.exchange_batch(request, in_order);
        self.note(&result);
        result
    }

    fn exchange_batch(
        &mut self,
        request: &BatchGetRequest,
        in_order: bool,
    ) -> Result<Vec<ItemResult>> {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let extension = request.encode();
        let mut header = FrameHeader::new(Opcode::BatchGet, request_id, &extension, 0, 0);
        if in_order {
            header.flags = header.flags.with(FrameFlags::IN_ORDER);
        }
        self.stream.write_all(&header.encode())?;
        self.stream.write_all(&extension)?;
        let mut results: Vec<Option<ItemResult>> = (0..request.items.len()).map(|_| None).collect();
        loop {
            let response = self.receive()?;
            if response.header.request_id != request_id {
                return Err(ClientError::Protocol(ProtoError::Malformed(
                    "an answer to another request",
                )));
            }
            let more = response.header.flags.contains(FrameFlags::MORE);
            let Ok(item) = BatchItem::decode(&response.extension) else {
                // The batch as a whole was refused.
                return Err(ClientError::Status {
                    status: response.header.status,
                    message: String::from_utf8_lossy(&response.payload).into_owned(),
                });
            };
            let slot = results
                .get_mut(item.item as usize)
                .ok_or(ClientError::Protocol(ProtoError::Malformed(
                    "an answer for an item not asked",
                )))?;
            *slot = Some(match (response.header.status, item.info) {
                (0, Some(info)) => Ok((info, response.payload)),
                (status, _) => Err(ClientError::Status {
                    status,
                    message: String::from_utf8_lossy(&response.payload).into_owned(),
                }),
            });
            if !more {
                break;
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.ok_or(ClientError::Protocol(ProtoError::Malformed(
                    "an item left unanswered",
                )))
            })
            .collect()
    }

    fn receive(&mut self) -> Result<Response> {
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header_bytes)?;
        let header = FrameHeader::decode(&header_bytes, &self.limits)?;
        let mut extension = vec![0; header.extension_len as usize];
        self.stream.read_exact(&mut extension)?;
        let mut payload = vec![0; header.payload_len as usize];
        self.stream.read_exact(&mut payload)?;
        header.check_body(&extension, &payload)?;
        Ok(Response {
            header,
            extension,
            payload,
        })
    }
}

/// A nonce for HELLO: random per process (std's randomly seeded hasher) and per call.
fn random_nonce() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = std::collections::hash_map::RandomState::new();
    let mut nonce = [0u8; 16];
    for half in 0..2 {
        let mut hasher = state.build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        hasher.write_u128(nanos);
        nonce[half * 8..half * 8 + 8].copy_from_slice(&hasher.finish().to_le_bytes());
    }
    nonce
}

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
    (0..nodes.len())
        .max_by_key(|&index| score(&nodes[index], bucket, key))
        .expect("at least one node")
}

/// A blocking client of one or several hydrant servers.
pub struct Client {
    nodes: Vec<Node>,
    addresses: Vec<String>,
    token: Option<Vec<u8>>,
    timeout: Duration,
}

impl Client {
    /// Connect (and say HELLO) to every server in `servers`.
    pub fn connect(servers: &[String], timeout: Duration) -> Result<Client> {
        Client::connect_with_token(servers, None, timeout)
    }

    /// Connect with a token, for servers that ask for a proof of it.
    pub fn connect_with_token(
        servers: &[String],
        token: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Client> {
        if servers.is_empty() {
            return Err(ClientError::Usage("no server given".into()));
        }
        let nodes = servers
            .iter()
            .map(|address| {
                Node::connect(address, token, timeout).map_err(|error| annotate(address, error))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Client {
            nodes,
            addresses: servers.to_vec(),
            token: token.map(<[u8]>::to_vec),
            timeout,
        })
    }

    /// Node `index`, connected again if an error left its connection out of step.
    fn ready(&mut self, index: usize) -> Result<&mut Node> {
        if self.nodes[index].broken {
            let address = self.addresses[index].clone();
            let node = Node::connect(&address, self.token.as_deref(), self.timeout)
                .map_err(|error| annotate(&address, error))?;
            self.nodes[index] = node;
        }
        Ok(&mut self.nodes[index])
    }

    fn node(&mut self, bucket: &str, key: &str) -> Result<&mut Node> {
        let index = node_for(&self.addresses, bucket, key);
        self.ready(index)
    }

    fn name(bucket: &str, key: &str) -> ObjectName {
        ObjectName {
            bucket: bucket.to_string(),
            key: key.to_string(),
        }
    }

    pub fn put(&mut self, bucket: &str, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        let request = PutRequest {
            name: Self::name(bucket, key),
            object_bytes: data.len() as u64,
        };
        let answer = self
            .node(bucket, key)?
            .call(Opcode::Put, &request.encode(), data)?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    /// The object (or bytes `start..end` of it, `end` exclusive).
    pub fn get(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<(ObjectInfo, Vec<u8>)> {
        let (range_start, range_end) = range.unwrap_or((0, None));
        let request = GetRequest {
            name: Self::name(bucket, key),
            range_start,
            range_end,
        };
        let answer = self
            .node(bucket, key)?
            .call(Opcode::Get, &request.encode(), &[])?;
        Ok((ObjectInfo::decode(&answer.extension)?, answer.payload))
    }

    /// Many gets in one request per node: each item's result, in the order asked. With
    /// `in_order` the servers answer in request order; otherwise as items complete.
    pub fn batch_get(&mut self, items: &[GetItem], in_order: bool) -> Result<Vec<ItemResult>> {
        let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (index, item) in items.iter().enumerate() {
            per_node[node_for(&self.addresses, &item.bucket, &item.key)].push(index);
        }
        let mut results: Vec<Option<ItemResult>> = (0..items.len()).map(|_| None).collect();
        for (node, indices) in per_node.into_iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let request = BatchGetRequest {
                items: indices
                    .iter()
                    .map(|&index| GetRequest {
                        name: Self::name(&items[index].bucket, &items[index].key),
                        range_start: items[index].range.map_or(0, |range| range.0),
                        range_end: items[index].range.and_then(|range| range.1),
                    })
                    .collect(),
            };
            for group in batch_groups(items, &indices, &self.ready(node)?.limits) {
                let request = BatchGetRequest {
                    items: group
                        .iter()
                        .map(|&index| request.items[index].clone())
                        .collect(),
                };
                let answers = self.ready(node)?.batch(&request, in_order)?;
                for (position, answer) in group.into_iter().zip(answers) {
                    results[indices[position]] = Some(answer);
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every item was sent to a node"))
            .collect())
    }

    pub fn head(&mut self, bucket: &str, key: &str) -> Result<ObjectInfo> {
        let answer =
            self.node(bucket, key)?
                .call(Opcode::Head, &Self::name(bucket, key).encode(), &[])?;
        Ok(ObjectInfo::decode(&answer.extension)?)
    }

    pub fn delete(&mut self, bucket: &str, key: &str) -> Result<()> {
        self.node(bucket, key)?
            .call(Opcode::Delete, &Self::name(bucket, key).encode(), &[])?;
        Ok(())
    }

    /// Up to `limit` keys of `bucket` starting with `prefix`, after `start_after`, in key order,
    /// gathered from every node.
    pub fn list(
        &mut self,
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
        for index in 0..self.nodes.len() {
            let node = self.ready(index)?;
            let answer = node
                .call(Opcode::List, &request.encode(), &[])
                .map_err(|error| annotate(&node.address, error))?;
            entries.extend(ListEntries::decode(&answer.payload)?.entries);
        }
        entries.sort_by(|left, right| left.key.cmp(&right.key));
        entries.truncate(limit as usize);
        Ok(entries)
    }

    /// Each server's metrics (Prometheus text), with its address.
    pub fn stats(&mut self) -> Result<Vec<(String, String)>> {
        let mut all = Vec::with_capacity(self.nodes.len());
        for index in 0..self.nodes.len() {
            let node = self.ready(index)?;
            let answer = node.call(Opcode::Stats, &[], &[])?;
            all.push((
                node.address.clone(),
                String::from_utf8_lossy(&answer.payload).into_owned(),
            ));
        }
        Ok(all)
    }

    /// Read objects of `bucket` under `prefix` through from the origin into the cache of the
    /// node that owns each; returns (objects, bytes) warmed. With one node the node lists the
    /// prefix itself; with several, the listing is split by owner.
    pub fn prefetch(&mut self, bucket: &str, prefix: &str) -> Result<(u64, u64)> {
        let mut groups: Vec<Vec<String>> = vec![Vec::new(); self.nodes.len()];
        if self.nodes.len() > 1 {
            let mut after: Option<String> = None;
            loop {
                let page = self.list(bucket, prefix, after.as_deref(), LIST_ENTRIES_MAX as u32)?;
                let done = page.len() < LIST_ENTRIES_MAX;
                after = page.last().map(|entry| entry.key.clone());
                for entry in page {
                    groups[node_for(&self.addresses, bucket, &entry.key)].push(entry.key);
                }
                if done {
                    break;
                }
            }
        }
        let (mut objects, mut bytes) = (0, 0);
        for (index, keys) in groups.into_iter().enumerate() {
            if self.nodes.len() > 1 && keys.is_empty() {
                continue;
            }
            let batches: Vec<Vec<String>> = if keys.is_empty() {
                vec![Vec::new()]
            } else {
                keys.chunks(PREFETCH_KEYS_MAX)
                    .map(<[String]>::to_vec)
                    .collect()
            };
            for keys in batches {
                let request = PrefetchRequest {
                    bucket: bucket.to_string(),
                    prefix: prefix.to_string(),
                    keys,
                };
                let answer = self.long_call(index, Opcode::Prefetch, &request.encode(), None)?;
                let warmed = PrefetchResult::decode(&answer.extension)?;
                objects += warmed.objects;
                bytes += warmed.bytes;
            }
        }
        Ok((objects, bytes))
    }

    /// Wait until everything written to `bucket` under `prefix` (every bucket with `None`) is
    /// durable at the origin, on every node, at most `timeout`.
    pub fn flush(&mut self, bucket: Option<&str>, prefix: &str, timeout: Duration) -> Result<()> {
        let request = FlushRequest {
            bucket: bucket.map(str::to_string),
            prefix: prefix.to_string(),
            timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
        };
        for index in 0..self.nodes.len() {
            self.long_call(index, Opcode::Flush, &request.encode(), Some(timeout))?;
        }
        Ok(())
    }

    /// A call that may take longer than the client's timeout (the server bounds it by
    /// `server_bound`, or it is a long PREFETCH): the read timeout is lifted for it.
    fn long_call(
        &mut self,
        index: usize,
        opcode: Opcode,
        extension: &[u8],
        server_bound: Option<Duration>,
    ) -> Result<Response> {
        let timeout = self.timeout;
        let node = self.ready(index)?;
        let lifted = server_bound.map(|bound| bound + timeout);
        node.stream.set_read_timeout(lifted)?;
        let answer = node
            .call(opcode, extension, &[])
            .map_err(|error| annotate(&node.address, error));
        node.stream.set_read_timeout(Some(timeout))?;
        answer
    }

    pub fn ping(&mut self) -> Result<()> {
        for index in 0..self.nodes.len() {
            self.ready(index)?.call(Opcode::Ping, &[], &[])?;
        }
        Ok(())
    }
}

/// Split one node's items (positions into `indices`) into batches that fit the negotiated
/// extension size and item count.
fn batch_groups(items: &[GetItem], indices: &[usize], limits: &Limits) -> Vec<Vec<usize>> {
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

fn annotate(address: &str, error: ClientError) -> ClientError {
    match error {
        ClientError::Io(io_error) => ClientError::Io(io::Error::new(
            io_error.kind(),
            format!("{address}: {io_error}"),
        )),
        other => other,
    }
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
