//! The S3 REST API, on a listener of its own: a door to the same store as the native protocol
//! (one namespace, one policy, one write-back queue), so that boto3, the AWS CLI and every
//! loader built on an S3 SDK work by changing an endpoint.
//!
//! It runs on a small tokio runtime of its own (`S3_THREADS_MAX` threads), not on the shards:
//! HTTP parsing, SigV4, XML and the S3 types come from hyper and s3s, which need tokio, while
//! the shards run hydrant's io_uring executor. Every call reaches the shard that owns its key
//! through the engine's bounded inboxes (`EngineHandle`), as the native listener's forwarded
//! requests do; bodies move a chunk at a time, so no request holds a whole large object.
//!
//! - `auth`: keys from `--s3-credentials` and what each may read or write; without keys,
//!   anonymous requests from loopback only.
//! - `objects`: GET, HEAD, PUT, DELETE, COPY of objects.
//! - `plain_get`: the GETs of a whole object or a range by an anonymous loopback client (what
//!   data loaders send), answered without s3s's generic routing.
//! - `body`: a request's body as it arrives, and the checks of its checksums.
//! - `multipart`: multipart uploads, their parts staged on NVMe until the upload completes.
//! - `buckets`: the bucket operations and the listings.
//! - `errors`: the engine's errors as S3's error codes.

mod attributes;
mod auth;
mod body;
mod buckets;
mod chunked;
mod errors;
mod get;
mod multipart;
mod objects;
mod plain_get;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hydrant_engine::EngineHandle;
use hyper_util::rt::{TokioIo, TokioTimer};

pub use auth::Credentials;

/// Where the S3 endpoint listens by default.
pub const S3_LISTEN_DEFAULT: &str = "127.0.0.1:7780";
/// Threads of the gateway's runtime at most (one per core up to this).
const S3_THREADS_MAX: usize = 4;
/// Connections served at once; one more is closed as soon as it is accepted.
pub const S3_CONNECTIONS_MAX: usize = 4096;
/// Bytes of a request's line and headers at most (hyper answers 431 beyond).
const S3_HEADER_BYTES_MAX: usize = 64 << 10;
/// How long a connection may take to send a request's headers (and may stay idle between
/// requests) before it is closed.
const S3_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may send nothing before the request ends with RequestTimeout
/// (and its connection with it).
const S3_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an XML request body (DeleteObjects, CompleteMultipartUpload) at most.
const S3_XML_BYTES_MAX: usize = 4 << 20;

/// What the S3 endpoint runs with.
#[derive(Clone, Debug)]
pub struct S3Config {
    pub listen: SocketAddr,
    /// Keys and their buckets; `None`: anonymous requests, from loopback only.
    pub credentials: Option<Credentials>,
    /// Whether the server fails to start when `listen` is taken (else it says so and serves
    /// without S3): true when the address was asked for, false for the default.
    pub required: bool,
    /// The cores the gateway's threads run on, one thread per core (empty: one thread per
    /// core of the machine up to `S3_THREADS_MAX`, unpinned).
    pub cpus: Vec<usize>,
    /// Multipart uploads older than this are aborted (`None`: never).
    pub upload_expiry: Option<Duration>,
}

impl S3Config {
    /// An endpoint on `listen` with the defaults: anonymous (loopback only), required,
    /// unpinned, uploads expiring after `UPLOAD_EXPIRY_DEFAULT`.
    pub fn new(listen: SocketAddr) -> S3Config {
        S3Config {
            listen,
            credentials: None,
            required: true,
            cpus: Vec::new(),
            upload_expiry: Some(UPLOAD_EXPIRY_DEFAULT),
        }
    }
}

/// Multipart uploads are aborted this long after they began, unless configured otherwise.
pub const UPLOAD_EXPIRY_DEFAULT: Duration = Duration::from_secs(24 * 3600);

/// The S3 endpoint's counters since the start, for the metrics (one endpoint per process).
pub static S3_COUNTERS: S3Counters = S3Counters::new();

/// Requests per S3 operation, answers per status class, connections.
pub struct S3Counters {
    /// Whether an endpoint started (the metrics show S3's families only then).
    started: AtomicBool,
    operations: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Answers by status class: 2xx, 3xx, 4xx, 5xx.
    answers: [AtomicU64; 4],
    refused_connections: AtomicU64,
    connections: AtomicU64,
    /// GetObjects answered by `plain_get` (counted among `operations` too).
    plain_gets: AtomicU64,
}

/// What the metrics show of the S3 endpoint.
#[derive(Debug, Default)]
pub struct S3Snapshot {
    /// (operation, requests), by name.
    pub operations: Vec<(&'static str, u64)>,
    /// Answers with status 2xx, 3xx, 4xx and 5xx.
    pub answers: [u64; 4],
    pub connections: u64,
    pub refused_connections: u64,
    /// GetObjects answered without s3s's routing (see `plain_get`).
    pub plain_gets: u64,
}

/// The status classes of `S3Counters::answers`, as the metrics label them.
pub const S3_ANSWER_CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

impl S3Counters {
    const fn new() -> S3Counters {
        S3Counters {
            started: AtomicBool::new(false),
            operations: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            answers: [const { AtomicU64::new(0) }; 4],
            refused_connections: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            plain_gets: AtomicU64::new(0),
        }
    }

    fn count(&self, operation: &'static str) {
        let mut operations = self.operations.lock().expect("counters lock");
        *operations.entry(operation).or_insert(0) += 1;
    }

    fn count_answer(&self, status: hyper::StatusCode) {
        let class = (status.as_u16() / 100).clamp(2, 5) as usize - 2;
        self.answers[class].fetch_add(1, Ordering::Relaxed);
    }

    /// What an endpoint counted, or `None` when none started.
    pub fn snapshot(&self) -> Option<S3Snapshot> {
        if !self.started.load(Ordering::Relaxed) {
            return None;
        }
        let operations = self.operations.lock().expect("counters lock");
        Some(S3Snapshot {
            operations: operations
                .iter()
                .map(|(name, count)| (*name, *count))
                .collect(),
            answers: std::array::from_fn(|class| self.answers[class].load(Ordering::Relaxed)),
            connections: self.connections.load(Ordering::Relaxed),
            refused_connections: self.refused_connections.load(Ordering::Relaxed),
            plain_gets: self.plain_gets.load(Ordering::Relaxed),
        })
    }
}

/// Spawn one of the endpoint's tasks on its runtime: the shards it sends to are woken once per
/// turn of the thread, not once per message (`hydrant_engine::rt::batched`), so that a shard on
/// the same core does not preempt the endpoint for each request.
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(hydrant_engine::rt::batched::Batched::new(task))
}

/// A running S3 endpoint.
pub struct S3Endpoint {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl S3Endpoint {
    pub fn start(config: S3Config, engine: EngineHandle) -> Result<S3Endpoint, String> {
        let listener = std::net::TcpListener::bind(config.listen)
            .map_err(|error| format!("cannot listen for S3 on {}: {error}", config.listen))?;
        listener
            .set_nonblocking(true)
            .map_err(|error| error.to_string())?;
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        let threads = if config.cpus.is_empty() {
            std::thread::available_parallelism()
                .map_or(1, |count| count.get())
                .min(S3_THREADS_MAX)
        } else {
            config.cpus.len()
        };
        let cpus = config.cpus.clone();
        let next_cpu = Arc::new(AtomicU64::new(0));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .on_thread_start(move || {
                if !cpus.is_empty() {
                    let turn = next_cpu.fetch_add(1, Ordering::Relaxed) as usize;
                    hydrant_engine::rt::pin_current_thread(cpus[turn % cpus.len()]);
                }
            })
            .thread_name("hydrant-s3")
            // The shards' wake-ups held back by this thread's tasks (`spawn`) go before it
            // sleeps.
            .on_thread_park(hydrant_engine::rt::batched::wake_batched)
            .on_thread_stop(hydrant_engine::rt::batched::wake_batched)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|error| format!("cannot start the S3 endpoint's threads: {error}"))?;
        S3_COUNTERS.started.store(true, Ordering::Relaxed);
        let service = build_service(&config, engine.clone());
        let gateway = objects::Gateway::new(
            engine.clone(),
            config.credentials.clone(),
            config.upload_expiry,
        );
        let sweeper = config
            .upload_expiry
            .map(|expiry| objects::Gateway::new(engine, config.credentials.clone(), Some(expiry)));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let open = config.credentials.is_none();
        let accept_cpu = config.cpus.first().copied();
        let thread = std::thread::Builder::new()
            .name("hydrant-s3-accept".into())
            .spawn(move || {
                if let Some(cpu) = accept_cpu {
                    hydrant_engine::rt::pin_current_thread(cpu);
                }
                runtime.block_on(async move {
                    if let Some(sweeper) = sweeper {
                        spawn(async move { sweeper.expire_uploads_forever().await });
                    }
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => accept(listener, service, gateway, stopped, open).await,
                        Err(error) => log::error!("the S3 endpoint cannot listen: {error}"),
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|error| error.to_string())?;
        Ok(S3Endpoint {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stop accepting, and stop the connections (requests in flight are cut off; every
    /// acknowledged write is already durable).
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the S3 endpoint's thread panicked");
            }
        }
    }
}

impl Drop for S3Endpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

fn build_service(config: &S3Config, engine: EngineHandle) -> s3s::service::S3Service {
    let gateway = objects::Gateway::new(engine, config.credentials.clone(), config.upload_expiry);
    let mut builder = s3s::service::S3ServiceBuilder::new(gateway);
    let mut s3_config = s3s::config::S3Config::default();
    s3_config.xml_max_body_size = S3_XML_BYTES_MAX;
    builder.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(
        s3_config,
    ))));
    // s3s asks `Access` only when it has an auth provider: without keys, one that knows none
    // (the signatures of loopback requests are taken off before, see `prepare`), so that the
    // loopback-only rule is applied to every request.
    builder.set_auth(config.credentials.clone().unwrap_or_else(Credentials::none));
    builder.set_access(auth::Access {
        credentials: config.credentials.clone(),
    });
    builder.build()
}

/// Accept connections until `stopped`, each served on a task of its own, at most
/// `S3_CONNECTIONS_MAX` at once.
async fn accept(
    listener: tokio::net::TcpListener,
    service: s3s::service::S3Service,
    gateway: objects::Gateway,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    open: bool,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(S3_CONNECTIONS_MAX));
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    log::warn!("S3 endpoint: accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            S3_COUNTERS
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        S3_COUNTERS.connections.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let gateway = gateway.clone();
        spawn(async move {
            let handler = hyper::service::service_fn(move |request| {
                let service = service.clone();
                let gateway = gateway.clone();
                async move {
                    let request = prepare(request, peer, open);
                    let range = request.headers().get(hyper::header::RANGE).cloned();
                    let has_body = has_body(request.headers());
                    let plain = match plain_get::plain_get_of(&request, open, peer) {
                        Some(input) => plain_get::answer(&gateway, input).await,
                        None => None,
                    };
                    let mut answer = match plain {
                        Some(answer) => Ok(answer),
                        None => hyper::service::Service::call(&service, request).await,
                    };
                    if let Ok(answer) = &mut answer {
                        S3_COUNTERS.count_answer(answer.status());
                        with_object_size(answer, range);
                        // An error may be answered before the body is read (a failed
                        // condition, a refused key): what is left of the body must not be
                        // read as the next request, so the connection ends with the answer.
                        if has_body && !answer.status().is_success() {
                            answer.headers_mut().insert(
                                hyper::header::CONNECTION,
                                hyper::header::HeaderValue::from_static("close"),
                            );
                        }
                    }
                    answer
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(S3_HEADER_TIMEOUT)
                .max_buf_size(S3_HEADER_BYTES_MAX)
                .serve_connection(TokioIo::new(stream), handler);
            if let Err(error) = connection.await {
                log::debug!("S3 connection from {peer}: {error}");
            }
            drop(permit);
        });
    }
}

/// The header by which a read's InvalidRange error carries the object's size to
/// `with_object_size` (never sent to the client).
const ACTUAL_OBJECT_SIZE_HEADER: &str = "x-hydrant-actual-object-size";

/// An InvalidRange answer as S3 writes it, with the range asked for and the object's size:
/// SDKs read a 416 for a range of an empty object as the empty object only when the error says
/// its size is 0 (s3s writes only the code and the message).
fn with_object_size(answer: &mut s3s::HttpResponse, range: Option<hyper::header::HeaderValue>) {
    let Some(size) = answer.headers_mut().remove(ACTUAL_OBJECT_SIZE_HEADER) else {
        return;
    };
    let size = size.to_str().unwrap_or("0").to_string();
    let range = range
        .as_ref()
        .and_then(|range| range.to_str().ok())
        .unwrap_or_default();
    let escaped = range
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    answer.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidRange</Code><Message>The requested range is not satisfiable</Message><RangeRequested>{escaped}</RangeRequested><ActualObjectSize>{size}</ActualObjectSize></Error>"
    );
    answer.headers_mut().insert(
        hyper::header::CONTENT_LENGTH,
        hyper::header::HeaderValue::from(body.len()),
    );
    *answer.body_mut() = s3s::Body::from(body);
}

/// Whether a request says it has a body (a length above 0, or chunks).
fn has_body(headers: &hyper::HeaderMap) -> bool {
    headers.contains_key(hyper::header::TRANSFER_ENCODING)
        || headers
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok())
            .is_some_and(|length| length > 0)
}

/// The peer of a request, for the access check.
#[derive(Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

/// Note the peer; and on an endpoint without keys (`open`), take the signature off a loopback
/// request whose body is not signed in chunks, so that SDKs that always sign (with whatever
/// keys they find) are served as the anonymous loopback clients they are.
fn prepare(
    mut request: hyper::Request<hyper::body::Incoming>,
    peer: SocketAddr,
    open: bool,
) -> hyper::Request<hyper::body::Incoming> {
    request.extensions_mut().insert(Peer(peer));
    if open && peer.ip().is_loopback() && !auth::chunk_signed(request.headers()) {
        request.headers_mut().remove(hyper::header::AUTHORIZATION);
    }
    request
}
