//! WRITE_MEMORY: the bytes of a same-host writer's own memory, read with `process_vm_readv`
//! on the connection's thread a chunk at a time and streamed to the owning shard as a PUT's
//! chunks are, so that a writer needs no shared region. The reads are on the connection's
//! thread, never a shard's, because a read of the client's memory can take as long as the
//! client's page faults do (a file mapped from a slow or stuck file system): only that client's
//! write waits. Only the process that opened the connection is read (its pidfd, from
//! SO_PEERPIDFD), and the kernel's ptrace rules decide whether the server may read it (the same
//! uid, or root; Yama's `ptrace_scope` may ask more).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

use hydrant_engine::store::ObjectKey;
use hydrant_engine::{Attributes, EngineHandle, Precondition};
use hydrant_proto::local::LocalWriteAnswer;
use hydrant_proto::Status;
use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use crate::connection::requests::engine_failure;

/// A refusal as the connection answers it.
type Refusal = (Status, String);

/// Pieces one `process_vm_readv` takes at most (the kernel's IOV_MAX).
const IOVECS_PER_READ_MAX: usize = 1024;

/// A writer's process, held open so that its pid is not taken for another's.
pub(super) struct Writer {
    pid: i32,
    /// A pidfd of the process that opened the connection, taken from the socket itself (so it
    /// names that process even if it has exited and its pid been reused since): every read is
    /// followed by a look at it, and bytes read after the exit are not used.
    pidfd: OwnedFd,
}

impl Writer {
    /// The process at the other end of `stream`, or why it cannot be held (a kernel before
    /// 6.5 has no SO_PEERPIDFD).
    pub(super) fn open(stream: &UnixStream) -> std::io::Result<Writer> {
        let mut fd: libc::c_int = -1;
        let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_PEERPIDFD writes one int, the size given, into `fd`.
        let done = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut length,
            )
        };
        if done != 0 || fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened for us, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let pid = pid_of(&pidfd)?;
        Ok(Writer { pid, pidfd })
    }

    /// Whether the process has exited (its pidfd is readable).
    fn exited(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one pollfd, valid for the call; a timeout of 0 never blocks.
            let ready = unsafe { libc::poll(&mut poll, 1, 0) };
            if ready < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
            return ready != 0; // an error counts as exited: nothing read can be trusted then
        }
    }

    /// Copy `remote` (addresses in the writer) into `into`, whole or not at all.
    fn read(&self, remote: &[RemoteIoVec], into: &mut [u8]) -> Result<(), Refusal> {
        let mut done = 0;
        for batch in remote.chunks(IOVECS_PER_READ_MAX) {
            let want: usize = batch.iter().map(|piece| piece.len).sum();
            let target = &mut into[done..done + want];
            let read = process_vm_readv(
                Pid::from_raw(self.pid),
                &mut [std::io::IoSliceMut::new(target)],
                batch,
            )
            .map_err(|errno| refusal(errno, batch))?;
            if read != want {
                return Err((
                    Status::InvalidRange,
                    format!(
                        "only {read} of {want} bytes of the writer's memory could be read: a part \
                         is not mapped in its process"
                    ),
                ));
            }
            done += want;
        }
        if self.exited() {
            return Err((
                Status::Internal,
                "the writer's process exited during its write; nothing was stored".into(),
            ));
        }
        Ok(())
    }

    /// Read one byte of `address`: whether the server may read this writer at all.
    pub(super) fn probe(&self, address: u64) -> Result<(), Errno> {
        let mut byte = [0u8; 1];
        let remote = [RemoteIoVec {
            base: address as usize,
            len: 1,
        }];
        process_vm_readv(
            Pid::from_raw(self.pid),
            &mut [std::io::IoSliceMut::new(&mut byte)],
            &remote,
        )
        .map(|_| ())
    }
}

/// The pid a pidfd names (its `Pid:` line in /proc/self/fdinfo); -1 once the process is gone.
fn pid_of(pidfd: &OwnedFd) -> std::io::Result<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    info.lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|&pid: &i32| pid > 0)
        .ok_or_else(|| std::io::Error::other("the writer's process has already exited"))
}

/// How a failed read of the writer's memory from `batch` is answered.
fn refusal(errno: Errno, batch: &[RemoteIoVec]) -> Refusal {
    let first = batch.first().map(|piece| piece.base).unwrap_or(0);
    let message = format!("the writer's memory from {first:#x} cannot be read: {errno}");
    match errno {
        Errno::EFAULT => (Status::InvalidRange, message),
        Errno::EPERM | Errno::EACCES => (
            Status::Unsupported,
            format!("{message} (the kernel's ptrace rules decide): write from a region"),
        ),
        _ => (Status::Internal, message),
    }
}

/// The bytes of one WRITE_MEMORY: parts of the writer's memory, one after another.
pub(super) struct ProcessMemory<'a> {
    writer: &'a Writer,
    /// (address in the writer, length, offset in the object) of each part.
    parts: Vec<(u64, u64, u64)>,
    length: u64,
}

impl<'a> ProcessMemory<'a> {
    /// The parts, or why they do not make an object (addresses that wrap around).
    pub(super) fn new(writer: &'a Writer, parts: &[(u64, u64)]) -> Result<Self, String> {
        let mut placed = Vec::with_capacity(parts.len());
        let mut length = 0u64;
        for &(address, bytes) in parts {
            if bytes == 0 {
                continue;
            }
            if address
                .checked_add(bytes)
                .is_none_or(|end| end > isize::MAX as u64)
            {
                return Err(format!(
                    "a part of {bytes} bytes at {address:#x} wraps around"
                ));
            }
            placed.push((address, bytes, length));
            length = length
                .checked_add(bytes)
                .ok_or_else(|| "the parts add up past 2^64 bytes".to_string())?;
        }
        Ok(ProcessMemory {
            writer,
            parts: placed,
            length,
        })
    }

    /// Its first byte's address, if it has bytes.
    pub(super) fn first_address(&self) -> Option<u64> {
        self.parts.first().map(|&(address, _, _)| address)
    }

    /// Its bytes.
    pub(super) fn len(&self) -> u64 {
        self.length
    }

    /// Copy bytes `start..start + into.len()` of it into `into`, whole or not at all.
    fn copy_to(&self, start: u64, into: &mut [u8]) -> Result<(), Refusal> {
        let end = start + into.len() as u64;
        let first = self
            .parts
            .partition_point(|&(_, bytes, at)| at + bytes <= start);
        let mut remote = Vec::new();
        for &(address, bytes, at) in &self.parts[first..] {
            if at >= end {
                break;
            }
            let from = start.max(at);
            let to = end.min(at + bytes);
            remote.push(RemoteIoVec {
                base: (address + (from - at)) as usize,
                len: (to - from) as usize,
            });
        }
        self.writer.read(&remote, into)
    }
}

/// Store `source` (the writer's memory) as `key`: each chunk read here, on the connection's
/// thread, into a streamed chunk (within the node's bound on them) and sent to the owning shard,
/// which writes it as a PUT's; answered once the put is durable as its bucket's write mode
/// requires. A client that goes away, or memory that cannot be read, stops the put before its
/// last chunk: nothing becomes visible.
pub(super) fn store(
    engine: &EngineHandle,
    stream: &UnixStream,
    key: ObjectKey,
    source: ProcessMemory<'_>,
    precondition: Precondition,
) -> Result<LocalWriteAnswer, Refusal> {
    let length = source.len();
    let chunk_bytes = engine.chunk_bytes();
    let (sink, done) = engine
        .put_stream_key(key, length, precondition, &Attributes::default())
        .map_err(engine_failure)?;
    let abandoned = AtomicBool::new(false);
    let mut failure = None;
    let fill = async {
        // Every chunk, each exactly `chunk_bytes` but the last: an empty object is one empty
        // chunk.
        let chunks = length.div_ceil(chunk_bytes).max(1);
        let mut sent = 0u64;
        let mut chunk_index = 0;
        while chunk_index < chunks {
            if abandoned.load(Ordering::Acquire) {
                break; // the sink is dropped below: the put is abandoned
            }
            let want = chunk_bytes.min(length - sent) as usize;
            let Some(mut chunk) = engine.try_streamed_chunk(want) else {
                // The node's bound on streamed chunks is reached: look again on the next wake
                // (the executor below polls at least every PEER_CHECK_INTERVAL).
                Yield(false).await;
                continue;
            };
            let room = &mut chunk.data.spare_capacity_mut()[..want];
            // SAFETY: `read` writes every byte of `into` or fails; u8 has no invalid values,
            // and the length is set only after a read that filled it.
            let into =
                unsafe { std::slice::from_raw_parts_mut(room.as_mut_ptr().cast::<u8>(), want) };
            if let Err(refusal) = source.copy_to(sent, into) {
                failure = Some(refusal);
                break;
            }
            // SAFETY: the read above filled `want` bytes.
            unsafe { chunk.data.set_len(want) };
            crate::metrics::LOCAL_MEMORY_WRITE_BYTES.fetch_add(want as u64, Ordering::Relaxed);
            sent += want as u64;
            chunk_index += 1;
            if !sink.send(chunk).await {
                break; // the put ended early; its outcome says why
            }
        }
        drop(sink);
    };
    let (_, stored) =
        super::block_on_watching(futures::future::join(fill, done), stream, &abandoned);
    if let Some(failure) = failure {
        return Err(failure);
    }
    let meta = stored.map_err(engine_failure)?;
    Ok(LocalWriteAnswer {
        seq: meta.seq,
        bytes: meta.bytes,
        dirty: meta.dirty,
    })
}

/// Pending once, then ready: lets the executor poll the other futures (and wait a little).
struct Yield(bool);

impl std::future::Future for Yield {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        std::task::Poll::Pending
    }
}
