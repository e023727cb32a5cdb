//! Same-host read rings (RING_OPEN): a submission and a completion queue in a memory file shared
//! with the client, served by a task on one shard. Layout in `hydrant_proto::local_ring` and
//! docs/protocol.md.
//!
//! - The shard's task takes the entries the client has written, at most as many as the
//!   completion queue has room for (so a client that stops consuming completions stops the
//!   ring, and nothing piles up in the server), copies each before decoding it, and reads
//!   each object into the ring's region as a READ item would be read: on this shard when it
//!   owns the key, else through the owning shard.
//! - The server writes nothing in the file but its own counters and completions, and trusts
//!   none of the client's counters beyond the ring's size: a client that writes nonsense there
//!   stalls or garbles only its own ring.
//! - Doorbells: the task sets `server_idle` before it waits on the submit eventfd and looks
//!   once more after; the client rings only when it sees it set. The task rings the completion
//!   eventfd only when the client has set `client_waiting` and as many completions as it asks
//!   for there are unconsumed (and clears it).
//! - Closing (the connection ends, or its region is freed): the task stops taking entries,
//!   waits for the reads it took, and only then says it is done, so the region is let go of
//!   only once no read can land in it; it sets the file's `closed` flag and rings the client,
//!   whose entries not taken will get no completion.
//! - All the rings of a shard hold at most `LOCAL_RING_READS_PER_SHARD_MAX` reads at once.

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};

use hydrant_engine::buf::ExternalBuf;
use hydrant_engine::rt::net::readable;
use hydrant_engine::rt::spawn;
use hydrant_engine::rt::sync::Semaphore;
use hydrant_engine::store::ObjectKey;
use hydrant_engine::{ByteRange, Cache, EngineHandle};
use hydrant_proto::local::LOCAL_RANGE_TO_END;
use hydrant_proto::local_ring::{
    cqe_offset, ring_file_bytes, sqe_offset, RingCompletion, RingSubmission, LOCAL_RING_CQE_BYTES,
    LOCAL_RING_READS_PER_SHARD_MAX, LOCAL_RING_SQE_BYTES, RING_CLIENT_WAITING, RING_CLOSED,
    RING_CQ_HEAD, RING_CQ_TAIL, RING_SERVER_IDLE, RING_SQ_HEAD, RING_SQ_TAIL,
};
use hydrant_proto::Status;
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

use super::{failed, read_item, ShardItem};
use crate::connection::requests::engine_failure;
use crate::metrics::{LOCAL_REGION_BYTES, LOCAL_RINGS, LOCAL_RING_READS_IN_FLIGHT};

/// What the connection and the ring's task share.
pub(super) struct RingShared {
    entries: u32,
    /// The ring file's size, counted with the regions' bytes until the file is unmapped.
    bytes: u64,
    /// The ring file; the server's mapping goes with the last holder.
    memfd: OwnedFd,
    mapping: MmapRaw,
    /// The client rings this after writing entries (when `server_idle` is set).
    submit: OwnedFd,
    /// The server rings this after writing completions (when `client_waiting` is set).
    complete: OwnedFd,
    stop: AtomicBool,
}

impl RingShared {
    /// A ring file of `entries` (checked by the caller: a power of two within the bound) and
    /// its two doorbells.
    pub(super) fn create(entries: u32) -> io::Result<RingShared> {
        let bytes = ring_file_bytes(entries);
        let memfd = memfd_create(
            c"hydrant-ring",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        nix::unistd::ftruncate(&memfd, bytes as libc::off_t)?;
        // As for regions: the client must not shrink the file under the server's mapping.
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals))?;
        let mapping = MmapOptions::new().len(bytes).map_raw(&memfd)?;
        Ok(RingShared {
            entries,
            bytes: bytes as u64,
            memfd,
            mapping,
            submit: eventfd()?,
            complete: eventfd()?,
            stop: AtomicBool::new(false),
        })
    }

    /// The fds the client gets: the ring file, the submit doorbell, the completion doorbell.
    pub(super) fn client_fds(&self) -> [RawFd; 3] {
        [
            self.memfd.as_raw_fd(),
            self.submit.as_raw_fd(),
            self.complete.as_raw_fd(),
        ]
    }

    fn counter(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(64) && offset < 4096);
        // SAFETY: the mapping is at least 4096 bytes, page-aligned, and lives as long as self;
        // an AtomicU32 may be changed by anyone at any time, which is what the client may do.
        unsafe { &*(self.mapping.as_ptr().add(offset) as *const AtomicU32) }
    }

    /// A copy of submission slot `index`, read a word at a time (the client may be writing it).
    fn copy_submission(&self, index: u32) -> Box<[u8; LOCAL_RING_SQE_BYTES]> {
        let mut copy = Box::new([0u8; LOCAL_RING_SQE_BYTES]);
        let base = sqe_offset(self.entries, index);
        for (word, chunk) in copy.chunks_exact_mut(8).enumerate() {
            // SAFETY: the slot lies inside the mapping (ring_file_bytes) and is 8-byte aligned
            // (4096 + a multiple of 1152); atomics tolerate the client's concurrent writes.
            let value = unsafe {
                (*(self.mapping.as_ptr().add(base + word * 8) as *const AtomicU64))
                    .load(Ordering::Relaxed)
            };
            chunk.copy_from_slice(&value.to_ne_bytes());
        }
        copy
    }

    fn write_completion(&self, index: u32, completion: &[u8; LOCAL_RING_CQE_BYTES]) {
        let base = cqe_offset(self.entries, index);
        for (word, chunk) in completion.chunks_exact(8).enumerate() {
            let value = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
            // SAFETY: as in copy_submission, for a completion slot.
            unsafe {
                (*(self.mapping.as_ptr().add(base + word * 8) as *const AtomicU64))
                    .store(value, Ordering::Relaxed)
            };
        }
    }

    /// The size of the ring file for `entries`.
    pub(super) fn bytes_for(entries: u32) -> u64 {
        ring_file_bytes(entries) as u64
    }

    /// Ask the task to stop and wake it.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        ring_doorbell(self.submit.as_raw_fd());
    }
}

impl Drop for RingShared {
    fn drop(&mut self) {
        LOCAL_REGION_BYTES.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new fd (or -1) that nothing else owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ring_doorbell(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live array; a full counter (EAGAIN) is already a ring.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

fn drain_doorbell(fd: RawFd) {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live array; the fd is non-blocking.
    unsafe { libc::read(fd, count.as_mut_ptr().cast(), 8) };
}

thread_local! {
    /// Reads taken from this shard's rings and not yet completed, all rings together.
    static SHARD_RING_READS: Rc<Semaphore> =
        Rc::new(Semaphore::new(LOCAL_RING_READS_PER_SHARD_MAX));
}

/// The connection's handle on an open ring.
pub(super) struct RingHandle {
    pub(super) region: u32,
    shared: Arc<RingShared>,
    stopped: mpsc::Receiver<()>,
}

impl RingHandle {
    /// Stop the ring and wait until none of its reads is in flight.
    pub(super) fn close(self) {
        drop(self);
    }
}

impl Drop for RingHandle {
    /// However the handle goes (closed, or its connection's thread unwinding), the ring stops
    /// and its reads end before the region it reads into can go.
    fn drop(&mut self) {
        self.shared.stop();
        // The task sends once it is done; a shard that went away drops the sender instead.
        let _ = self.stopped.recv();
    }
}

/// Start serving `shared` on `shard`: its reads land in `region`.
pub(super) fn start(
    engine: &EngineHandle,
    shard: usize,
    shared: Arc<RingShared>,
    region_id: u32,
    region: ExternalBuf,
) -> hydrant_engine::Result<RingHandle> {
    let (done, stopped) = mpsc::channel();
    let task_shared = shared.clone();
    let task_engine = engine.clone();
    let started = engine.spawn_on_shard(shard, move |cache| {
        serve(cache, task_shared, region, task_engine, shard, done)
    });
    hydrant_engine::rt::block_on(started)?;
    LOCAL_RINGS.fetch_add(1, Ordering::SeqCst);
    Ok(RingHandle {
        region: region_id,
        shared,
        stopped,
    })
}

/// What the ring's reads share on the shard.
struct Serving {
    cache: Rc<Cache>,
    shared: Arc<RingShared>,
    region: ExternalBuf,
    engine: EngineHandle,
    shard: usize,
    /// Completions written (the server's own count; the file's copy is for the client).
    cq_tail: std::cell::Cell<u32>,
}

async fn serve(
    cache: Rc<Cache>,
    shared: Arc<RingShared>,
    region: ExternalBuf,
    engine: EngineHandle,
    shard: usize,
    done: mpsc::Sender<()>,
) {
    let entries = shared.entries;
    let serving = Rc::new(Serving {
        cache,
        shared: shared.clone(),
        region,
        engine,
        shard,
        cq_tail: std::cell::Cell::new(0),
    });
    // One permit per read taken and not completed: taking all of them back at the end waits
    // for every read.
    let reading = Rc::new(Semaphore::new(entries as usize));
    let mut taken = 0u32;
    let room = |taken: u32, reading: &Semaphore| -> bool {
        // The client's consumed count, trusted only between what it may be: at most what the
        // server completed.
        let cq_tail = serving.cq_tail.get();
        let cq_head = shared.counter(RING_CQ_HEAD).load(Ordering::Acquire);
        let consumed = if cq_tail.wrapping_sub(cq_head) > entries {
            cq_tail // nonsense: as if all were consumed, the client's own loss
        } else {
            cq_head
        };
        taken.wrapping_sub(consumed) < entries && reading.available() > 0
    };
    let shard_reads = SHARD_RING_READS.with(Rc::clone);
    while !shared.stop.load(Ordering::Acquire) {
        let tail = shared.counter(RING_SQ_TAIL).load(Ordering::Acquire);
        let mut took = false;
        while taken != tail && room(taken, &reading) {
            // All the shard's rings together: waits for a read of any of them to end.
            let shard_permit = shard_reads.acquire_owned().await;
            let slot = shared.copy_submission(taken);
            taken = taken.wrapping_add(1);
            shared.counter(RING_SQ_HEAD).store(taken, Ordering::Release);
            let permit = reading.acquire_owned().await; // available: checked by `room`
            LOCAL_RING_READS_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
            let serving = serving.clone();
            spawn(async move {
                let completion = serve_entry(&serving, &slot).await;
                complete(&serving, &completion);
                LOCAL_RING_READS_IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
                drop((permit, shard_permit));
            });
            took = true;
        }
        if took {
            // Let the reads start (their I/O is submitted with this turn's), then look again.
            YieldOnce(false).await;
            continue;
        }
        // Nothing to take: say so, look once more (the client may have written in between),
        // then sleep until the doorbell.
        shared.counter(RING_SERVER_IDLE).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let tail = shared.counter(RING_SQ_TAIL).load(Ordering::Acquire);
        if shared.stop.load(Ordering::Acquire) || (taken != tail && room(taken, &reading)) {
            shared.counter(RING_SERVER_IDLE).store(0, Ordering::SeqCst);
            continue;
        }
        if let Err(error) = readable(shared.submit.as_raw_fd()).await {
            log::error!("same-host ring: cannot wait for its doorbell: {error}");
            break;
        }
        drain_doorbell(shared.submit.as_raw_fd());
        shared.counter(RING_SERVER_IDLE).store(0, Ordering::SeqCst);
    }
    // Every read taken has completed once every permit is back.
    let mut permits = Vec::with_capacity(entries as usize);
    for _ in 0..entries {
        permits.push(reading.acquire().await);
    }
    drop(permits);
    // Entries not taken get no completion: say the ring is closed, and wake a client waiting.
    shared.counter(RING_CLOSED).store(1, Ordering::SeqCst);
    ring_doorbell(shared.complete.as_raw_fd());
    LOCAL_RINGS.fetch_sub(1, Ordering::SeqCst);
    let _ = done.send(());
}

/// Publish one completion and wake the client if it sleeps.
fn complete(serving: &Serving, completion: &RingCompletion) {
    let shared = &serving.shared;
    let index = serving.cq_tail.get();
    shared.write_completion(index, &completion.encode());
    serving.cq_tail.set(index.wrapping_add(1));
    shared
        .counter(RING_CQ_TAIL)
        .store(index.wrapping_add(1), Ordering::Release);
    fence(Ordering::SeqCst);
    let waiting = shared.counter(RING_CLIENT_WAITING);
    let wanted = waiting.load(Ordering::SeqCst);
    if wanted != 0 {
        // The client's numbers, trusted only to decide when to wake it: nonsense there delays
        // or hastens its own wake-up, nothing else.
        let unconsumed = index
            .wrapping_add(1)
            .wrapping_sub(shared.counter(RING_CQ_HEAD).load(Ordering::Acquire));
        let due = unconsumed >= wanted.min(shared.entries) || unconsumed > shared.entries;
        if due && waiting.swap(0, Ordering::SeqCst) != 0 {
            ring_doorbell(shared.complete.as_raw_fd());
        }
    }
}

/// Decode, check and read one entry.
async fn serve_entry(serving: &Serving, slot: &[u8; LOCAL_RING_SQE_BYTES]) -> RingCompletion {
    let submission = match RingSubmission::decode(slot) {
        Ok(submission) => submission,
        Err(error) => {
            let status = if error.invalid_name {
                Status::InvalidKey
            } else {
                Status::BadRequest
            };
            return completion(error.user_data, failed(status, error.message.to_string()));
        }
    };
    let user_data = submission.user_data;
    let region_bytes = serving.region.len() as u64;
    let fits = submission
        .offset
        .checked_add(submission.length)
        .is_some_and(|end| end <= region_bytes);
    if !fits {
        let message = format!(
            "offset {} + length {} is outside the region of {region_bytes} bytes",
            submission.offset, submission.length
        );
        return completion(user_data, failed(Status::InvalidRange, message));
    }
    let key = match ObjectKey::new(&submission.bucket, &submission.key) {
        Ok(key) => key,
        Err(error) => {
            let (status, message) = engine_failure(error);
            return completion(user_data, failed(status, message));
        }
    };
    let item = ShardItem {
        index: 0,
        range: ByteRange {
            start: submission.range_start,
            end: (submission.range_end != LOCAL_RANGE_TO_END).then_some(submission.range_end),
        },
        destination: serving
            .region
            .slice(submission.offset as usize, submission.length as usize)
            .expect("checked to fit above"),
        key,
    };
    let owner = serving.engine.shard_of(&item.key);
    let result = if owner == serving.shard {
        read_item(&serving.cache, &item).await
    } else {
        // Another shard's key: read there (the region stays held by the item's buffer).
        let call = serving.engine.on_shard(owner, move |cache| async move {
            Ok(read_item(&cache, &item).await)
        });
        call.await.unwrap_or_else(|error| {
            let (status, message) = engine_failure(error);
            failed(status, message)
        })
    };
    completion(user_data, result)
}

fn completion(user_data: u64, result: hydrant_proto::local::LocalItemResult) -> RingCompletion {
    RingCompletion {
        user_data,
        status: result.status,
        object_bytes: result.object_bytes,
        range_start: result.range_start,
        written: result.written,
        message: result.message,
    }
}

/// Ready on its second poll: lets the other tasks of the shard run.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        context.waker().wake_by_ref();
        Poll::Pending
    }
}
