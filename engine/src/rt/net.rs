//! Sockets on the shard's ring: a listener bound with SO_REUSEPORT (one per shard, so the
//! kernel spreads connections over the shards), and accept, receive and send as operations.
//! As for files, a buffer belongs to the ring until its completion arrives.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{opcode, types};

use super::executor::with_reactor;
use super::op::{submit_socket, Keep};
pub use super::provided::RECEIVE_BUFFER_BYTES;
use crate::buf::IoBuf;

/// IORING_RECVSEND_POLL_FIRST (linux/io_uring.h, since 5.19): arm the poll before trying.
const RECVSEND_POLL_FIRST: u16 = 1;

thread_local! {
    /// Whether this thread's ring takes RECVSEND_POLL_FIRST (older kernels answer EINVAL).
    static POLL_FIRST_ACCEPTED: Cell<bool> = const { Cell::new(true) };
}

/// Most connections a listener queues before the shard accepts them.
const LISTEN_BACKLOG: i32 = 1024;

/// A TCP listener on `address` that other shards may bind too (SO_REUSEPORT).
pub fn listen(address: SocketAddr) -> io::Result<OwnedFd> {
    let (family, storage, length) = socket_address(address);
    // SAFETY: plain system calls on an fd we own; every pointer argument points at a live local
    // of the size passed with it.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        for option in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            let pointer = (&one as *const libc::c_int).cast();
            if libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                pointer,
                std::mem::size_of::<libc::c_int>() as u32,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::bind(
            fd,
            (&storage as *const libc::sockaddr_storage).cast(),
            length,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::listen(fd, LISTEN_BACKLOG) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(socket)
    }
}

/// The address a socket is bound to (to learn the port the kernel chose for port 0).
pub fn local_address(socket: &OwnedFd) -> io::Result<SocketAddr> {
    let listener = std::mem::ManuallyDrop::new(
        // SAFETY: the fd stays owned by `socket`; ManuallyDrop keeps the listener from closing it.
        unsafe { std::net::TcpListener::from_raw_fd(socket.as_raw_fd()) },
    );
    listener.local_addr()
}

fn socket_address(address: SocketAddr) -> (libc::c_int, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data, large enough for either address family.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match address {
        SocketAddr::V4(v4) => {
            let raw = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), raw) };
            (
                libc::AF_INET,
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        }
        SocketAddr::V6(v6) => {
            let raw = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), raw) };
            (
                libc::AF_INET6,
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as u32,
            )
        }
    }
}

/// Accept one connection on `listener`.
pub async fn accept(listener: RawFd) -> io::Result<OwnedFd> {
    let entry = opcode::Accept::new(
        types::Fd(listener),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .flags(libc::SOCK_CLOEXEC)
    .build();
    let (result, _) = submit_socket(entry, Keep::Nothing).await;
    // SAFETY: a successful accept returns a new fd that nothing else owns.
    result.map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Wait until `fd` is readable (an eventfd whose count is not zero, a socket with bytes or
/// a hang-up): one POLL_ADD on the shard's ring, not counted as device I/O. The caller reads
/// the fd itself.
pub async fn readable(fd: RawFd) -> io::Result<()> {
    let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
    let (result, _) = submit_socket(entry, Keep::Nothing).await;
    result.map(|_| ())
}

/// Receive into `buf` after its current length, up to its capacity. Ok(0) means the peer
/// closed the connection. With `expect_wait` (nothing is expected to be there yet: a server
/// that has just answered waits for the next request) the ring waits for the socket to be
/// readable before it tries, instead of trying once in vain first.
pub async fn recv(socket: RawFd, mut buf: IoBuf, expect_wait: bool) -> (io::Result<usize>, IoBuf) {
    let filled = buf.len();
    let room = buf.capacity() - filled;
    assert!(room > 0, "recv into a full buffer");
    // SAFETY: the pointer stays inside buf's capacity, and buf is kept by the ring until the
    // completion arrives.
    let pointer = unsafe { buf.as_mut_ptr().add(filled) };
    let poll_first = expect_wait && POLL_FIRST_ACCEPTED.with(Cell::get);
    let entry = opcode::Recv::new(types::Fd(socket), pointer, room as u32)
        .ioprio(if poll_first { RECVSEND_POLL_FIRST } else { 0 })
        .build();
    let (mut result, mut keep) = submit_socket(entry, Keep::Buf(buf)).await;
    if poll_first
        && result
            .as_ref()
            .is_err_and(|error| error.raw_os_error() == Some(libc::EINVAL))
    {
        // A kernel before 5.19 refuses the flag: receive without it, on this thread from now on.
        POLL_FIRST_ACCEPTED.with(|accepted| accepted.set(false));
        let entry = opcode::Recv::new(types::Fd(socket), pointer, room as u32).build();
        (result, keep) = submit_socket(entry, keep).await;
    }
    let mut buf = keep.into_buf();
    match result {
        Ok(received) => {
            buf.set_len(filled + received as usize);
            (Ok(received as usize), buf)
        }
        Err(error) => (Err(error), buf),
    }
}

/// Receive up to `max` bytes into `chunk`'s room after the bytes it holds (a streamed put's
/// chunk, so that a large payload goes from the socket to the device with no copy in between).
/// Ok(0): the peer closed. The chunk is the ring's until the completion arrives.
pub async fn recv_into_chunk(
    socket: RawFd,
    mut chunk: crate::buf::ChunkData,
    max: usize,
) -> (io::Result<usize>, crate::buf::ChunkData) {
    let room = chunk.spare_capacity_mut();
    let length = max.min(room.len());
    assert!(length > 0, "recv into a full chunk");
    let pointer = room.as_mut_ptr().cast::<u8>();
    let entry = opcode::Recv::new(types::Fd(socket), pointer, length as u32).build();
    // SAFETY (of the entry's pointer): it points into the chunk's allocation, which the boxed
    // `ChunkData` owns and which does not move with it; the ring keeps the box until the
    // completion arrives.
    let (result, keep) = submit_socket(entry, Keep::Owned(Box::new(chunk))).await;
    let mut chunk = match keep {
        Keep::Owned(owned) => *owned
            .downcast::<crate::buf::ChunkData>()
            .expect("a chunk's receive comes back with its chunk"),
        _ => unreachable!("a chunk's receive came back without its chunk"),
    };
    match result {
        Ok(received) => {
            let received = received as usize;
            // SAFETY: the kernel wrote `received` bytes (at most `length`, within the room)
            // right after the chunk's bytes.
            unsafe { chunk.set_len(chunk.len() + received) };
            (Ok(received), chunk)
        }
        Err(error) => (Err(error), chunk),
    }
}

/// Send all of `buf`'s bytes (looping over partial sends).
pub async fn send_all(socket: RawFd, buf: IoBuf) -> (io::Result<()>, IoBuf) {
    let mut sent = 0;
    let mut buf = buf;
    while sent < buf.len() {
        // SAFETY: the pointer and length stay inside buf, kept by the ring until completion.
        let pointer = unsafe { buf.as_ptr().add(sent) };
        let entry = opcode::Send::new(types::Fd(socket), pointer, (buf.len() - sent) as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build();
        let (result, keep) = submit_socket(entry, Keep::Buf(buf)).await;
        buf = keep.into_buf();
        match result {
            Ok(0) => {
                return (
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the peer stopped reading",
                    )),
                    buf,
                )
            }
            Ok(count) => sent += count as usize,
            Err(error) => return (Err(error), buf),
        }
    }
    (Ok(()), buf)
}

/// Bytes sent from where they lie, without gathering them into one buffer first: a list of
/// slices. The slices must stay valid, at the same addresses and unchanged, for as long as the
/// value lives: they lie in memory the value owns on the heap (or shares, as an `Rc<[u8]>`),
/// never inside the value itself, which moves.
///
/// # Safety
///
/// `for_each_part` must visit the same slices every time it is called, each pointing into
/// memory that the value keeps alive and unchanged until it is dropped.
pub unsafe trait SendParts: 'static {
    /// Visit the bytes, in the order they are sent.
    fn for_each_part(&self, visit: &mut dyn FnMut(&[u8]));
}

/// Most slices one `sendmsg` carries (the kernel's IOV_MAX is 1024).
pub const SEND_PARTS_MAX: usize = 1024;

/// What the ring holds during a gathered send: the parts, the iovecs into them and the message
/// header that points at the iovecs, all in one heap allocation.
struct GatheredSend<T> {
    parts: T,
    iovecs: Iovecs,
    message: libc::msghdr,
}

/// Slices a gathered send holds inside its own allocation; more go to a vector.
const IOVECS_INLINE: usize = 8;

/// The iovecs of a gathered send: a small answer's (a header and a payload or two) need no
/// allocation of their own.
enum Iovecs {
    Inline([libc::iovec; IOVECS_INLINE], usize),
    Heap(Vec<libc::iovec>),
}

impl Iovecs {
    fn new() -> Iovecs {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Iovecs::Inline([empty; IOVECS_INLINE], 0)
    }

    fn push(&mut self, iovec: libc::iovec) {
        match self {
            Iovecs::Inline(inline, len) if *len < IOVECS_INLINE => {
                inline[*len] = iovec;
                *len += 1;
            }
            Iovecs::Inline(inline, len) => {
                let mut heap = inline[..*len].to_vec();
                heap.push(iovec);
                *self = Iovecs::Heap(heap);
            }
            Iovecs::Heap(heap) => heap.push(iovec),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [libc::iovec] {
        match self {
            Iovecs::Inline(inline, len) => &mut inline[..*len],
            Iovecs::Heap(heap) => heap,
        }
    }
}

/// Send every byte of `parts` with as few `sendmsg` calls as the kernel allows (looping over
/// partial sends), at most `SEND_PARTS_MAX` slices per `sendmsg` (the kernel's IOV_MAX). The
/// parts come back with the result.
pub async fn send_parts<T: SendParts>(socket: RawFd, parts: T) -> (io::Result<()>, T) {
    let mut iovecs = Iovecs::new();
    parts.for_each_part(&mut |part| {
        if !part.is_empty() {
            iovecs.push(libc::iovec {
                iov_base: part.as_ptr() as *mut libc::c_void,
                iov_len: part.len(),
            });
        }
    });
    // SAFETY: msghdr is plain data; the zeroed fields mean no address and no control data.
    let message: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut gathered = Box::new(GatheredSend {
        parts,
        iovecs,
        message,
    });
    let mut first = 0;
    while first < gathered.iovecs.as_mut_slice().len() {
        let send = &mut *gathered;
        let iovecs = &mut send.iovecs.as_mut_slice()[first..];
        send.message.msg_iovlen = iovecs.len().min(SEND_PARTS_MAX);
        send.message.msg_iov = iovecs.as_mut_ptr();
        let entry = opcode::SendMsg::new(types::Fd(socket), &send.message)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build();
        // SAFETY (of the entry's pointers): the message header, the iovecs and the bytes they
        // point into live in `gathered`, a heap allocation that the ring keeps (and that does
        // not move) until the completion arrives; `SendParts` promises the bytes stay put.
        let (result, keep) = submit_socket(entry, Keep::Owned(gathered)).await;
        gathered = match keep {
            Keep::Owned(owned) => owned
                .downcast::<GatheredSend<T>>()
                .expect("a gathered send comes back as it went"),
            _ => unreachable!("a gathered send came back without its parts"),
        };
        let mut sent = match result {
            Ok(0) => {
                let error = io::Error::new(io::ErrorKind::WriteZero, "the peer stopped reading");
                return (Err(error), gathered.parts);
            }
            Ok(count) => count as usize,
            Err(error) => return (Err(error), gathered.parts),
        };
        // Skip what went out; a partly sent slice continues where it stopped.
        while sent > 0 {
            let iovec = &mut gathered.iovecs.as_mut_slice()[first];
            if sent >= iovec.iov_len {
                sent -= iovec.iov_len;
                first += 1;
            } else {
                // SAFETY: `sent` is less than the slice's length, so the pointer stays inside it.
                iovec.iov_base = unsafe { iovec.iov_base.cast::<u8>().add(sent) }.cast();
                iovec.iov_len -= sent;
                sent = 0;
            }
        }
    }
    (Ok(()), gathered.parts)
}

/// What one completion of a [`RecvStream`] brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// This many bytes, appended to the buffer.
    Data(usize),
    /// The peer closed the connection (the stream is over).
    Closed,
    /// The stream is over without the peer closing: it was cancelled (see
    /// [`RecvStream::cancel`] and `STREAM_BUFFERS_UNREAD_MAX`) or found no provided buffer free.
    /// The bytes not received yet wait in the socket for a plain [`recv`].
    Ended,
}

/// A multishot receive on one socket into the shard's provided buffers: armed once, it brings
/// the socket's bytes as they arrive until it ends. Dropping it cancels it; the buffers its
/// unread completions hold go back to the shard.
pub struct RecvStream {
    /// Its slot in the reactor, until its last completion was taken.
    index: Option<usize>,
}

impl RecvStream {
    /// Arm a multishot receive on `socket`; `None` when the shard has no provided buffers. While
    /// it is armed, nothing else may receive from `socket`.
    pub fn start(socket: RawFd) -> Option<RecvStream> {
        with_reactor(|reactor| reactor.start_stream(socket))
            .map(|index| RecvStream { index: Some(index) })
    }

    /// Cancel it: the completions already made still come, then `Received::Ended`.
    pub fn cancel(&mut self) {
        if let Some(index) = self.index {
            with_reactor(|reactor| reactor.cancel_stream(index));
        }
    }

    /// Wait for its next completion and append the bytes it brought to `buf`, which must have
    /// room for `RECEIVE_BUFFER_BYTES` after its length.
    pub async fn recv_into(&mut self, buf: &mut IoBuf) -> io::Result<Received> {
        assert!(
            buf.capacity() - buf.len() >= RECEIVE_BUFFER_BYTES,
            "room for one provided buffer"
        );
        let Some(index) = self.index else {
            return Ok(Received::Ended);
        };
        let (result, flags) = std::future::poll_fn(|context| {
            match with_reactor(|reactor| reactor.poll_stream(index, context.waker())) {
                Some(completion) => std::task::Poll::Ready(completion),
                None => std::task::Poll::Pending,
            }
        })
        .await;
        if !io_uring::cqueue::more(flags) {
            self.index = None;
        }
        match result {
            0 => Ok(Received::Closed),
            received if received > 0 => {
                let received = received as usize;
                let bid = io_uring::cqueue::buffer_select(flags)
                    .expect("a multishot receive's bytes lie in a provided buffer");
                let filled = buf.len();
                buf.set_len(filled + received);
                with_reactor(|reactor| {
                    reactor.take_provided(bid, received, &mut buf.as_mut_slice()[filled..])
                });
                Ok(Received::Data(received))
            }
            error if error == -libc::ENOBUFS => {
                with_reactor(|reactor| reactor.count_buffer_shortage());
                Ok(Received::Ended)
            }
            error if error == -libc::ECANCELED => Ok(Received::Ended),
            error if error == -libc::EINVAL => {
                with_reactor(|reactor| reactor.refuse_streams());
                Ok(Received::Ended)
            }
            error => Err(io::Error::from_raw_os_error(-error)),
        }
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        if let Some(index) = self.index {
            with_reactor(|reactor| reactor.abandon_stream(index));
        }
    }
}
