//! I/O operations as futures. Each one moves its buffer into the reactor's table of operations
//! in flight; the buffer comes back with the result. If the future is dropped first, the table
//! keeps the buffer until the kernel's completion arrives (see `Reactor::abandon_slot`).
//!
//! Device operations consult [`super::fault`] first: inert outside fault tests.

use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use io_uring::{opcode, squeue, types};

use super::executor::with_reactor;
use super::fault;
pub(crate) use super::reactor::{Keep, Vectored};
use crate::buf::{ExternalBuf, IoBuf};

/// A file as the ring sees it: an index into the ring's registered files, or a plain fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRef {
    Fixed(u32),
    Raw(RawFd),
}

enum State {
    Unsubmitted(squeue::Entry, Keep),
    Submitted(usize),
    Finished,
}

/// One operation on the shard's ring.
pub struct Op {
    state: State,
    /// Device I/O: the bytes it moves, counted against the shard's in-flight bounds. Socket
    /// operations: `None`, not counted.
    device_bytes: Option<u32>,
    /// Its place in the line of device operations waiting for room, once it has waited.
    ticket: Option<u64>,
}

impl Op {
    /// A device operation that moves `bytes`.
    fn new(entry: squeue::Entry, keep: Keep, bytes: u32) -> Op {
        Op {
            state: State::Unsubmitted(entry, keep),
            device_bytes: Some(bytes),
            ticket: None,
        }
    }
}

impl Future for Op {
    type Output = (io::Result<u32>, Keep);

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match std::mem::replace(&mut self.state, State::Finished) {
                State::Unsubmitted(entry, keep) => {
                    let this = &mut *self;
                    match with_reactor(|reactor| {
                        reactor.try_submit(
                            entry,
                            keep,
                            context.waker(),
                            this.device_bytes,
                            &mut this.ticket,
                        )
                    }) {
                        Ok(index) => self.state = State::Submitted(index),
                        Err((entry, keep)) => {
                            self.state = State::Unsubmitted(entry, keep);
                            return Poll::Pending;
                        }
                    }
                }
                State::Submitted(index) => {
                    match with_reactor(|reactor| reactor.poll_slot(index, context.waker())) {
                        Some((result, keep)) => {
                            let result = if result < 0 {
                                Err(io::Error::from_raw_os_error(-result))
                            } else {
                                Ok(result as u32)
                            };
                            return Poll::Ready((result, keep));
                        }
                        None => {
                            self.state = State::Submitted(index);
                            return Poll::Pending;
                        }
                    }
                }
                State::Finished => panic!("operation polled after completion"),
            }
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        match self.state {
            State::Submitted(index) => with_reactor(|reactor| reactor.abandon_slot(index)),
            // It waited in line: its place goes to the next.
            State::Unsubmitted(..) => {
                if let Some(ticket) = self.ticket {
                    with_reactor(|reactor| reactor.leave_line(ticket));
                }
            }
            State::Finished => {}
        }
    }
}

/// Submit one prepared socket operation; `keep` stays with the ring until the completion
/// arrives. Not counted against the in-flight bound of device I/O.
pub(crate) fn submit_socket(entry: squeue::Entry, keep: Keep) -> Op {
    Op {
        state: State::Unsubmitted(entry, keep),
        device_bytes: None,
        ticket: None,
    }
}

fn into_buf(keep: Keep) -> IoBuf {
    keep.into_buf()
}

/// A READ of `length` bytes at `offset` into `pointer`: READ_FIXED through fixed-buffer slot
/// `fixed` when the memory is registered.
fn read_entry(
    file: FileRef,
    pointer: *mut u8,
    length: u32,
    fixed: Option<u16>,
    offset: u64,
) -> squeue::Entry {
    match (file, fixed) {
        (FileRef::Fixed(file), Some(slot)) => {
            opcode::ReadFixed::new(types::Fixed(file), pointer, length, slot)
                .offset(offset)
                .build()
        }
        (FileRef::Raw(fd), Some(slot)) => {
            opcode::ReadFixed::new(types::Fd(fd), pointer, length, slot)
                .offset(offset)
                .build()
        }
        (FileRef::Fixed(file), None) => opcode::Read::new(types::Fixed(file), pointer, length)
            .offset(offset)
            .build(),
        (FileRef::Raw(fd), None) => opcode::Read::new(types::Fd(fd), pointer, length)
            .offset(offset)
            .build(),
    }
}

/// Read `len` bytes at `offset` into the start of `buf`. On success the buffer's length is the
/// number of bytes read (which may be short at the end of a file).
pub async fn read_at(
    file: FileRef,
    mut buf: IoBuf,
    offset: u64,
    len: usize,
) -> (io::Result<usize>, IoBuf) {
    assert!(
        len <= buf.capacity(),
        "read of {len} bytes into a {}-byte buffer",
        buf.capacity()
    );
    if let Err(error) = fault::before_read() {
        return (Err(error), buf);
    }
    let length = u32::try_from(len).expect("one read is under 4 GiB");
    let entry = read_entry(file, buf.as_mut_ptr(), length, buf.fixed_index(), offset);
    let (result, keep) = Op::new(entry, Keep::Buf(buf), length).await;
    let mut buf = into_buf(keep);
    match result {
        Ok(read) => {
            buf.set_len(read as usize);
            (Ok(read as usize), buf)
        }
        Err(error) => (Err(error), buf),
    }
}

/// Read `buf.len()` bytes at `offset` straight into memory outside the arena: READ_FIXED when
/// it is registered with the ring, else a plain READ (the kernel pins its pages for this one
/// read). The buffer is held by the ring until
/// the completion arrives, so its owner outlives the kernel's access even if this is dropped.
pub async fn read_at_external(file: FileRef, buf: ExternalBuf, offset: u64) -> io::Result<usize> {
    fault::before_read()?;
    let pointer = buf.as_mut_ptr();
    let length = u32::try_from(buf.len()).expect("one read is under 4 GiB");
    let entry = read_entry(file, pointer, length, buf.fixed_slot(), offset);
    let (result, _) = Op::new(entry, Keep::External(buf), length).await;
    result.map(|read| read as usize)
}

/// Read at `offset` into the whole of `buf` and then the whole of `external`, in one operation
/// (READV; the header of an entry and its data in one device read). Returns the bytes read in
/// all and `buf`, whose length is what of it was filled.
pub async fn read_vectored_at(
    file: FileRef,
    mut buf: IoBuf,
    external: ExternalBuf,
    offset: u64,
) -> (io::Result<usize>, IoBuf) {
    if let Err(error) = fault::before_read() {
        return (Err(error), buf);
    }
    let first = buf.capacity();
    let length = u32::try_from(first + external.len()).expect("one read is under 4 GiB");
    let iovecs = [
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: first,
        },
        libc::iovec {
            iov_base: external.as_mut_ptr().cast(),
            iov_len: external.len(),
        },
        libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        },
    ];
    // The iovecs live in the box, which the ring holds (with both buffers) until completion.
    let vectored = Box::new(Vectored {
        iovecs,
        buf,
        _external: external,
    });
    let pointer = vectored.iovecs.as_ptr();
    let entry = match file {
        FileRef::Fixed(fixed) => opcode::Readv::new(types::Fixed(fixed), pointer, 2),
        FileRef::Raw(fd) => opcode::Readv::new(types::Fd(fd), pointer, 2),
    }
    .offset(offset)
    .build();
    let (result, keep) = Op::new(entry, Keep::Vectored(vectored), length).await;
    let mut buf = into_buf(keep);
    match result {
        Ok(read) => {
            buf.set_len((read as usize).min(first));
            (Ok(read as usize), buf)
        }
        Err(error) => (Err(error), buf),
    }
}

/// Write the first `buf.len()` bytes of `buf` at `offset`. A short write is an error.
pub async fn write_at(file: FileRef, buf: IoBuf, offset: u64) -> (io::Result<()>, IoBuf) {
    let ticket = match fault::before_write(file, offset, buf.as_slice()) {
        Ok(ticket) => ticket,
        Err(error) => return (Err(error), buf),
    };
    let pointer = buf.as_ptr();
    let length = u32::try_from(buf.len()).expect("one write is under 4 GiB");
    let entry = match (file, buf.fixed_index()) {
        (FileRef::Fixed(fixed), Some(index)) => {
            opcode::WriteFixed::new(types::Fixed(fixed), pointer, length, index)
                .offset(offset)
                .build()
        }
        (FileRef::Raw(fd), Some(index)) => {
            opcode::WriteFixed::new(types::Fd(fd), pointer, length, index)
                .offset(offset)
                .build()
        }
        (FileRef::Fixed(fixed), None) => opcode::Write::new(types::Fixed(fixed), pointer, length)
            .offset(offset)
            .build(),
        (FileRef::Raw(fd), None) => opcode::Write::new(types::Fd(fd), pointer, length)
            .offset(offset)
            .build(),
    };
    let (result, keep) = Op::new(entry, Keep::Buf(buf), length).await;
    fault::after_write(ticket);
    let buf = into_buf(keep);
    (whole_write(result, length, offset), buf)
}

/// Write at `offset` the first `split` bytes of `buf`, then the whole of `external`, then the
/// rest of `buf` up to its length, in one operation (WRITEV: an entry's header block, its data
/// where a same-host client's memory holds it, and the last block's copy). A short write is an
/// error. The device reads `external` while the write runs: bytes its owner changes meanwhile
/// may be written as they were or as they became.
pub async fn write_split_at(
    file: FileRef,
    buf: IoBuf,
    split: usize,
    external: ExternalBuf,
    offset: u64,
) -> (io::Result<()>, IoBuf) {
    assert!(split <= buf.len(), "a split past the buffer's end");
    let ticket = if fault::installed() {
        let mut bytes = buf.as_slice()[..split].to_vec();
        external.with_bytes(0, external.len(), |piece| bytes.extend_from_slice(piece));
        bytes.extend_from_slice(&buf.as_slice()[split..]);
        fault::before_write(file, offset, &bytes)
    } else {
        fault::before_write(file, offset, &[])
    };
    let ticket = match ticket {
        Ok(ticket) => ticket,
        Err(error) => return (Err(error), buf),
    };
    let total = buf.len() + external.len();
    let length = u32::try_from(total).expect("one write is under 4 GiB");
    let base = buf.as_ptr() as *mut libc::c_void;
    let iovecs = [
        libc::iovec {
            iov_base: base,
            iov_len: split,
        },
        libc::iovec {
            iov_base: external.as_mut_ptr().cast(),
            iov_len: external.len(),
        },
        libc::iovec {
            // SAFETY (of the pointer arithmetic): `split` is within the buffer.
            iov_base: unsafe { base.cast::<u8>().add(split) }.cast(),
            iov_len: buf.len() - split,
        },
    ];
    let count = if buf.len() > split { 3 } else { 2 };
    let vectored = Box::new(Vectored {
        iovecs,
        buf,
        _external: external,
    });
    let pointer = vectored.iovecs.as_ptr();
    let entry = match file {
        FileRef::Fixed(fixed) => opcode::Writev::new(types::Fixed(fixed), pointer, count),
        FileRef::Raw(fd) => opcode::Writev::new(types::Fd(fd), pointer, count),
    }
    .offset(offset)
    .build();
    let (result, keep) = Op::new(entry, Keep::Vectored(vectored), length).await;
    fault::after_write(ticket);
    let buf = into_buf(keep);
    (whole_write(result, length, offset), buf)
}

/// A write's result: a short one is an error.
fn whole_write(result: io::Result<u32>, length: u32, offset: u64) -> io::Result<()> {
    match result {
        Ok(written) if written == length => Ok(()),
        Ok(written) => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {written} of {length} bytes at offset {offset}"),
        )),
        Err(error) => Err(error),
    }
}

/// Make every completed write to `file` durable (fdatasync).
pub async fn sync_data(file: FileRef) -> io::Result<()> {
    let ticket = fault::before_flush(file)?;
    let entry = match file {
        FileRef::Fixed(fixed) => opcode::Fsync::new(types::Fixed(fixed)),
        FileRef::Raw(fd) => opcode::Fsync::new(types::Fd(fd)),
    }
    .flags(types::FsyncFlags::DATASYNC)
    .build();
    let result = Op::new(entry, Keep::Nothing, 0).await.0.map(|_| ());
    fault::after_flush(ticket, result.is_ok());
    result
}
