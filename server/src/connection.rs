//! One connection, served on the shard that accepted it: a reader that decodes frames and
//! starts a task per request (at most `requests_in_flight_max` at once), and a writer that sends
//! the answers as they complete, several per send when they pile up.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hydrant_engine::buf::IoBuf;
use hydrant_engine::rt::net::SendParts;
use hydrant_engine::rt::sync::{OwnedPermit, Semaphore, WaitQueue};
use hydrant_engine::rt::time::{self, sleep};
use hydrant_engine::rt::{net, spawn};
use hydrant_engine::store::ObjectKey;
use hydrant_engine::{ByteRange, EngineHandle, ErrorKind};
use hydrant_engine::{Cache, ReadData};

use crate::metrics;
use hydrant_proto::message::{
    BatchGetRequest, BatchItem, FlushRequest, GetRequest, GetRequestRef, HelloRequest,
    HelloResponse, ListEntries, ListEntry, ListRequest, Message, ObjectInfo, ObjectName,
    PrefetchRequest, PrefetchResult, PutRequest, LIST_ENTRIES_MAX,
};
use hydrant_proto::{
    payload_crc, FrameFlags, FrameHeader, Limits, Opcode, ProtoError, Status, FRAME_HEADER_BYTES,
    PROTOCOL_VERSION,
};

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
/// Answers queued for a connection beyond which its requests are no longer read.
const OUTBOX_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Requests refused before HELLO after which the connection is closed.
const FRAMES_BEFORE_HELLO_MAX: u32 = 16;
/// Items of one BATCH_GET read at once.
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
    // SAFETY: the fd stays owned by `socket`; ManuallyDrop keeps the stream from closing it.
    let stream = std::mem::ManuallyDrop::new(unsafe {
        std::net::TcpStream::from_raw_fd(socket.as_raw_fd())
    });
    stream.peer_addr().is_ok_and(|peer| peer.ip().is_loopback())
}

fn random_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into the array.
    let filled = unsafe { libc::getrandom(nonce.as_mut_ptr().cast(), nonce.len(), 0) };
    assert_eq!(filled, 16, "the kernel's random source is unavailable");
    nonce
}

/// Accept connections on `listener` for as long as the shard runs.
pub(crate) async fn accept_loop(
    store: Rc<Cache>,
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
                spawn(serve(store.clone(), engine.clone(), socket, policy.clone()));
            }
            Err(error)
                if matches!(error.raw_os_error(), Some(libc::EBADF) | Some(libc::EINVAL)) =>
            {
                return
            }
            Err(error) => {
                log::warn!("shard {}: accept failed: {error}", store.shard());
                sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
            }
        }
    }
}

struct Connection {
    store: Rc<Cache>,
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
}

/// Room for the object bytes a connection's answers hold, handed out in the order asked (so a
/// large answer is not overtaken forever by small ones).
struct AnswerBudget {
    available: Cell<usize>,
    /// Tickets of the reservations waiting, oldest first.
    waiting: RefCell<VecDeque<u64>>,
    next_ticket: Cell<u64>,
    changed: WaitQueue,
}

/// Room reserved in an `AnswerBudget`, given back when dropped (once the answer is sent).
struct Reservation {
    budget: Rc<AnswerBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let budget = &self.budget;
        budget.available.set(budget.available.get() + self.bytes);
        assert!(budget.available.get() <= ANSWER_BYTES_MAX);
        budget.changed.wake_all();
    }
}

/// A place in an `AnswerBudget`'s queue; leaving the queue without room (the task was dropped)
/// lets the next one in.
struct Ticket<'a> {
    budget: &'a AnswerBudget,
    number: u64,
    served: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.budget
                .waiting
                .borrow_mut()
                .retain(|&number| number != self.number);
            self.budget.changed.wake_all();
        }
    }
}

impl AnswerBudget {
    fn new() -> AnswerBudget {
        AnswerBudget {
            available: Cell::new(ANSWER_BYTES_MAX),
            waiting: RefCell::new(VecDeque::new()),
            next_ticket: Cell::new(0),
            changed: WaitQueue::new(),
        }
    }

    /// Room for `bytes` now, if nobody waits before and there is room; else `None`.
    fn try_reserve(self: &Rc<Self>, bytes: usize) -> Option<Reservation> {
        let bytes = bytes.min(ANSWER_BYTES_MAX);
        if !self.waiting.borrow().is_empty() || self.available.get() < bytes {
            return None;
        }
        self.available.set(self.available.get() - bytes);
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    /// Room for `bytes` (at most the whole budget), after every reservation asked before.
    async fn reserve(self: &Rc<Self>, bytes: usize) -> Reservation {
        let bytes = bytes.min(ANSWER_BYTES_MAX);
        let mut ticket = Ticket {
            budget: self,
            number: self.next_ticket.get(),
            served: false,
        };
        self.next_ticket.set(ticket.number + 1);
        self.waiting.borrow_mut().push_back(ticket.number);
        while self.waiting.borrow().front() != Some(&ticket.number) || self.available.get() < bytes
        {
            self.changed.wait().await;
        }
        self.waiting.borrow_mut().pop_front();
        ticket.served = true;
        self.available.set(self.available.get() - bytes);
        // The next in line may fit too.
        self.changed.wake_all();
        Reservation {
            budget: self.clone(),
            bytes,
        }
    }
}

/// Bytes an answer carries, held until every frame that carries them is sent.
struct HeldBytes {
    body: Body,
    _reservation: Option<Reservation>,
}

enum Body {
    /// Where the read left them: the DRAM tier's copy or the shard's pinned buffers.
    Read(ReadData),
    Owned(Vec<u8>),
}

impl HeldBytes {
    fn owned(bytes: Vec<u8>) -> HeldBytes {
        HeldBytes {
            body: Body::Owned(bytes),
            _reservation: None,
        }
    }

    fn len(&self) -> usize {
        match &self.body {
            Body::Read(data) => data.len(),
            Body::Owned(bytes) => bytes.len(),
        }
    }

    /// Each slice of the bytes of `range`, in order.
    fn for_each_slice(&self, range: std::ops::Range<usize>, mut visit: impl FnMut(&[u8])) {
        let mut offset = 0;
        let mut part = |part: &[u8]| {
            let (part_start, part_end) = (offset, offset + part.len());
            offset = part_end;
            let start = range.start.max(part_start);
            let end = range.end.min(part_end);
            if start < end {
                visit(&part[start - part_start..end - part_start]);
            }
        };
        match &self.body {
            Body::Read(data) => data.for_each_part(part),
            Body::Owned(bytes) => part(bytes),
        }
    }

    /// The CRC32C of `range`: for the whole of a read, what the engine knows of it (the DRAM
    /// tier keeps its objects' CRCs, NVMe reads join their checked pieces' CRCs); else read.
    fn crc(&self, range: std::ops::Range<usize>) -> u32 {
        if let Body::Read(data) = &self.body {
            if range == (0..data.len()) {
                return data.crc();
            }
        }
        let mut crc = 0;
        self.for_each_slice(range, |slice| {
            crc = hydrant_proto::crc::crc32c_append(crc, slice)
        });
        crc
    }
}

/// One answer frame waiting to be sent: its header and extension, then its payload where it
/// lies.
struct OutFrame {
    head: Head,
    payload: Option<(Rc<HeldBytes>, std::ops::Range<usize>)>,
}

impl OutFrame {
    fn len(&self) -> usize {
        self.head.as_slice().len() + self.payload.as_ref().map_or(0, |(_, range)| range.len())
    }

    fn slice_count(&self) -> usize {
        let mut count = 1;
        if let Some((held, range)) = &self.payload {
            held.for_each_slice(range.clone(), |_| count += 1);
        }
        count
    }
}

/// Answer frames sent together.
struct SendBatch {
    frames: Vec<OutFrame>,
}

// SAFETY: every slice lies on the heap, owned or shared by a frame of the batch and never
// changed while it is held: a head lies in its frame, inside the batch's Vec (whose buffer
// neither moves nor changes while the batch is held), or in a Vec of its own; payloads are
// Vecs, the DRAM tier's Rc<[u8]> (never written after it is filled) or the shard's read buffers
// (owned by the ReadData).
unsafe impl SendParts for SendBatch {
    fn for_each_part(&self, visit: &mut dyn FnMut(&[u8])) {
        for frame in &self.frames {
            visit(frame.head.as_slice());
            if let Some((held, range)) = &frame.payload {
                held.for_each_slice(range.clone(), &mut *visit);
            }
        }
    }
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
            if index + 1 < parts {
                header.flags = header.flags.with(FrameFlags::MORE);
            }
            self.queue(out_frame(&header, part_extension, payload.clone(), range));
        }
    }
}

/// Bytes of header and extension a frame holds in itself (GET's answer: 48 + 25); a longer
/// head (HELLO's answer, say) has a Vec of its own.
const HEAD_INLINE_BYTES: usize = 80;

/// A frame's header and extension, as sent.
enum Head {
    Inline([u8; HEAD_INLINE_BYTES], u8),
    Heap(Vec<u8>),
}

impl Head {
    fn new(header: &FrameHeader, extension: &[u8]) -> Head {
        let len = FRAME_HEADER_BYTES + extension.len();
        if len <= HEAD_INLINE_BYTES {
            let mut bytes = [0u8; HEAD_INLINE_BYTES];
            bytes[..FRAME_HEADER_BYTES].copy_from_slice(&header.encode());
            bytes[FRAME_HEADER_BYTES..len].copy_from_slice(extension);
            Head::Inline(bytes, len as u8)
        } else {
            let mut bytes = Vec::with_capacity(len);
            bytes.extend_from_slice(&header.encode());
            bytes.extend_from_slice(extension);
            Head::Heap(bytes)
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Head::Inline(bytes, len) => &bytes[..usize::from(*len)],
            Head::Heap(bytes) => bytes,
        }
    }
}

fn out_frame(
    header: &FrameHeader,
    extension: &[u8],
    payload: Option<Rc<HeldBytes>>,
    range: std::ops::Range<usize>,
) -> OutFrame {
    let head = Head::new(header, extension);
    OutFrame {
        head,
        payload: payload
            .filter(|_| !range.is_empty())
            .map(|held| (held, range)),
    }
}

/// Bytes received and not yet consumed, in one buffer: the bytes `start..len` of `buf`. It
/// holds at least `RECEIVE_BYTES_MIN`, grows to hold the frame being read (bounded by the
/// negotiated limits), and shrinks back once a large frame is used.
///
/// While the connection waits for small frames, a multishot receive stays armed on its socket
/// (`net::RecvStream`): the kernel puts arriving bytes in the shard's provided buffers and they
/// are copied here, with no submission per request. A frame that still misses more than
/// `STREAM_BYTES_MAX` is received with plain receives straight into this buffer, and so is
/// the rest of a frame during which a stream ended without the peer closing (no provided buffer
/// was free, or the connection left too many unread).
struct Input {
    socket: RawFd,
    /// The connection's last activity, set by every receive that brings bytes.
    last_activity: Rc<Cell<Instant>>,
    /// `None` only while a plain receive holds it.
    buf: Option<IoBuf>,
    start: usize,
    /// The armed multishot receive, if any: while it is, nothing else receives.
    stream: Option<net::RecvStream>,
    /// A stream ended without the peer closing: plain receives until this frame is in.
    plain: bool,
}

/// A frame missing more bytes than this is received straight into the input buffer, not in
/// provided buffers.
const STREAM_BYTES_MAX: usize = 64 * 1024;

impl Input {
    fn new(socket: RawFd, last_activity: Rc<Cell<Instant>>) -> Input {
        Input {
            socket,
            last_activity,
            buf: Some(IoBuf::heap(RECEIVE_BYTES_MIN)),
            start: 0,
            stream: None,
            plain: false,
        }
    }

    fn buf(&self) -> &IoBuf {
        self.buf
            .as_ref()
            .expect("the input buffer is back from its receive")
    }

    fn buffered(&self) -> usize {
        self.buf().len() - self.start
    }

    /// Wait until at least `count` bytes are buffered. Ok(false) when the peer closed the
    /// connection cleanly with nothing buffered.
    async fn fill(&mut self, count: usize) -> io::Result<bool> {
        if self.buffered() == 0 {
            self.plain = false;
        }
        while self.buffered() < count {
            let buffered = self.buffered();
            if count - buffered > STREAM_BYTES_MAX {
                // A large frame: plain receives, once the stream's last bytes are in.
                if let Some(stream) = self.stream.as_mut() {
                    stream.cancel();
                }
            } else if self.stream.is_none() && !self.plain {
                self.stream = net::RecvStream::start(self.socket);
            }
            let mut buf = self
                .buf
                .take()
                .expect("the input buffer is back from its receive");
            if buffered == 0 {
                // Everything was used: start again at the front, and give a large frame's
                // memory back.
                self.start = 0;
                buf.set_len(0);
                if buf.capacity() > RECEIVE_BYTES {
                    buf = IoBuf::heap(RECEIVE_BYTES_MIN);
                }
            }
            // Room for the rest of `count`: a larger buffer when this one cannot hold the whole
            // of it, grown with what arrives (by at most RECEIVE_BYTES past the bytes buffered,
            // or to twice its size), so that a frame's announced length is not allocated before
            // its bytes come; else the buffered bytes move to the front when the room behind
            // them is short. A stream needs room for one provided buffer.
            let whole = count.max(RECEIVE_BYTES_MIN);
            let mut capacity = whole.min((buffered + RECEIVE_BYTES).max(2 * buf.capacity()));
            let room_short = if self.stream.is_some() {
                capacity = capacity.max((buffered + net::RECEIVE_BUFFER_BYTES).next_power_of_two());
                buf.capacity() - buf.len() < net::RECEIVE_BUFFER_BYTES
            } else {
                buf.capacity() - self.start < count
            };
            if buf.capacity() < capacity {
                let mut larger = IoBuf::heap(capacity);
                larger.set_len(buffered);
                larger
                    .as_mut_slice()
                    .copy_from_slice(&buf.as_slice()[self.start..]);
                buf = larger;
                self.start = 0;
            } else if self.start > 0 && room_short {
                let end = buf.len();
                buf.set_len(buf.capacity());
                buf.as_mut_slice().copy_within(self.start..end, 0);
                buf.set_len(buffered);
                self.start = 0;
            }
            let received = match self.stream.as_mut() {
                Some(stream) => {
                    let received = stream.recv_into(&mut buf).await;
                    self.buf = Some(buf);
                    match received? {
                        net::Received::Data(bytes) => bytes,
                        net::Received::Closed => {
                            self.stream = None;
                            0
                        }
                        net::Received::Ended => {
                            self.stream = None;
                            self.plain = true;
                            continue;
                        }
                    }
                }
                None => {
                    // With nothing buffered, the peer is most likely still waiting for an
                    // answer.
                    let (received, buf) = net::recv(self.socket, buf, buffered == 0).await;
                    self.buf = Some(buf);
                    received?
                }
            };
            if received > 0 {
                self.last_activity.set(time::now_coarse());
            }
            if received == 0 {
                if buffered == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection mid-frame",
                ));
            }
        }
        Ok(true)
    }

    /// The next `count` bytes, already buffered (see `fill`), consumed: they stay where they
    /// lie until the next `fill`.
    fn take_filled(&mut self, count: usize) -> &[u8] {
        assert!(
            self.buffered() >= count,
            "more bytes taken than were filled"
        );
        let start = self.start;
        self.start += count;
        &self.buf().as_slice()[start..start + count]
    }

    /// The next `count` bytes, waited for (an error if the peer closes before them).
    async fn take(&mut self, count: usize) -> Result<&[u8], String> {
        match self.fill(count).await {
            Ok(true) => Ok(self.take_filled(count)),
            Ok(false) => Err("the peer closed the connection mid-frame".into()),
            Err(error) => Err(error.to_string()),
        }
    }
}

async fn serve(store: Rc<Cache>, engine: EngineHandle, socket: OwnedFd, policy: Rc<Policy>) {
    let fd = socket.as_raw_fd();
    let limits = policy.limits;
    let in_flight = Rc::new(Semaphore::new(limits.requests_in_flight_max as usize));
    let connection = Rc::new(Connection {
        store,
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
        // SAFETY: shutdown on a socket fd this connection still owns.
        unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
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
        let header = match FrameHeader::decode(&header_bytes, &connection.limits.get()) {
            Ok(header) => header,
            Err(error) => {
                refuse_header(connection, input, &header_bytes, error).await?;
                continue;
            }
        };
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
            frames_before_hello += 1;
            if frames_before_hello > FRAMES_BEFORE_HELLO_MAX {
                return Err("closing the connection: too many requests before HELLO".into());
            }
            refusal = Some((Status::Unauthenticated, "send HELLO first".into()));
        } else if header.flags.contains(FrameFlags::MORE) && header.opcode != Opcode::Put {
            refusal = Some((
                Status::BadRequest,
                "only PUT may stream over several frames".into(),
            ));
        }
        let (header, extension, payload) = if header.flags.contains(FrameFlags::MORE) {
            // A streamed request is read to its last frame even when refused, so that one
            // request gets one answer and the stream stays in step.
            let extension = extension.to_vec();
            let payload = payload.to_vec();
            match gather_stream(connection, input, header, &extension, payload, refusal).await? {
                Some((header, payload)) => (header, extension, payload),
                None => continue,
            }
        } else {
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

/// Read the rest of a streamed PUT: frames of the same request id, opcode PUT and no extension,
/// the last without MORE. They must follow the first one directly. Returns the whole object, or
/// `None` after answering an error, `refused` included (the stream is read to its end either
/// way, so the connection stays in step). The object grows as its frames arrive, up to the
/// engine's object limit.
async fn gather_stream(
    connection: &Rc<Connection>,
    input: &mut Input,
    first: FrameHeader,
    extension: &[u8],
    mut payload: Vec<u8>,
    mut refused: Option<(Status, String)>,
) -> Result<Option<(FrameHeader, Vec<u8>)>, String> {
    let object_bytes = PutRequest::decode(extension).map_or(0, |request| request.object_bytes);
    let object_bytes_max = connection.engine.object_bytes_max();
    if refused.is_none() && object_bytes > object_bytes_max {
        refused = Some((
            Status::TooLarge,
            format!("an object is at most {object_bytes_max} bytes"),
        ));
    }
    if refused.is_some() {
        payload = Vec::new();
    }
    loop {
        if !input
            .fill(FRAME_HEADER_BYTES)
            .await
            .map_err(|error| error.to_string())?
        {
            return Err("the peer closed the connection inside a streamed PUT".into());
        }
        let header_bytes = input.take_filled(FRAME_HEADER_BYTES);
        let part = FrameHeader::decode(header_bytes, &connection.limits.get())
            .map_err(|error| format!("closing the connection: {error}"))?;
        if part.request_id != first.request_id
            || part.opcode != Opcode::Put
            || part.extension_len != 0
        {
            return Err(
                "closing the connection: a streamed PUT's frames must follow each other".into(),
            );
        }
        let data = input.take(part.payload_len as usize).await?;
        let crc = payload_crc(data);
        if refused.is_none() {
            if let Err(error) = part.check_payload_crc(crc) {
                refused = Some((Status::ChecksumMismatch, error.to_string()));
            } else if (payload.len() + data.len()) as u64 > object_bytes {
                refused = Some((Status::BadRequest, "more bytes than object_bytes".into()));
            } else {
                payload.extend_from_slice(data);
            }
        }
        if !part.flags.contains(FrameFlags::MORE) {
            break;
        }
    }
    if let Some((status, message)) = refused {
        connection.answer(&first, status, &[], message.as_bytes());
        return Ok(None);
    }
    let mut header = first;
    header.flags = FrameFlags::empty();
    header.payload_len = payload.len() as u64;
    Ok(Some((header, payload)))
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

/// Answer a HELLO. Returns false when the connection must close (a wrong proof: no second
/// guess on the same connection).
fn hello(connection: &Connection, header: &FrameHeader, extension: &[u8]) -> bool {
    let request = match HelloRequest::decode(extension) {
        Ok(request) => request,
        Err(error) => {
            connection.answer(
                header,
                Status::BadRequest,
                &[],
                error.to_string().as_bytes(),
            );
            return true;
        }
    };
    if !(request.version_min..=request.version_max).contains(&PROTOCOL_VERSION) {
        connection.answer(
            header,
            Status::Unsupported,
            &[],
            b"this server speaks protocol version 1",
        );
        return true;
    }
    let auth_required = match (&connection.policy.token, &request.proof) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(token), Some(proof)) => {
            if !hydrant_proto::auth::verify(
                token,
                &connection.server_nonce,
                &request.client_nonce,
                proof,
            ) {
                connection.answer(header, Status::Unauthenticated, &[], b"wrong token proof");
                return false;
            }
            false
        }
    };
    let limits = connection.policy.limits.negotiate(&request.limits);
    connection.limits.set(limits);
    connection.greeted.set(!auth_required);
    let response = HelloResponse {
        version: PROTOCOL_VERSION,
        limits,
        server_nonce: connection.server_nonce,
        auth_required,
        shard_count: connection.engine.shard_count() as u16,
        placement_hash: 1,
        shard_ports: connection.policy.shard_ports.to_vec(),
    };
    connection.answer(header, Status::Ok, &response.encode(), &[]);
    true
}

/// Answer a GET where it arrived, without a task of its own, when its key is this shard's and
/// the DRAM tier holds the current version (the common case of small hot objects: no wait is
/// possible). Returns false, having counted and sent nothing (the object may be marked visited
/// on NVMe, as the usual path's read would), when the request must take the usual
/// path (it may then still be a DRAM hit: this path only skips what must not wait).
fn answer_from_memory(
    connection: &Rc<Connection>,
    header: &FrameHeader,
    extension: &[u8],
    payload_bytes_in: usize,
) -> bool {
    // From the turn that received the frame: no clock read here.
    let started = time::now_coarse();
    let Ok(request) = GetRequestRef::decode(extension) else {
        return false;
    };
    let Ok(key) = ObjectKey::new(request.name.bucket, request.name.key) else {
        return false;
    };
    let cache = &connection.store;
    if connection.engine.shard_of(&key) != cache.shard() as usize {
        return false;
    }
    let range = ByteRange {
        start: request.range_start,
        end: request.range_end,
    };
    let budget = &connection.answer_budget;
    let Some((read, reservation)) = cache.get_memory(&key, Some(range), |bytes| {
        budget.try_reserve(bytes as usize)
    }) else {
        return false;
    };
    let info = ObjectInfo {
        object_bytes: read.bytes,
        seq: read.seq,
        dirty: read.dirty,
        range_start: read.start,
    };
    let payload_bytes = read.data.len();
    metrics::count_copies(metrics::PATH_TCP, read.copied_bytes, payload_bytes as u64);
    let held = HeldBytes {
        body: Body::Read(read.data),
        _reservation: Some(reservation),
    };
    let extension_out = info.to_bytes();
    connection.answer_held(header, Status::Ok, &extension_out, Some(Rc::new(held)));
    let bytes_in = FRAME_HEADER_BYTES + extension.len() + payload_bytes_in;
    let bytes_out = FRAME_HEADER_BYTES + extension_out.len() + payload_bytes;
    metrics::record_request(Opcode::Get, true, started.elapsed(), bytes_in, bytes_out);
    metrics::count(|counters| counters.answered_on_arrival += 1);
    true
}

async fn request(
    connection: Rc<Connection>,
    header: FrameHeader,
    extension: Vec<u8>,
    payload: Vec<u8>,
    permit: OwnedPermit,
) {
    let started = time::now_coarse();
    let bytes_in = FRAME_HEADER_BYTES + extension.len() + payload.len();
    if header.opcode == Opcode::BatchGet {
        let ok = batch_get(&connection, &header, &extension).await;
        metrics::record_request(header.opcode, ok, started.elapsed(), bytes_in, 0);
        drop(permit);
        return;
    }
    let (ok, bytes_out) = match respond(&connection, &header, &extension, payload).await {
        Ok((extension, payload)) => {
            let payload_bytes = payload.as_ref().map_or(0, |held| held.len());
            connection.answer_held(&header, Status::Ok, &extension, payload);
            (true, FRAME_HEADER_BYTES + extension.len() + payload_bytes)
        }
        Err((status, message)) => {
            connection.answer(&header, status, &[], message.as_bytes());
            (false, FRAME_HEADER_BYTES + message.len())
        }
    };
    metrics::record_request(header.opcode, ok, started.elapsed(), bytes_in, bytes_out);
    drop(permit);
}

type Answer = Result<(Vec<u8>, Option<Rc<HeldBytes>>), (Status, String)>;

fn owned_payload(bytes: Vec<u8>) -> Option<Rc<HeldBytes>> {
    (!bytes.is_empty()).then(|| Rc::new(HeldBytes::owned(bytes)))
}

fn bad_request(error: ProtoError) -> (Status, String) {
    (Status::for_error(&error), error.to_string())
}

pub(crate) fn engine_failure(error: hydrant_engine::Error) -> (Status, String) {
    let status = match error.kind() {
        ErrorKind::InvalidKey => Status::InvalidKey,
        ErrorKind::InvalidRange => Status::InvalidRange,
        ErrorKind::TooLarge => Status::TooLarge,
        ErrorKind::ChecksumMismatch => Status::DataCorrupt,
        ErrorKind::NoSpace => Status::NoSpace,
        ErrorKind::StoreFailed => Status::StoreFailed,
        ErrorKind::ShuttingDown => Status::ShuttingDown,
        ErrorKind::OriginUnavailable => Status::OriginUnavailable,
        ErrorKind::ReadOnly => Status::ReadOnly,
        ErrorKind::Busy => Status::Busy,
        ErrorKind::Timeout => Status::Timeout,
        _ => Status::Internal,
    };
    (status, error.to_string())
}

fn object_key(name: &ObjectName) -> Result<ObjectKey, (Status, String)> {
    ObjectKey::new(&name.bucket, &name.key).map_err(engine_failure)
}

/// Run `call` on the shard that owns `key`: here, or through the engine's inbox of that shard.
async fn on_owner<T, F, Fut>(
    connection: &Connection,
    key: &ObjectKey,
    call: F,
) -> hydrant_engine::Result<T>
where
    T: Send + 'static,
    F: FnOnce(Rc<Cache>) -> Fut + Send + 'static,
    Fut: Future<Output = hydrant_engine::Result<T>> + 'static,
{
    let shard = connection.engine.shard_of(key);
    if shard == connection.store.shard() as usize {
        call(connection.store.clone()).await
    } else {
        metrics::count(|counters| counters.requests_forwarded += 1);
        connection.engine.on_shard(shard, call).await
    }
}

/// What an answer says about a stored object (from its start).
fn info_of(meta: &hydrant_engine::ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        object_bytes: meta.bytes,
        seq: meta.seq,
        dirty: meta.dirty,
        range_start: 0,
    }
}

/// The bytes a read of `range` returns from an object of `object_bytes`.
fn range_bytes(range: ByteRange, object_bytes: u64) -> u64 {
    let end = range.end.unwrap_or(object_bytes).min(object_bytes);
    end.saturating_sub(range.start)
}

/// What the owning shard found for a GET: the bytes (read), or only the size when the answer is
/// large enough that room must be reserved for it first.
enum Found {
    Read(ObjectInfo, Vec<u8>),
    Sized(u64),
}

/// One GET, on the shard that owns its key. With `bytes_max`, a read that would return more
/// is refused from the object's size before anything is read. Room for the answer's bytes is
/// reserved in the connection's budget before they are read when the store knows the object's
/// size (objects read through from the origin are reserved for once read: their size is not
/// known before). On this shard the bytes stay where the read left them; from another shard
/// they come as a vector.
async fn get_object(
    connection: &Connection,
    request: GetRequest,
    bytes_max: Option<u64>,
) -> Result<(ObjectInfo, Rc<HeldBytes>), (Status, String)> {
    let key = object_key(&request.name)?;
    let range = ByteRange {
        start: request.range_start,
        end: request.range_end,
    };
    let not_found = || {
        (
            Status::NotFound,
            format!("{}/{} is not stored", request.name.bucket, request.name.key),
        )
    };
    let budget = &connection.answer_budget;
    let shard = connection.engine.shard_of(&key);
    if shard == connection.store.shard() as usize {
        let cache = connection.store.clone();
        let size = cache
            .store()
            .version(&key)
            .map(|version| range_bytes(range, version.bytes));
        check_item_size(size, bytes_max).map_err(engine_failure)?;
        let reserved = match size {
            Some(size) => Some(budget.reserve(size as usize).await),
            None => None,
        };
        let read = cache
            .get_parts(&key, Some(range))
            .await
            .map_err(engine_failure)?
            .ok_or_else(not_found)?;
        let reservation = match reserved {
            Some(reservation) => reservation,
            None => budget.reserve(read.data.len()).await,
        };
        let info = ObjectInfo {
            object_bytes: read.bytes,
            seq: read.seq,
            dirty: read.dirty,
            range_start: read.start,
        };
        metrics::count_copies(metrics::PATH_TCP, read.copied_bytes, read.data.len() as u64);
        let held = HeldBytes {
            body: Body::Read(read.data),
            _reservation: Some(reservation),
        };
        return Ok((info, Rc::new(held)));
    }
    // Another shard's key: small answers come back in one hop; a large one first says its size,
    // then is read once its room is reserved.
    metrics::count(|counters| counters.requests_forwarded += 1);
    let mut reserved = None;
    loop {
        let read_large = reserved.is_some();
        let key = key.clone();
        let found = connection
            .engine
            .on_shard(shard, move |cache: Rc<Cache>| async move {
                let size = cache
                    .store()
                    .version(&key)
                    .map(|version| range_bytes(range, version.bytes));
                check_item_size(size, bytes_max)?;
                if let Some(size) = size.filter(|&size| size > ANSWER_RESERVED_AFTER_BYTES_MAX) {
                    if !read_large {
                        return Ok(Some(Found::Sized(size)));
                    }
                }
                let Some(read) = cache.get_parts(&key, Some(range)).await? else {
                    return Ok(None);
                };
                let info = ObjectInfo {
                    object_bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    range_start: read.start,
                };
                // Gathered into a vector to cross to the connection's shard (a copy, counted
                // in `gathered`, unless the bytes already were one).
                let (data, gathered) = read.data.into_vec();
                let copied = read.copied_bytes + gathered;
                metrics::count_copies(metrics::PATH_TCP, copied, data.len() as u64);
                Ok(Some(Found::Read(info, data)))
            })
            .await
            .map_err(engine_failure)?
            .ok_or_else(not_found)?;
        match found {
            Found::Sized(size) => reserved = Some(budget.reserve(size as usize).await),
            Found::Read(info, data) => {
                let reservation = match reserved {
                    Some(reservation) => reservation,
                    None => budget.reserve(data.len()).await,
                };
                let held = HeldBytes {
                    body: Body::Owned(data),
                    _reservation: Some(reservation),
                };
                return Ok((info, Rc::new(held)));
            }
        }
    }
}

/// Refuse a batch item whose answer would exceed `bytes_max`, from its size.
fn check_item_size(size: Option<u64>, bytes_max: Option<u64>) -> hydrant_engine::Result<()> {
    match (size, bytes_max) {
        (Some(size), Some(bytes_max)) if size > bytes_max => Err(hydrant_engine::Error::new(
            ErrorKind::TooLarge,
            format!(
                "{size} bytes exceed the payload limit of {bytes_max}; get this item on its own"
            ),
        )),
        _ => Ok(()),
    }
}

/// BATCH_GET: every item answered by a frame of its own, as it completes (or in request order
/// with IN_ORDER); every answer but the last carries MORE. Returns whether the batch was valid.
async fn batch_get(connection: &Rc<Connection>, header: &FrameHeader, extension: &[u8]) -> bool {
    let request = match BatchGetRequest::decode(extension) {
        Ok(request) => request,
        Err(error) => {
            connection.answer(
                header,
                Status::for_error(&error),
                &[],
                error.to_string().as_bytes(),
            );
            return false;
        }
    };
    let items_max = connection.limits.get().batch_items_max as usize;
    if request.items.len() > items_max {
        let message = format!(
            "{} items exceed the batch limit of {items_max}",
            request.items.len()
        );
        connection.answer(header, Status::TooLarge, &[], message.as_bytes());
        return false;
    }
    let total = request.items.len();
    let answered = Rc::new(Cell::new(0usize));
    if header.flags.contains(FrameFlags::IN_ORDER) {
        for (index, item) in request.items.into_iter().enumerate() {
            let bytes_max = connection.limits.get().payload_bytes_max;
            let result = get_object(connection, item, Some(bytes_max)).await;
            answer_item(connection, header, index, result, &answered, total);
        }
    } else {
        let reading = Rc::new(Semaphore::new(BATCH_ITEMS_IN_FLIGHT_MAX));
        let tasks: Vec<_> = request
            .items
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                let connection = connection.clone();
                let answered = answered.clone();
                let header = *header;
                let reading = reading.clone();
                spawn(async move {
                    let _permit = reading.acquire_owned().await;
                    let bytes_max = connection.limits.get().payload_bytes_max;
                    let result = get_object(&connection, item, Some(bytes_max)).await;
                    answer_item(&connection, &header, index, result, &answered, total);
                })
            })
            .collect();
        for task in tasks {
            task.await;
        }
    }
    true
}

fn answer_item(
    connection: &Connection,
    request: &FrameHeader,
    index: usize,
    result: Result<(ObjectInfo, Rc<HeldBytes>), (Status, String)>,
    answered: &Cell<usize>,
    total: usize,
) {
    answered.set(answered.get() + 1);
    let payload_max = connection.limits.get().payload_bytes_max;
    let result = match result {
        Ok((_, held)) if held.len() as u64 > payload_max => Err((
            Status::TooLarge,
            format!(
                "{} bytes exceed the payload limit of {payload_max}; get this item on its own",
                held.len()
            ),
        )),
        other => other,
    };
    let (status, info, payload) = match result {
        Ok((info, held)) => (Status::Ok, Some(info), held),
        Err((status, message)) => (
            status,
            None,
            Rc::new(HeldBytes::owned(message.into_bytes())),
        ),
    };
    let extension = BatchItem {
        item: index as u32,
        info,
    }
    .encode();
    let range = 0..payload.len();
    let mut header = FrameHeader::response(request, status as u8, &extension, &[]);
    header.payload_len = range.len() as u64;
    header.payload_crc = if range.is_empty() {
        0
    } else {
        payload.crc(range.clone())
    };
    if answered.get() < total {
        header.flags = header.flags.with(FrameFlags::MORE);
    }
    connection.queue(out_frame(&header, &extension, Some(payload), range));
}

async fn respond(
    connection: &Connection,
    header: &FrameHeader,
    extension: &[u8],
    payload: Vec<u8>,
) -> Answer {
    match header.opcode {
        Opcode::Ping => Ok((Vec::new(), None)),
        Opcode::Get => {
            let request = GetRequest::decode(extension).map_err(bad_request)?;
            let (info, data) = get_object(connection, request, None).await?;
            Ok((info.encode(), Some(data)))
        }
        Opcode::Put => {
            let request = PutRequest::decode(extension).map_err(bad_request)?;
            if request.object_bytes != payload.len() as u64 {
                return Err((
                    Status::BadRequest,
                    "object_bytes differs from the payload length".into(),
                ));
            }
            let key = object_key(&request.name)?;
            let meta = on_owner(connection, &key.clone(), move |cache| async move {
                cache.put(key, payload).await
            })
            .await
            .map_err(engine_failure)?;
            let info = info_of(&meta);
            Ok((info.encode(), None))
        }
        Opcode::Head => {
            let name = ObjectName::decode(extension).map_err(bad_request)?;
            let key = object_key(&name)?;
            let meta = on_owner(connection, &key.clone(), move |cache| async move {
                cache.head(&key).await
            })
            .await
            .map_err(engine_failure)?;
            match meta {
                Some(meta) => {
                    let info = info_of(&meta);
                    Ok((info.encode(), None))
                }
                None => Err((
                    Status::NotFound,
                    format!("{}/{} is not stored", name.bucket, name.key),
                )),
            }
        }
        Opcode::Delete => {
            let name = ObjectName::decode(extension).map_err(bad_request)?;
            let key = object_key(&name)?;
            let existed = on_owner(connection, &key.clone(), move |cache| async move {
                cache.delete(key).await
            })
            .await
            .map_err(engine_failure)?;
            if existed {
                Ok((Vec::new(), None))
            } else {
                Err((
                    Status::NotFound,
                    format!("{}/{} is not stored", name.bucket, name.key),
                ))
            }
        }
        Opcode::Stats => {
            let text = metrics::gather(&connection.engine)
                .await
                .map_err(engine_failure)?;
            Ok((Vec::new(), owned_payload(text.into_bytes())))
        }
        Opcode::List => {
            let request = ListRequest::decode(extension).map_err(bad_request)?;
            let limit = (request.limit as usize).min(LIST_ENTRIES_MAX);
            let listed = connection
                .engine
                .list(
                    &request.bucket,
                    &request.prefix,
                    request.start_after.as_deref(),
                    limit,
                )
                .await
                .map_err(engine_failure)?;
            let entries = listed
                .into_iter()
                .map(|meta| ListEntry {
                    key: meta.key,
                    object_bytes: meta.bytes,
                    seq: meta.seq,
                    dirty: meta.dirty,
                })
                .collect();
            Ok((Vec::new(), owned_payload(ListEntries { entries }.encode())))
        }
        Opcode::Prefetch => {
            let request = PrefetchRequest::decode(extension).map_err(bad_request)?;
            let (objects, bytes) = connection
                .engine
                .prefetch(
                    &request.bucket,
                    &request.prefix,
                    request.keys,
                    PREFETCH_READS_IN_FLIGHT,
                )
                .await
                .map_err(engine_failure)?;
            Ok((PrefetchResult { objects, bytes }.encode(), None))
        }
        Opcode::Flush => {
            let request = FlushRequest::decode(extension).map_err(bad_request)?;
            connection
                .engine
                .flush(
                    request.bucket.as_deref(),
                    &request.prefix,
                    Duration::from_millis(request.timeout_ms as u64),
                )
                .await
                .map_err(engine_failure)?;
            Ok((Vec::new(), None))
        }
        other => Err((
            Status::Unsupported,
            format!("{other:?} is not supported yet"),
        )),
    }
}

/// The longest list of frames a connection's writer keeps between sends.
const FRAMES_KEPT_MAX: usize = 64;

/// Send queued answers, several per send (each from where its bytes lie), until reading is
/// done and the queue is empty.
async fn write_loop(connection: Rc<Connection>, socket: RawFd) {
    // Kept from batch to batch, so that a send allocates no list of frames.
    let mut frames = Vec::new();
    loop {
        let batch = {
            let mut outbox = connection.outbox.borrow_mut();
            let mut bytes = 0;
            let mut slices = 0;
            while let Some(frame) = outbox.front() {
                let frame_slices = frame.slice_count();
                if !frames.is_empty()
                    && (bytes + frame.len() > SEND_BATCH_BYTES_MAX
                        || slices + frame_slices > SEND_SLICES_MAX)
                {
                    break;
                }
                bytes += frame.len();
                slices += frame_slices;
                frames.push(outbox.pop_front().expect("front exists"));
            }
            SendBatch { frames }
        };
        if batch.frames.is_empty() {
            if connection.reading_done.get() {
                return;
            }
            frames = batch.frames;
            connection.outbox_changed.wait().await;
            continue;
        }
        let total: usize = batch.frames.iter().map(OutFrame::len).sum();
        let (sent, batch) = net::send_parts(socket, batch).await;
        // The answers' bytes (and their room in the budget) go back now.
        frames = batch.frames;
        frames.clear();
        if frames.capacity() > FRAMES_KEPT_MAX {
            // A burst of many small answers: give the list back rather than keep it per
            // connection.
            frames = Vec::new();
        }
        connection.last_activity.set(time::now_coarse());
        connection
            .outbox_bytes
            .set(connection.outbox_bytes.get() - total);
        if sent.is_err() {
            // The peer is gone: drop what is left; the reader sees the close too.
            connection.outbox.borrow_mut().clear();
            connection.outbox_bytes.set(0);
            if connection.reading_done.get() {
                return;
            }
        }
        connection.outbox_changed.wake_all();
    }
}
