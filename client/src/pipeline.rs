//! A pipelined batch of GET, PUT and HEAD requests: all of a node's requests are sent on one
//! connection before their answers are read, and the answers are matched to their requests by
//! request id as they come, in any order.

use std::time::Instant;

use hydrant_proto::message::{Message, ObjectInfo, PutRequest};
use hydrant_proto::Opcode;

use crate::connection::PipelinedRequest;
use crate::error::Result;
use crate::frames::Frame;
use crate::nodes::{get_request, object_name, run_bounded, Inner, GROUP_WORKERS_MAX};
use crate::placement::node_for;
use crate::pool::NodePool;
use crate::ItemResult;

/// Requests gathered to be sent together: add them, then [`Pipeline::run`].
///
/// ```no_run
/// # fn example(client: &hydrant_client::SharedClient) -> hydrant_client::Result<()> {
/// let mut pipeline = client.pipeline();
/// let first = pipeline.get("data", "a", None);
/// let second = pipeline.put("data", "b", b"bytes");
/// let results = pipeline.run()?;
/// let (info, bytes) = results[first].as_ref().unwrap();
/// # Ok(()) }
/// ```
pub struct Pipeline<'a> {
    inner: &'a Inner,
    requests: Vec<Queued<'a>>,
}

/// The requests sent on one connection: a node, and the shard of that node that owns them all
/// (`None` when the node offers no shard ports).
type Group = (usize, Option<usize>);

struct Queued<'a> {
    node: usize,
    bucket: String,
    key: String,
    request: PipelinedRequest<'a>,
}

impl<'a> Pipeline<'a> {
    pub(crate) fn new(inner: &'a Inner) -> Pipeline<'a> {
        Pipeline {
            inner,
            requests: Vec::new(),
        }
    }

    fn push(&mut self, bucket: &str, key: &str, request: PipelinedRequest<'a>) -> usize {
        let node = node_for(&self.inner.addresses, bucket, key);
        self.requests.push(Queued {
            node,
            bucket: bucket.to_string(),
            key: key.to_string(),
            request,
        });
        self.requests.len() - 1
    }

    /// Add a GET (whole, or `start..end`); returns its position in `run`'s results, whose
    /// item is the object's info and bytes.
    pub fn get(&mut self, bucket: &str, key: &str, range: Option<(u64, Option<u64>)>) -> usize {
        let request = PipelinedRequest {
            opcode: Opcode::Get,
            extension: get_request(bucket, key, range).encode(),
            payload: &[],
        };
        self.push(bucket, key, request)
    }

    /// Add a PUT of `data` (sent from it, uncopied); its item is the stored version's info and
    /// no bytes.
    pub fn put(&mut self, bucket: &str, key: &str, data: &'a [u8]) -> usize {
        let extension = PutRequest {
            name: object_name(bucket, key),
            object_bytes: data.len() as u64,
        }
        .encode();
        let request = PipelinedRequest {
            opcode: Opcode::Put,
            extension,
            payload: data,
        };
        self.push(bucket, key, request)
    }

    /// Add a HEAD; its item is the object's info and no bytes.
    pub fn head(&mut self, bucket: &str, key: &str) -> usize {
        let request = PipelinedRequest {
            opcode: Opcode::Head,
            extension: object_name(bucket, key).encode(),
            payload: &[],
        };
        self.push(bucket, key, request)
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Send every request (one connection per node, or per shard of a node that offers the
    /// shard-aware path, all at once) and return each one's result at its position. Requests
    /// answered with a retriable status are sent again, and a group's requests are all sent
    /// again when its connection breaks (then on the node's own port), within the client's
    /// retry bounds; the error is that of the last attempt. `Err` when a node's connection
    /// could not be used after the retries.
    pub fn run(self) -> Result<Vec<ItemResult>> {
        let shards: Vec<_> = self
            .inner
            .pools
            .iter()
            .map(|pool| pool.shard_pools())
            .collect();
        let mut groups: std::collections::BTreeMap<Group, Vec<usize>> =
            std::collections::BTreeMap::new();
        for (index, queued) in self.requests.iter().enumerate() {
            let shard = shards[queued.node]
                .as_ref()
                .and_then(|shards| shards.shard_for(&queued.bucket, &queued.key));
            groups.entry((queued.node, shard)).or_default().push(index);
        }
        let mut results: Vec<Option<ItemResult>> = (0..self.requests.len()).map(|_| None).collect();
        let busy: Vec<(Group, Vec<usize>)> = groups.into_iter().collect();
        let run_group = |(node, shard): Group, indices: &[usize]| {
            let shard_pool = shard.and_then(|shard| shards[node].as_ref()?.pool(shard));
            self.run_node(node, shard_pool, indices)
        };
        let answers = run_bounded(&busy, GROUP_WORKERS_MAX, |(group, indices)| {
            run_group(*group, indices)
        });
        for node_answers in answers {
            for (index, result) in node_answers? {
                results[index] = Some(result);
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every request was answered"))
            .collect())
    }

    /// One node's requests (`indices` into `self.requests`), on the port of `shard` (the pool
    /// of the shard that owns them all) when given, in rounds: each round sends what is still
    /// pending; retriable answers stay pending for the next round.
    fn run_node(
        &self,
        node: usize,
        mut shard: Option<&NodePool>,
        indices: &[usize],
    ) -> Result<Vec<(usize, ItemResult)>> {
        let policy = &self.inner.policy;
        let pool = &self.inner.pools[node];
        let started = Instant::now();
        let mut pending: Vec<usize> = indices.to_vec();
        let mut done = Vec::with_capacity(indices.len());
        let mut retry = 0;
        loop {
            if shard.is_some() && pool.shard_pools().is_none() {
                // A shard port was unreachable (or a shard connection broke) since: the node's
                // port for what is left.
                shard = None;
            }
            let requests: Vec<&PipelinedRequest<'_>> = pending
                .iter()
                .map(|&index| &self.requests[index].request)
                .collect();
            let round = pool.take_for_shard(shard).and_then(|mut connection| {
                let address = connection.pool_address().to_string();
                let answers = connection.pipeline(&requests);
                if answers.is_err() && connection.broken && shard.is_some() {
                    // The server may have restarted on new ports: the node's port from now on.
                    pool.forget_shards();
                    shard = None;
                }
                answers.map_err(|error| error.at(&address))
            });
            let answers = match round {
                Ok(answers) => answers,
                Err(error) => match policy.wait_before(retry, started, &error) {
                    Some(wait) => {
                        self.pause(wait, &mut retry);
                        continue;
                    }
                    None => return Err(error),
                },
            };
            let mut still_pending = Vec::new();
            let mut wait = None;
            for (index, answer) in pending.iter().copied().zip(answers) {
                match answer {
                    Err(error) => match policy.wait_before(retry, started, &error) {
                        Some(this_wait) => {
                            wait = Some(this_wait);
                            still_pending.push(index);
                        }
                        None => done.push((index, Err(error))),
                    },
                    Ok(frame) => done.push((index, self.item(index, frame))),
                }
            }
            let Some(wait) = wait else {
                return Ok(done);
            };
            pending = still_pending;
            self.pause(wait, &mut retry);
        }
    }

    fn pause(&self, wait: std::time::Duration, retry: &mut u32) {
        std::thread::sleep(wait);
        *retry += 1;
        self.inner
            .retries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A successful answer as an item: GET's bytes with its info; PUT's and HEAD's info.
    fn item(&self, index: usize, frame: Frame) -> ItemResult {
        let info = ObjectInfo::decode(&frame.extension)?;
        match self.requests[index].request.opcode {
            Opcode::Get => Ok((info, frame.payload)),
            _ => Ok((info, Vec::new())),
        }
    }
}
