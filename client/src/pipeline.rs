//! A pipelined batch of GET, PUT and HEAD requests: all of a node's requests are sent on one
//! connection before their answers are read, and the answers are matched to their requests by
//! request id as they come, in any order.

use std::time::Instant;

use hydrant_proto::message::{Message, ObjectInfo, PutRequest};
use hydrant_proto::Opcode;

use crate::blocking::{get_request, object_name, Inner};
use crate::connection::PipelinedRequest;
use crate::error::Result;
use crate::frames::Frame;
use crate::placement::node_for;
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

struct Queued<'a> {
    node: usize,
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
        self.requests.push(Queued { node, request });
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

    /// Send every request (one connection per node, the nodes at once) and return each one's
    /// result at its position. Requests answered with a retriable status are sent again, and a
    /// node's requests are all sent again when its connection breaks, within the client's
    /// retry bounds; the error is that of the last attempt. `Err` when a node's connection
    /// could not be used after the retries.
    pub fn run(self) -> Result<Vec<ItemResult>> {
        let nodes = self.inner.pools.len();
        let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); nodes];
        for (index, queued) in self.requests.iter().enumerate() {
            per_node[queued.node].push(index);
        }
        let mut results: Vec<Option<ItemResult>> = (0..self.requests.len()).map(|_| None).collect();
        let busy: Vec<(usize, Vec<usize>)> = per_node
            .into_iter()
            .enumerate()
            .filter(|(_, indices)| !indices.is_empty())
            .collect();
        let answers: Vec<Result<Vec<(usize, ItemResult)>>> = if busy.len() == 1 {
            vec![self.run_node(busy[0].0, &busy[0].1)]
        } else {
            let this = &self;
            std::thread::scope(|scope| {
                let workers: Vec<_> = busy
                    .iter()
                    .map(|(node, indices)| scope.spawn(move || this.run_node(*node, indices)))
                    .collect();
                workers
                    .into_iter()
                    .map(|worker| worker.join().expect("a pipeline worker does not panic"))
                    .collect()
            })
        };
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

    /// One node's requests (`indices` into `self.requests`), in rounds: each round sends what
    /// is still pending; retriable answers stay pending for the next round.
    fn run_node(&self, node: usize, indices: &[usize]) -> Result<Vec<(usize, ItemResult)>> {
        let policy = &self.inner.policy;
        let pool = &self.inner.pools[node];
        let started = Instant::now();
        let mut pending: Vec<usize> = indices.to_vec();
        let mut done = Vec::with_capacity(indices.len());
        let mut retry = 0;
        loop {
            let requests: Vec<&PipelinedRequest<'_>> = pending
                .iter()
                .map(|&index| &self.requests[index].request)
                .collect();
            let round = pool
                .take()
                .and_then(|mut connection| connection.pipeline(&requests))
                .map_err(|error| error.at(&pool.address));
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
