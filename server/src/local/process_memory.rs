//! WRITE_MEMORY's source: the bytes of a same-host writer's own memory, read with
//! `process_vm_readv` by the shard that stores them, so that a writer needs no shared region and
//! its bytes are copied once, into the shard's buffer. Only the process at the other end of the
//! connection (by SO_PEERCRED) is read, and the kernel's ptrace rules decide whether the server
//! may read it (the same uid, or root; Yama's `ptrace_scope` may ask more).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use hydrant_engine::buf::SharedSource;
use hydrant_engine::{Error, ErrorKind, Result};
use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Pieces one `process_vm_readv` takes at most (the kernel's IOV_MAX).
const IOVECS_PER_READ_MAX: usize = 1024;

/// A writer's process, held open so that its pid is not taken for another's.
pub(super) struct Writer {
    pid: i32,
    /// A pidfd of the writer: once it has exited its pid may name another process, so every
    /// read is followed by a look at this, and bytes read after the exit are not used.
    pidfd: OwnedFd,
}

impl Writer {
    /// The process `pid` (the connection's peer), or why it cannot be held.
    pub(super) fn open(pid: i32) -> std::io::Result<Writer> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Writer { pid, pidfd })
    }

    /// Whether the process has exited (its pidfd is readable).
    fn exited(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; a timeout of 0 never blocks.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready != 0 // an error counts as exited: nothing read can be trusted then
    }

    /// Copy `remote` (addresses in the writer) into `into`, whole or not at all.
    fn read(&self, remote: &[RemoteIoVec], into: &mut [u8]) -> Result<()> {
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
                return Err(Error::new(
                    ErrorKind::InvalidRange,
                    format!(
                        "only {read} of {want} bytes of the writer's memory could be read: a part \
                         is not mapped in its process"
                    ),
                ));
            }
            done += want;
        }
        if self.exited() {
            return Err(Error::new(
                ErrorKind::Io,
                "the writer's process exited during its write; nothing was stored",
            ));
        }
        Ok(())
    }

    /// Read one byte of `address`: whether the server may read this writer at all.
    pub(super) fn probe(&self, address: u64) -> std::result::Result<(), Errno> {
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

fn refusal(errno: Errno, batch: &[RemoteIoVec]) -> Error {
    let first = batch.first().map(|piece| piece.base).unwrap_or(0);
    let kind = match errno {
        Errno::EFAULT => ErrorKind::InvalidRange,
        _ => ErrorKind::Io,
    };
    Error::new(
        kind,
        format!("the writer's memory from {first:#x} cannot be read: {errno}"),
    )
}

/// The bytes of one WRITE_MEMORY: parts of the writer's memory, one after another.
pub(super) struct ProcessMemory {
    writer: Arc<Writer>,
    /// (address in the writer, length, offset in the object) of each part.
    parts: Vec<(u64, u64, u64)>,
    length: u64,
}

impl ProcessMemory {
    /// The parts, or why they do not make an object (addresses that wrap around).
    pub(super) fn new(
        writer: Arc<Writer>,
        parts: &[(u64, u64)],
    ) -> std::result::Result<ProcessMemory, String> {
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
}

impl SharedSource for ProcessMemory {
    fn len(&self) -> u64 {
        self.length
    }

    fn copy_to(&self, start: u64, into: &mut [u8]) -> Result<()> {
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
