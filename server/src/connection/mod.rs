//! One connection, served on the shard that accepted it: a reader that decodes frames and
//! starts a task per request (at most `requests_in_flight_max` at once), and a writer that sends
//! the answers as they complete, several per send when they pile up.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hydrant_engine::buf::IoBuf;
use hydrant_engine::rt::net::SendParts;
use hydrant_engine::rt::sync::{OwnedPermit, Semaphore, WaitQueue};
use hydrant_engine::rt::time::{self, sleep};
use hydrant_engine::rt::{net, spawn};
use hydrant_engine::store::ObjectKey;
use hydrant_engine::{ByteRange, EngineHandle, ErrorKind};
use hydrant_engine::{Cache, Precondition, ReadData, Within};

use crate::metrics;

mod budget;
mod hello;
mod input;
mod output;
pub(crate) mod requests;
mod stream;

use budget::*;
use hello::*;
use hydrant_proto::message::{
    BatchGetRequest, BatchItem, FlushRequest, GetRequest, GetRequestRef, HelloRequest,
    HelloResponse, ListEntries, ListEntry, ListRequest, Message, ObjectInfo, ObjectName, PlanKeys,
    PlanRequest, PlanResult, PrefetchRequest, PrefetchResult, PutRequest, RefusedUpload,
    UploadsAnswer, UploadsRequest, LIST_ENTRIES_MAX,
};
use hydrant_proto::{
    FrameFlags, FrameHeader, Limits, Opcode, ProtoError, Status, FRAME_HEADER_BYTES,
    PROTOCOL_VERSION,
};
use input::*;
use output::*;
use requests::*;

/// Objects one PREFETCH reads from the origin at once.
const PREFETCH_READS_IN_FLIGHT: usize = 16;

/// A connection's receive buffer: the first while frames are small (so that an idle connection
/// costs little); a buffer grown above the second for a large frame is given back once used.
const RECEIVE_BYTES_MIN: usize = 4 * 1024;
const RECEIVE_BYTES: usize = 256 * 1024;
/// Most bytes of queued answers gathered into one send (one answer larger than this goes alone).
const SEND_BATCH_BYTES_MAX: usize = 1024 * 1024;
/// Most slices (headers, payload parts) gathered into one send.
const SEND_SLICES_MAX: usize = 256;
/// Bytes of object data one connection may hold for its answers, from the read until the send:
/// pipelined GETs wait for room before they read. One answer larger than this takes the whole
/// budget, so a connection holds at most this or its one largest answer.
const ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Answers up to this size are read before their room is reserved (one hop to the owning shard
/// instead of two); `requests_in_flight_max` of them bound what that adds.
const ANSWER_RESERVED_AFTER_BYTES_MAX: u64 = 64 * 1024;
/// Room reserved for an answer read through from the origin before its size is known: a
/// chunk, the most the origin's first read returns (a larger answer is sized first, then read).
const UNSIZED_ANSWER_RESERVED_BYTES: u64 = 4 * 1024 * 1024;
/// Answers queued for a connection beyond which its requests are no longer read.
const OUTBOX_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Bytes of extension and payload one frame before HELLO may carry (HELLO needs about 60); a
/// larger one closes the connection before any of it is read.
const FRAME_BYTES_BEFORE_HELLO_MAX: u64 = 4096;
/// Frames before HELLO (refused ones included) after which the connection is closed.
const FRAMES_BEFORE_HELLO_MAX: u32 = 16;
/// Items of BATCH_GETs one connection reads at once (each is a task while it runs).
const BATCH_ITEMS_IN_FLIGHT_MAX: usize = 32;
/// A connection that has not said HELLO by then is closed.
const HELLO_DEADLINE_MS: u64 = 10_000;
/// Pause after an accept error other than the listener closing (out of fds, say).
const ACCEPT_RETRY_MS: u64 = 10;

/// What every connection of a server is held to.
#[derive(Clone)]
pub(crate) struct Policy {
    pub limits: Limits,
    pub token: Option<Vec<u8>>,
    pub allow_remote_without_token: bool,
    /// A greeted connection silent for this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Each shard's own port, told in HELLO (the shard-aware path); empty when there are none.
    pub shard_ports: std::sync::Arc<[u16]>,
}

/// True when the socket's peer is on this host (127.0.0.0/8 or ::1).
fn peer_is_loopback(socket: &OwnedFd) -> bool {
    use nix::sys::socket::{getpeername, SockaddrStorage};
    let Ok(peer) = getpeername::<SockaddrStorage>(socket.as_raw_fd()) else {
        return false;
    };
    match (peer.as_sockaddr_in(), peer.as_sockaddr_in6()) {
        (Some(v4), _) => v4.ip().is_loopback(),
        (None, Some(v6)) => v6.ip().is_loopback(),
        (None, None) => false,
    }
}

fn random_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).expect("the kernel's random source is unavailable");
    nonce
}

/// Accept connections on `listener` for as long as the shard runs.
pub(crate) async fn accept_loop(
    cache: Rc<Cache>,
    engine: EngineHandle,
    listener: RawFd,
    policy: Policy,
) {
    let policy = Rc::new(policy);
    loop {
        match net::accept(listener).await {
            Ok(socket) => {
                if policy.token.is_none()
                    && !policy.allow_remote_without_token
                    && !peer_is_loopback(&socket)
                {
                    log::warn!("refused a connection from another host: no token is configured");
                    continue;
                }
                spawn(serve(cache.clone(), engine.clone(), socket, policy.clone()));
            }
            Err(error)
                if matches!(error.raw_os_error(), Some(libc::EBADF) | Some(libc::EINVAL)) =>
            {
                return
            }
            Err(error) => {
                log::warn!("shard {}: accept failed: {error}", cache.shard());
                sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
            }
        }
    }
}

struct Connection {
    /// The accepting shard's tier stack (its keys are served without a hop).
    cache: Rc<Cache>,
    engine: EngineHandle,
    policy: Rc<Policy>,
    server_nonce: [u8; 16],
    /// The limits in force: the server's until HELLO, the negotiated ones after.
    limits: Cell<Limits>,
    greeted: Cell<bool>,
    outbox: RefCell<VecDeque<OutFrame>>,
    /// Bytes queued in the outbox and not yet sent.
    outbox_bytes: Cell<usize>,
    outbox_changed: WaitQueue,
    reading_done: Cell<bool>,
    /// When bytes last arrived or an answer was last sent (for the idle timeout): every
    /// receive counts, so a large PUT that arrives slowly is not cut off mid-stream.
    last_activity: Rc<Cell<Instant>>,
    /// Requests being worked on: a permit each.
    in_flight: Rc<Semaphore>,
    /// Woken when reading is done, so that the deadline watcher stops early.
    closed: WaitQueue,
    /// Room for object bytes held by answers not yet sent.
    answer_budget: Rc<AnswerBudget>,
    /// BATCH_GET items being read, all batches of the connection together.
    batch_items: Rc<Semaphore>,
}

impl Connection {
    /// Nothing received, sent or worked on: no request running, no answer waiting.
    fn is_quiet(&self) -> bool {
        self.in_flight.available() == self.policy.limits.requests_in_flight_max as usize
            && self.outbox_bytes.get() == 0
    }

    fn queue(&self, frame: OutFrame) {
        self.outbox_bytes.set(self.outbox_bytes.get() + frame.len());
        self.outbox.borrow_mut().push_back(frame);
        self.outbox_changed.wake_all();
    }

    /// Queue an answer with a small payload (a reason, a listing), copied into the frame.
    fn answer(&self, request: &FrameHeader, status: Status, extension: &[u8], payload: &[u8]) {
        let held = (!payload.is_empty()).then(|| Rc::new(HeldBytes::owned(payload.to_vec())));
        self.answer_held(request, status, extension, held);
    }

    /// Queue the answer to `request`, its payload sent from where it lies. A payload above the
    /// negotiated limit is streamed: the first frame carries the extension, every frame but the
    /// last carries MORE, and the frames are queued together so that nothing comes between them.
    fn answer_held(
        &self,
        request: &FrameHeader,
        status: Status,
        extension: &[u8],
        payload: Option<Rc<HeldBytes>>,
    ) {
        self.answer_part(request, status, extension, payload, true);
    }

    /// Queue part of the answer to `request` (`last`: the answer's end; else its last frame
    /// carries MORE too and more parts follow), split into frames of the negotiated payload
    /// limit, the extension (if any) in the first.
    fn answer_part(
        &self,
        request: &FrameHeader,
        status: Status,
        extension: &[u8],
        payload: Option<Rc<HeldBytes>>,
        last: bool,
    ) {
        let total = payload.as_ref().map_or(0, |held| held.len());
        let part_bytes = self.limits.get().payload_bytes_max as usize;
        let parts = total.div_ceil(part_bytes).max(1);
        for index in 0..parts {
            let range = index * part_bytes..((index + 1) * part_bytes).min(total);
            let part_extension = if index == 0 { extension } else { &[][..] };
            let mut header = FrameHeader::response(request, status as u8, part_extension, &[]);
            header.payload_len = range.len() as u64;
            if let Some(held) = &payload {
                header.payload_crc = if range.is_empty() {
                    0
                } else {
                    held.crc(range.clone())
                };
            }
            if index + 1 < parts || !last {
                header.flags = header.flags.with(FrameFlags::MORE);
            }
            self.queue(out_frame(&header, part_extension, payload.clone(), range));
        }
    }
}

async fn serve(cache: Rc<Cache>, engine: EngineHandle, socket: OwnedFd, policy: Rc<Policy>) {
    let fd = socket.as_raw_fd();
    let limits = policy.limits;
    let in_flight = Rc::new(Semaphore::new(limits.requests_in_flight_max as usize));
    let connection = Rc::new(Connection {
        cache,
        engine,
        policy,
        server_nonce: random_nonce(),
        limits: Cell::new(limits),
        greeted: Cell::new(false),
        outbox: RefCell::new(VecDeque::new()),
        outbox_bytes: Cell::new(0),
        outbox_changed: WaitQueue::new(),
        reading_done: Cell::new(false),
        last_activity: Rc::new(Cell::new(Instant::now())),
        in_flight: in_flight.clone(),
        closed: WaitQueue::new(),
        answer_budget: Rc::new(AnswerBudget::new()),
        batch_items: Rc::new(Semaphore::new(BATCH_ITEMS_IN_FLIGHT_MAX)),
    });
    metrics::count(|counters| counters.connections_opened += 1);
    let writer = spawn(write_loop(connection.clone(), fd));
    spawn(watch_deadlines(connection.clone(), fd));
    let mut input = Input::new(fd, connection.last_activity.clone());
    if let Err(error) = read_loop(&connection, &mut input, &in_flight).await {
        log::debug!("connection closed: {error}");
    }
    // A multishot receive still armed is cancelled (the socket closes only once it is gone).
    drop(input);
    // Let the requests in flight finish, then the writer flush their answers.
    for _ in 0..limits.requests_in_flight_max {
        std::mem::forget(in_flight.acquire().await);
    }
    connection.reading_done.set(true);
    connection.outbox_changed.wake_all();
    connection.closed.wake_all();
    writer.await;
    drop(socket);
    metrics::count(|counters| counters.connections_closed += 1);
}

/// Close a connection that has not said HELLO in time, or that said it and then went quiet for
/// the idle timeout (either would hold an fd and buffers forever). Returns once reading is done.
async fn watch_deadlines(connection: Rc<Connection>, socket: RawFd) {
    let opened = Instant::now();
    let hello_deadline = opened + Duration::from_millis(HELLO_DEADLINE_MS);
    let idle_timeout = connection.policy.idle_timeout;
    loop {
        if connection.reading_done.get() {
            return;
        }
        let now = Instant::now();
        let wake_at = if !connection.greeted.get() {
            if now >= hello_deadline {
                break;
            }
            // Look again after the idle timeout too: HELLO may come in between.
            idle_timeout.map_or(hello_deadline, |idle| hello_deadline.min(now + idle))
        } else {
            let Some(idle) = idle_timeout else { return };
            let quiet_until = connection.last_activity.get() + idle;
            if now >= quiet_until && connection.is_quiet() {
                break;
            }
            // Busy connections are looked at again one timeout later.
            quiet_until.max(now + idle.min(Duration::from_secs(1)))
        };
        sleep_or_wake(wake_at - now, &connection.closed).await;
    }
    // While reading is not done, `serve` still owns the socket, so the fd is this connection's.
    // Shutting down both directions ends the pending receive (the reader sees a clean close)
    // and tells the peer at once; nothing is waiting to be sent when the connection is quiet.
    if !connection.reading_done.get() {
        log::debug!("closing a connection that went quiet or never said HELLO");
        metrics::count(|counters| counters.connections_timed_out += 1);
        // The socket fd is this connection's still (see above).
        let _ = nix::sys::socket::shutdown(socket, nix::sys::socket::Shutdown::Both);
    }
}

/// Sleep for `duration`, or less if `queue` is woken first.
async fn sleep_or_wake(duration: Duration, queue: &WaitQueue) {
    let mut timer = std::pin::pin!(sleep(duration));
    let mut woken = std::pin::pin!(queue.wait());
    std::future::poll_fn(|context| {
        if timer.as_mut().poll(context).is_ready() || woken.as_mut().poll(context).is_ready() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Decode frames until the peer closes or sends something that breaks the stream.
async fn read_loop(
    connection: &Rc<Connection>,
    input: &mut Input,
    in_flight: &Rc<Semaphore>,
) -> Result<(), String> {
    let mut frames_before_hello = 0;
    loop {
        // Back-pressure: a peer that does not read its answers stops being read.
        while connection.outbox_bytes.get() > OUTBOX_BYTES_MAX {
            connection.outbox_changed.wait().await;
        }
        if !input
            .fill(FRAME_HEADER_BYTES)
            .await
            .map_err(|error| error.to_string())?
        {
            return Ok(());
        }
        connection.last_activity.set(time::now_coarse());
        let header_bytes: [u8; FRAME_HEADER_BYTES] = input
            .take_filled(FRAME_HEADER_BYTES)
            .try_into()
            .expect("a header's bytes");
        let decoded = FrameHeader::decode(&header_bytes, &connection.limits.get());
        if !connection.greeted.get() {
            // Before HELLO every frame counts, whatever is wrong with it, and none may carry
            // more than a HELLO needs: nothing is buffered for a peer that has not said who it
            // is beyond that.
            frames_before_hello += 1;
            if frames_before_hello > FRAMES_BEFORE_HELLO_MAX {
                return Err("closing the connection: too many frames before HELLO".into());
            }
            let announced = FrameHeader::salvage(&header_bytes)
                .map(|(_, extension, payload)| extension as u64 + payload);
            // A streamed request's later frames would be read before its refusal.
            let streamed = decoded
                .as_ref()
                .is_ok_and(|header| header.flags.contains(FrameFlags::MORE));
            if streamed || announced.is_some_and(|bytes| bytes > FRAME_BYTES_BEFORE_HELLO_MAX) {
                if let Ok(header) = &decoded {
                    let message = format!(
                        "send HELLO first; a frame before it carries at most {FRAME_BYTES_BEFORE_HELLO_MAX} bytes and is not streamed"
                    );
                    connection.answer(header, Status::Unauthenticated, &[], message.as_bytes());
                }
                return Err("closing the connection: a large frame before HELLO".into());
            }
        }
        let header = match decoded {
            Ok(header) => header,
            Err(error) => {
                refuse_header(connection, input, &header_bytes, error).await?;
                continue;
            }
        };
        if header.flags.contains(FrameFlags::MORE) {
            // A streamed request: its payload is taken as it arrives, never whole.
            stream::stream_in(connection, input, header, in_flight).await?;
            continue;
        }
        // The body is used where it was received (the decoder checked its lengths against the
        // limits); it stays there until the next frame is read.
        let extension_len = header.extension_len as usize;
        let body = input
            .take(extension_len + header.payload_len as usize)
            .await?;
        let (extension, payload) = body.split_at(extension_len);
        let mut refusal: Option<(Status, String)> = None;
        if let Err(error) = header.check_body(extension, payload) {
            refusal = Some((Status::for_error(&error), error.to_string()));
        } else if header.opcode != Opcode::Hello && !connection.greeted.get() {
            refusal = Some((Status::Unauthenticated, "send HELLO first".into()));
        }
        let (header, extension, payload) = {
            if let Some((status, message)) = refusal {
                connection.answer(&header, status, &[], message.as_bytes());
                continue;
            }
            if header.opcode == Opcode::Hello {
                if !hello(connection, &header, extension) {
                    return Err("closing the connection after a wrong token proof".into());
                }
                continue;
            }
            if header.opcode == Opcode::Get
                && answer_from_memory(connection, &header, extension, payload.len())
            {
                continue;
            }
            (header, extension.to_vec(), payload.to_vec())
        };
        let permit = in_flight.acquire_owned().await;
        spawn(request(
            connection.clone(),
            header,
            extension,
            payload,
            permit,
        ));
    }
}

/// A header that did not decode. If its checksum holds (an unknown opcode, say), answer it,
/// skip what it announced and go on; otherwise the stream cannot be trusted: answer if there is
/// a request id to answer, then close.
async fn refuse_header(
    connection: &Rc<Connection>,
    input: &mut Input,
    bytes: &[u8],
    error: ProtoError,
) -> Result<(), String> {
    let salvaged = FrameHeader::salvage(bytes);
    if let Some((request_id, _, _)) = salvaged {
        // The opcode may be the unknown part: answer as PING, the one opcode every version has.
        let request = FrameHeader::new(Opcode::Ping, request_id, &[], 0, 0);
        connection.answer(
            &request,
            Status::for_error(&error),
            &[],
            error.to_string().as_bytes(),
        );
    }
    match salvaged {
        Some((_, extension_len, payload_len)) if !error.is_fatal_to_connection() => {
            input
                .take(extension_len as usize + payload_len as usize)
                .await?;
            Ok(())
        }
        _ => Err(format!("closing the connection: {error}")),
    }
}
