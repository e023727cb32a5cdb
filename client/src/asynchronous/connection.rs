//! One async connection carrying many requests at once: callers write their requests' frames
//! (one request's frames together, under the writer lock) and a background task reads every
//! answer frame and hands it to the request with its id, so answers complete in any order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hydrant_proto::message::{HelloResponse, Message};
use hydrant_proto::{FrameFlags, FrameHeader, Limits, Opcode, FRAME_HEADER_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::error::{ClientError, Result};
use crate::frames::{hello, random_nonce, request_frames, Frame};

/// Bytes the background reader buffers from the socket, so that small answers take one read.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What HELLO told of the server's shards, when it offers a port per shard.
#[derive(Clone, Debug)]
pub(crate) struct ShardMap {
    pub(crate) placement_hash: u32,
    pub(crate) ports: Vec<u16>,
    /// The address this connection reached (a name may resolve to several).
    pub(crate) peer: Option<std::net::SocketAddr>,
}

pub(crate) struct AsyncConnection {
    pub(crate) limits: Limits,
    /// `None` when the server offers no shard ports (or has one shard: no hop to skip).
    pub(crate) shard_map: Option<ShardMap>,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Arc<Waiting>,
    next_request_id: std::sync::atomic::AtomicU64,
    /// One permit per request in flight, at most the negotiated `requests_in_flight_max`.
    credits: Arc<Semaphore>,
    reader: JoinHandle<()>,
    request_timeout: Duration,
}

/// The requests waiting for answers, shared with the background reader.
struct Waiting {
    state: Mutex<WaitingState>,
}

struct WaitingState {
    senders: HashMap<u64, mpsc::UnboundedSender<Frame>>,
    /// Why the connection can no longer be used, once it cannot.
    broken: Option<String>,
}

impl Waiting {
    fn lock(&self) -> MutexGuard<'_, WaitingState> {
        // The state only has values moved in and out under the lock: still consistent after
        // a panic elsewhere.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Mark the connection broken: every request waiting on it sees its answer channel close.
    fn fail(&self, reason: String) {
        let mut state = self.lock();
        state.broken.get_or_insert(reason);
        state.senders.clear();
    }
}

/// A request's answer frames as they arrive; dropping it gives up on the rest.
pub(crate) struct Answer {
    request_id: u64,
    frames: mpsc::UnboundedReceiver<Frame>,
    waiting: Arc<Waiting>,
    timeout: Option<Duration>,
    _credit: OwnedSemaphorePermit,
}

impl Answer {
    /// The next frame of the answer, waiting at most the request timeout for it.
    pub(crate) async fn next(&mut self) -> Result<Frame> {
        let received = match self.timeout {
            Some(timeout) => tokio::time::timeout(timeout, self.frames.recv())
                .await
                .map_err(|_| {
                    ClientError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {timeout:?}"),
                    ))
                })?,
            None => self.frames.recv().await,
        };
        received.ok_or_else(|| {
            let reason = self.waiting.lock().broken.clone().unwrap_or_default();
            ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("the connection closed before the answer: {reason}"),
            ))
        })
    }

    /// The whole answer, a streamed payload put back together; an error status is an error.
    pub(crate) async fn whole(mut self) -> Result<Frame> {
        let mut answer = self.next().await?;
        while answer.header.flags.contains(FrameFlags::MORE) {
            let next = self.next().await?;
            if next.header.status != 0 {
                return Err(ClientError::from_answer(next.header.status, &next.payload));
            }
            answer.payload.extend_from_slice(&next.payload);
            answer.header.flags = next.header.flags;
        }
        if answer.header.status != 0 {
            return Err(ClientError::from_answer(
                answer.header.status,
                &answer.payload,
            ));
        }
        Ok(answer)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        // Frames still on their way for this request are dropped by the reader.
        self.waiting.lock().senders.remove(&self.request_id);
    }
}

impl AsyncConnection {
    /// Connect to `address`, say HELLO (with the proof of `token` when asked), and start the
    /// background reader.
    pub(crate) async fn open(
        address: &str,
        token: Option<&[u8]>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<AsyncConnection> {
        let greeting = tokio::time::timeout(connect_timeout, async {
            let mut stream = TcpStream::connect(address).await?;
            stream.set_nodelay(true)?;
            let greeting = greet(&mut stream, address, token).await?;
            Ok::<_, ClientError>((stream, greeting))
        })
        .await
        .map_err(|_| {
            ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection and HELLO within {connect_timeout:?}"),
            ))
        })?;
        let (stream, greeting) = greeting?;
        let limits = greeting.limits;
        let shard_map = (greeting.shard_count > 1
            && greeting.shard_ports.len() == greeting.shard_count as usize)
            .then(|| ShardMap {
                placement_hash: greeting.placement_hash,
                ports: greeting.shard_ports.clone(),
                peer: stream.peer_addr().ok(),
            });
        let (read_half, write_half) = stream.into_split();
        let waiting = Arc::new(Waiting {
            state: Mutex::new(WaitingState {
                senders: HashMap::new(),
                broken: None,
            }),
        });
        let reader = tokio::spawn(read_answers(
            BufReader::with_capacity(READ_BUFFER_BYTES, read_half),
            waiting.clone(),
            limits,
        ));
        Ok(AsyncConnection {
            limits,
            shard_map,
            writer: tokio::sync::Mutex::new(write_half),
            waiting,
            next_request_id: std::sync::atomic::AtomicU64::new(1),
            credits: Arc::new(Semaphore::new(
                (limits.requests_in_flight_max as usize).max(1),
            )),
            reader,
            request_timeout,
        })
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.waiting.lock().broken.is_some()
    }

    /// Requests sent on this connection and not yet fully answered or given up.
    pub(crate) fn in_flight(&self) -> usize {
        (self.limits.requests_in_flight_max as usize).max(1) - self.credits.available_permits()
    }

    /// Send a request and return its answer to come. `answer_timeout` replaces the request
    /// timeout for calls the server bounds itself (`Some(None)`: wait without end).
    pub(crate) async fn send(
        &self,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        flags: FrameFlags,
        answer_timeout: Option<Option<Duration>>,
    ) -> Result<Answer> {
        let credit = self
            .credits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let request_id = self
            .next_request_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (sender, frames) = mpsc::unbounded_channel();
        {
            let mut state = self.waiting.lock();
            if let Some(reason) = &state.broken {
                return Err(ClientError::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    reason.clone(),
                )));
            }
            state.senders.insert(request_id, sender);
        }
        let answer = Answer {
            request_id,
            frames,
            waiting: self.waiting.clone(),
            timeout: answer_timeout.unwrap_or(Some(self.request_timeout)),
            _credit: credit,
        };
        let mut writer = self.writer.lock().await;
        // A caller that gives up in the middle of a write would leave half a frame on the
        // stream: the connection is then marked broken (by the guard) instead.
        let mut guard = BreakUnlessFinished {
            waiting: &self.waiting,
            finished: false,
        };
        // Each frame (at most the negotiated payload limit) must be taken by the socket within
        // the request timeout, as each answer frame must arrive within it.
        let written = async {
            for frame in request_frames(opcode, request_id, extension, payload, &self.limits, flags)
            {
                tokio::time::timeout(self.request_timeout, async {
                    writer.write_all(&frame.head).await?;
                    writer.write_all(&payload[frame.payload]).await
                })
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the server took no frame within the request timeout",
                    ))
                })?;
            }
            Ok::<_, std::io::Error>(())
        }
        .await;
        match written {
            Ok(()) => {
                guard.finished = true;
                Ok(answer)
            }
            Err(error) => {
                let _ = writer.shutdown().await;
                Err(ClientError::Io(error))
            }
        }
    }
}

impl Drop for AsyncConnection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

struct BreakUnlessFinished<'a> {
    waiting: &'a Waiting,
    finished: bool,
}

impl Drop for BreakUnlessFinished<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.waiting
                .fail("a request was cut off while being sent".into());
        }
    }
}

/// The background reader: every answer frame to its request, until the connection fails.
async fn read_answers<R: AsyncRead + Unpin>(mut reader: R, waiting: Arc<Waiting>, limits: Limits) {
    let reason = loop {
        let frame = match read_frame(&mut reader, &limits).await {
            Ok(frame) => frame,
            Err(error) => break error.to_string(),
        };
        let request_id = frame.header.request_id;
        let last = !frame.header.flags.contains(FrameFlags::MORE);
        let mut state = waiting.lock();
        // An answer to a request given up on (timed out, or its caller went away) is dropped.
        if let Some(sender) = state.senders.get(&request_id) {
            let _ = sender.send(frame);
            if last {
                state.senders.remove(&request_id);
            }
        }
    };
    waiting.fail(reason);
}

async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, limits: &Limits) -> Result<Frame> {
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header_bytes).await?;
    let header = FrameHeader::decode(&header_bytes, limits)?;
    let mut extension = vec![0; header.extension_len as usize];
    reader.read_exact(&mut extension).await?;
    let mut payload = vec![0; header.payload_len as usize];
    reader.read_exact(&mut payload).await?;
    header.check_body(&extension, &payload)?;
    Ok(Frame {
        header,
        extension,
        payload,
    })
}

/// HELLO, and HELLO again with the proof of `token` when the server asks for it; returns the
/// server's answer (the negotiated limits, its shards).
async fn greet(
    stream: &mut TcpStream,
    address: &str,
    token: Option<&[u8]>,
) -> Result<HelloResponse> {
    let client_nonce = random_nonce();
    let mut greeting = hello_exchange(stream, 1, &hello(client_nonce, None)).await?;
    if greeting.auth_required {
        let token = token.ok_or_else(|| {
            ClientError::Usage(format!("{address} asks for a token (set HYDRANT_TOKEN)"))
        })?;
        let proof = hydrant_proto::auth::proof(token, &greeting.server_nonce, &client_nonce);
        greeting = hello_exchange(stream, 2, &hello(client_nonce, Some(proof))).await?;
    }
    Ok(greeting)
}

async fn hello_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    request_id: u64,
    extension: &[u8],
) -> Result<HelloResponse> {
    let limits = Limits::default();
    for frame in request_frames(
        Opcode::Hello,
        request_id,
        extension,
        &[],
        &limits,
        FrameFlags::empty(),
    ) {
        stream.write_all(&frame.head).await?;
    }
    let answer = read_frame(stream, &limits).await?;
    if answer.header.status != 0 {
        return Err(ClientError::from_answer(
            answer.header.status,
            &answer.payload,
        ));
    }
    Ok(HelloResponse::decode(&answer.extension)?)
}
