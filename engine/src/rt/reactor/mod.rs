//! The reactor: one io_uring ring per shard thread and the table of operations in flight on it.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};

use super::provided::{ProvidedBuffers, ReceiveStats, RECEIVE_GROUP};
use crate::buf::IoBuf;

mod room;
mod streams;

/// Settings of one reactor; every field has a documented default in [`ReactorConfig::default`].
#[derive(Clone, Debug)]
pub struct ReactorConfig {
    /// Submission queue entries. Must exceed `io_depth_max` plus the few internal operations.
    pub ring_entries: u32,
    /// Most device and socket operations in flight on this ring at once. Block devices queue
    /// 32–64 requests; more only adds latency.
    pub io_depth_max: usize,
    /// Most bytes of device I/O in flight on this ring at once; an operation larger than this
    /// goes alone. Some devices serve large reads fastest with few in flight.
    pub io_bytes_max: u64,
    /// With many operations in flight, how long the reactor may wait for a batch of
    /// completions before it submits again (see `Reactor::turn`).
    pub completion_batch_wait_us: u32,
    /// Provided receive buffers of `RECEIVE_BUFFER_BYTES` for multishot receives (a power of
    /// two; 0: every receive goes into its connection's own buffer).
    pub receive_buffers: u16,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            ring_entries: 256,
            io_depth_max: 64,
            io_bytes_max: IO_BYTES_MAX_DEFAULT,
            completion_batch_wait_us: 100,
            receive_buffers: RECEIVE_BUFFERS_DEFAULT,
        }
    }
}

/// The default bound on device bytes in flight per shard: room for two 4 MiB chunks, or 64
/// reads of 128 KiB.
pub const IO_BYTES_MAX_DEFAULT: u64 = 8 << 20;

/// The default number of provided receive buffers per shard: 1 MiB of 4 KiB buffers.
pub const RECEIVE_BUFFERS_DEFAULT: u16 = 256;

/// Provided buffers one multishot receive may hold unread before it is cancelled (its
/// connection stopped reading: the rest waits in the socket, where TCP holds the peer back).
pub const STREAM_BUFFERS_UNREAD_MAX: usize = 8;

/// What the ring turned out to support, for stats and logs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReactorInfo {
    /// The ring was created with `DEFER_TASKRUN` + `SINGLE_ISSUER`.
    pub defer_taskrun: bool,
}

/// What the ring holds on behalf of an operation until its completion arrives: the memory the
/// kernel reads from or writes into.
pub enum Keep {
    Nothing,
    Buf(IoBuf),
    /// Memory outside the arena; holding it keeps its owner (and so the mapping) alive.
    External(crate::buf::ExternalBuf),
    /// A vectored read: the iovecs and every buffer they point into.
    Vectored(Box<Vectored>),
    /// Anything else the operation's pointers lead into (a gathered send: its parts, the iovec
    /// array and the message header), boxed so that it does not move while the kernel holds it.
    Owned(Box<dyn std::any::Any>),
}

/// Slots of a ring's fixed-buffer table for memory outside the arena (same-host regions): slot 0
/// is the arena, slots 1 to this one are registered and emptied at run time.
pub const EXTERNAL_FIXED_SLOTS: u16 = 64;

fn check_external_slot(slot: u16) -> io::Result<()> {
    if slot == 0 || slot > EXTERNAL_FIXED_SLOTS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fixed-buffer slot {slot} is not one of 1 to {EXTERNAL_FIXED_SLOTS}"),
        ));
    }
    Ok(())
}

/// What a vectored read or write of an arena buffer and outside memory holds until its
/// completion (up to three pieces; a read uses the first two).
pub struct Vectored {
    pub(crate) iovecs: [libc::iovec; 3],
    pub(crate) buf: IoBuf,
    pub(crate) _external: crate::buf::ExternalBuf,
}

impl Keep {
    pub(crate) fn into_buf(self) -> IoBuf {
        match self {
            Keep::Buf(buf) => buf,
            Keep::Vectored(vectored) => vectored.buf,
            Keep::Nothing | Keep::External(_) | Keep::Owned(_) => {
                unreachable!("a buffer operation came back without its buffer")
            }
        }
    }
}

enum SlotState {
    /// Submitted; the waker (if any) is woken by the completion.
    Waiting(Option<Waker>),
    /// The completion arrived with this result.
    Done(i32),
    /// The future that asked was dropped; the slot (and its `Keep`) is freed by the completion.
    Abandoned,
    /// A multishot receive: its completions (result, flags) not yet taken, the waker of its
    /// receiver, and whether it was cancelled. The slot is freed with its last completion.
    Stream {
        completions: VecDeque<(i32, u32)>,
        waker: Option<Waker>,
        cancelled: bool,
    },
    /// A multishot receive whose receiver went away: cancelled, its buffers given back as they
    /// come, the slot freed with its last completion.
    StreamAbandoned,
}

struct Slot {
    state: SlotState,
    keep: Keep,
    /// Device I/O: the bytes it moves, counted (with the operation) against `io_depth_max` and
    /// `io_bytes_max`. Socket operations are not counted (`None`), since a receive may wait for
    /// as long as its peer is idle.
    device_bytes: Option<u32>,
}

/// With at least this many operations in flight, the reactor waits for 1/DIVISOR of them to
/// complete (at most COMPLETION_BATCH_MAX) before submitting again. Measured on a virtual disk:
/// 4 KiB random reads at queue depth 32 went from 0.6 to 0.8-0.9 of fio's IOPS.
const COMPLETION_BATCH_DIVISOR: usize = 4;
const COMPLETION_BATCH_MAX: usize = 16;

/// The user_data tag of the eventfd read that wakes the reactor from other threads.
const EVENTFD_TAG: u64 = u64::MAX;
/// The user_data tag of cancellations issued while shutting down; their completions carry no
/// slot.
const CANCEL_TAG: u64 = u64::MAX - 1;

/// Cross-thread wake-up: other threads write the eventfd, whose read is kept armed on the ring.
pub(crate) struct RemoteWake {
    eventfd: OwnedFd,
    /// Set by the first waker after the reactor last consumed a notification, so that a burst of
    /// cross-thread wakes costs one eventfd write.
    notified: AtomicBool,
}

impl RemoteWake {
    fn new() -> io::Result<RemoteWake> {
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RemoteWake {
            // SAFETY: fd was just returned by eventfd and nothing else owns it.
            eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
            notified: AtomicBool::new(false),
        })
    }

    /// Wake the reactor's thread if it may be sleeping.
    pub(crate) fn notify(&self) {
        if self.notified.swap(true, Ordering::SeqCst) {
            return;
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an fd we own.
        let written = unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // A blocking eventfd write only waits if the counter is near 2^64, which cannot happen
        // since every read resets it.
        debug_assert_eq!(written, 8);
    }
}

/// A device operation waiting for room under the in-flight bounds.
struct Waiter {
    ticket: u64,
    bytes: u32,
    waker: Waker,
    /// Operations submitted past it while it was first in line.
    passed: u32,
    /// Nothing may pass it: it is larger than the byte bound, or was passed too often.
    closes_line: bool,
}

/// How many operations may pass the first waiter in line before it closes the line behind it.
pub const WAITER_PASSES_MAX: u32 = 16;

pub struct Reactor {
    /// Whether the fixed-buffer table has slots for external buffers.
    external_slots: Cell<bool>,
    ring: RefCell<IoUring>,
    slots: RefCell<Vec<Option<Slot>>>,
    free_slots: RefCell<Vec<usize>>,
    in_flight: Cell<usize>,
    bytes_in_flight: Cell<u64>,
    sockets_in_flight: Cell<usize>,
    io_depth_max: usize,
    io_bytes_max: u64,
    /// Device operations waiting for room, in the order they first found none. An operation
    /// that fits may pass those ahead of it that do not (a 4 KiB header read need not wait
    /// behind 1 MiB reads), except a waiter that closes the line: one larger than the byte bound
    /// (it waits for the bytes in flight to drain), or the first in line once it has been passed
    /// `WAITER_PASSES_MAX` times. So nothing waits for ever.
    depth_waiters: RefCell<VecDeque<Waiter>>,
    next_ticket: Cell<u64>,
    /// How many of the waiters close the line.
    closing_waiters: Cell<usize>,
    timers: RefCell<BTreeMap<(Instant, u64), Waker>>,
    timer_sequence: Cell<u64>,
    pub(crate) remote: std::sync::Arc<RemoteWake>,
    eventfd_armed: Cell<bool>,
    completion_batch_wait_us: u32,
    /// Where the armed eventfd read writes its 8 bytes; boxed so that its address is stable.
    eventfd_buffer: Box<std::cell::UnsafeCell<u64>>,
    /// Reused between turns, to copy completions out of the ring without allocating.
    completions: RefCell<Vec<(u64, i32, u32)>>,
    info: ReactorInfo,
    /// The shard's provided receive buffers (`None`: not configured, or refused by the kernel).
    receive: RefCell<Option<ProvidedBuffers>>,
    /// The kernel refused a multishot receive: plain receives only.
    streams_refused: Cell<bool>,
}

impl Reactor {
    pub(crate) fn new(config: &ReactorConfig) -> io::Result<Reactor> {
        assert!(config.io_depth_max > 0);
        assert!(config.ring_entries as usize > config.io_depth_max + 2);
        let (ring, defer_taskrun) = build_ring(config.ring_entries)?;
        let receive = match config.receive_buffers {
            0 => None,
            count => match ProvidedBuffers::register(&ring, count) {
                Ok(buffers) => Some(buffers),
                Err(error) => {
                    log::info!("no provided receive buffers ({error}); plain receives only");
                    None
                }
            },
        };
        Ok(Reactor {
            external_slots: Cell::new(false),
            ring: RefCell::new(ring),
            slots: RefCell::new(Vec::with_capacity(config.io_depth_max)),
            free_slots: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            bytes_in_flight: Cell::new(0),
            sockets_in_flight: Cell::new(0),
            io_depth_max: config.io_depth_max,
            io_bytes_max: config.io_bytes_max.max(1),
            depth_waiters: RefCell::new(VecDeque::new()),
            next_ticket: Cell::new(0),
            closing_waiters: Cell::new(0),
            timers: RefCell::new(BTreeMap::new()),
            timer_sequence: Cell::new(0),
            remote: std::sync::Arc::new(RemoteWake::new()?),
            eventfd_armed: Cell::new(false),
            completion_batch_wait_us: config.completion_batch_wait_us.min(1_000_000),
            eventfd_buffer: Box::new(std::cell::UnsafeCell::new(0)),
            completions: RefCell::new(Vec::with_capacity(config.ring_entries as usize)),
            info: ReactorInfo { defer_taskrun },
            receive: RefCell::new(receive),
            streams_refused: Cell::new(false),
        })
    }

    pub fn info(&self) -> ReactorInfo {
        self.info
    }

    /// What the shard's provided receive buffers did (all zero without them).
    pub fn receive_stats(&self) -> ReceiveStats {
        self.receive
            .borrow()
            .as_ref()
            .map_or_else(ReceiveStats::default, |buffers| buffers.stats)
    }

    /// Device operations submitted and not yet completed (abandoned ones included).
    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// The bytes those operations move.
    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight.get()
    }

    /// Register `buffers` as the ring's fixed buffers (indices in order). The table gets
    /// `EXTERNAL_FIXED_SLOTS` more empty slots after them when the kernel allows sparse
    /// tables, for memory registered later (`register_external`).
    ///
    /// # Safety
    /// Every iovec must describe memory that stays valid and is not unmapped for as long as the
    /// ring exists.
    pub(crate) unsafe fn register_buffers(&self, buffers: &[libc::iovec]) -> io::Result<()> {
        let ring = self.ring.borrow();
        let submitter = ring.submitter();
        let slots = buffers.len() as u32 + EXTERNAL_FIXED_SLOTS as u32;
        if submitter.register_buffers_sparse(slots).is_ok() {
            match submitter.register_buffers_update(0, buffers, None) {
                Ok(()) => {
                    self.external_slots.set(true);
                    return Ok(());
                }
                Err(_) => {
                    let _ = submitter.unregister_buffers();
                }
            }
        }
        submitter.register_buffers(buffers)
    }

    /// Put `iovec` in fixed-buffer slot `slot` (1 to `EXTERNAL_FIXED_SLOTS`) of this ring.
    ///
    /// # Safety
    /// The memory must stay valid until the slot is emptied with `unregister_external`; the
    /// kernel pins its pages meanwhile.
    pub unsafe fn register_external(&self, slot: u16, iovec: libc::iovec) -> io::Result<()> {
        if !self.external_slots.get() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this ring has no slots for external buffers",
            ));
        }
        check_external_slot(slot)?;
        self.ring
            .borrow()
            .submitter()
            .register_buffers_update(slot as u32, &[iovec], None)
    }

    /// Empty slot `slot`. Reads in flight that use it finish on the pages they pinned.
    pub fn unregister_external(&self, slot: u16) -> io::Result<()> {
        check_external_slot(slot)?;
        if !self.external_slots.get() {
            return Ok(());
        }
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec clears the slot; no memory is described.
        unsafe {
            self.ring
                .borrow()
                .submitter()
                .register_buffers_update(slot as u32, &[empty], None)
        }
    }

    /// Register files as the ring's fixed files (indices in order).
    pub(crate) fn register_files(&self, fds: &[RawFd]) -> io::Result<()> {
        self.ring.borrow().submitter().register_files(fds)
    }

    /// Queue `entry` if the in-flight bounds allow and no waiter ahead of it closes the line;
    /// otherwise remember `waker`, give the operation its place in line (`ticket`, kept by the
    /// caller until it is submitted or dropped) and hand the entry back. On success `keep`
    /// belongs to the ring until the completion arrives.
    pub(crate) fn try_submit(
        &self,
        entry: squeue::Entry,
        keep: Keep,
        waker: &Waker,
        device_bytes: Option<u32>,
        ticket: &mut Option<u64>,
    ) -> Result<usize, (squeue::Entry, Keep)> {
        if let Some(bytes) = device_bytes {
            if !self.has_room_for(bytes) || self.line_closed_before(*ticket) {
                self.wait_in_line(bytes, ticket, waker);
                return Err((entry, keep));
            }
            let first_in_line = self
                .depth_waiters
                .borrow()
                .front()
                .map(|first| first.ticket);
            let mine = ticket.take();
            if let Some(mine) = mine {
                self.leave_waiters(mine);
            }
            if first_in_line.is_some() && first_in_line != mine {
                self.count_a_pass();
            }
        }
        let slot = Slot {
            state: SlotState::Waiting(Some(waker.clone())),
            keep,
            device_bytes,
        };
        let index = self.insert_slot(slot);
        self.push_entry(entry.user_data(index as u64));
        match device_bytes {
            Some(bytes) => {
                self.in_flight.set(self.in_flight.get() + 1);
                self.bytes_in_flight
                    .set(self.bytes_in_flight.get() + u64::from(bytes));
            }
            None => self.sockets_in_flight.set(self.sockets_in_flight.get() + 1),
        }
        Ok(index)
    }

    fn push_entry(&self, entry: squeue::Entry) {
        let mut ring = self.ring.borrow_mut();
        loop {
            // SAFETY: every entry we queue points only at memory held in a slot's `Keep` (or at
            // the reactor's own eventfd counter), which lives until the completion is reaped.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_ok() {
                return;
            }
            // The submission queue is full: hand what is queued to the kernel and retry.
            if let Err(error) = ring.submit() {
                assert!(
                    error.raw_os_error() == Some(libc::EBUSY)
                        || error.raw_os_error() == Some(libc::EINTR),
                    "io_uring submit failed: {error}"
                );
            }
        }
    }

    /// Wake the waiting operations that fit in the room left now, in their order in line; one
    /// that closes the line stops the walk (those behind it wait for it). A woken operation
    /// checks again when it is polled and keeps its place if the room went meanwhile.
    pub(crate) fn pass_depth_wake(&self) {
        let mut operations_left = self.io_depth_max.saturating_sub(self.in_flight.get());
        let mut bytes = self.bytes_in_flight.get();
        // Waking a task only queues it on this thread's executor: nothing here runs it.
        for waiter in self.depth_waiters.borrow().iter() {
            if operations_left == 0 {
                break;
            }
            let size = u64::from(waiter.bytes);
            if bytes == 0 || bytes + size <= self.io_bytes_max {
                waiter.waker.wake_by_ref();
                operations_left -= 1;
                bytes += size;
            } else if waiter.closes_line {
                break;
            }
        }
    }

    /// Poll the completion of slot `index`. Returns the result and the kept resources once the
    /// completion has arrived.
    pub(crate) fn poll_slot(&self, index: usize, waker: &Waker) -> Option<(i32, Keep)> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots[index].as_mut().expect("polled a free slot");
        match &mut slot.state {
            SlotState::Done(result) => {
                let result = *result;
                let slot = slots[index].take().expect("slot vanished");
                self.free_slots.borrow_mut().push(index);
                Some((result, slot.keep))
            }
            SlotState::Waiting(stored) => {
                match stored {
                    Some(existing) if existing.will_wake(waker) => {}
                    _ => *stored = Some(waker.clone()),
                }
                None
            }
            SlotState::Abandoned => unreachable!("polled an abandoned slot"),
            SlotState::Stream { .. } | SlotState::StreamAbandoned => {
                unreachable!("polled a multishot receive as one operation")
            }
        }
    }

    fn insert_slot(&self, slot: Slot) -> usize {
        match self.free_slots.borrow_mut().pop() {
            Some(index) => {
                self.slots.borrow_mut()[index] = Some(slot);
                index
            }
            None => {
                let mut slots = self.slots.borrow_mut();
                slots.push(Some(slot));
                slots.len() - 1
            }
        }
    }

    /// The future of slot `index` was dropped before its completion: the ring keeps the slot
    /// (and the memory in it) until the completion arrives.
    pub(crate) fn abandon_slot(&self, index: usize) {
        let mut slots = self.slots.borrow_mut();
        let slot = slots[index].as_mut().expect("abandoned a free slot");
        match slot.state {
            SlotState::Done(_) => {
                slots[index] = None;
                self.free_slots.borrow_mut().push(index);
            }
            SlotState::Waiting(_) => slot.state = SlotState::Abandoned,
            SlotState::Abandoned => unreachable!("abandoned twice"),
            SlotState::Stream { .. } | SlotState::StreamAbandoned => {
                unreachable!("a multishot receive abandoned as one operation")
            }
        }
    }

    /// Add a timer that wakes `waker` at `deadline`; returns its id for [`Self::cancel_timer`].
    pub(crate) fn add_timer(&self, deadline: Instant, waker: Waker) -> (Instant, u64) {
        let sequence = self.timer_sequence.get();
        self.timer_sequence.set(sequence + 1);
        self.timers.borrow_mut().insert((deadline, sequence), waker);
        (deadline, sequence)
    }

    pub(crate) fn cancel_timer(&self, id: (Instant, u64)) {
        self.timers.borrow_mut().remove(&id);
    }

    /// Keep one read of the eventfd armed so that other threads can wake this one.
    fn arm_eventfd(&self) {
        if self.eventfd_armed.get() {
            return;
        }
        // The kernel writes into `eventfd_buffer`, which lives as long as the reactor; `drain`
        // waits for this read before the reactor goes away.
        let entry = opcode::Read::new(
            types::Fd(self.remote.eventfd.as_raw_fd()),
            self.eventfd_buffer.get().cast(),
            std::mem::size_of::<u64>() as u32,
        )
        .build()
        .user_data(EVENTFD_TAG);
        self.push_entry(entry);
        self.eventfd_armed.set(true);
    }

    /// Submit what is queued and wait for completions: without blocking when `block` is false,
    /// otherwise until a completion, the next timer or a remote wake. Then dispatch every
    /// completion and fire due timers.
    pub(crate) fn turn(&self, block: bool) {
        self.arm_eventfd();
        let deadline = self
            .timers
            .borrow()
            .keys()
            .next()
            .map(|(deadline, _)| *deadline);
        let result = {
            let ring = self.ring.borrow();
            let submitter = ring.submitter();
            match (block, deadline) {
                (false, _) => {
                    // SAFETY: no argument structure is passed; GETEVENTS without a minimum only
                    // runs deferred task work so that ready completions are posted.
                    unsafe {
                        submitter.enter::<libc::sigset_t>(
                            ring_sq_len(&ring),
                            0,
                            io_uring::EnterFlags::GETEVENTS.bits(),
                            None,
                        )
                    }
                }
                (true, None) if self.in_flight.get() >= COMPLETION_BATCH_DIVISOR => {
                    // Many operations in flight: wait for a share of them (or a short while)
                    // before submitting again, so that one io_uring_enter (and one device
                    // doorbell, which costs a VM exit on virtual disks) carries many requests.
                    let want =
                        (self.in_flight.get() / COMPLETION_BATCH_DIVISOR).min(COMPLETION_BATCH_MAX);
                    let timespec =
                        types::Timespec::new().nsec(self.completion_batch_wait_us * 1000);
                    let args = types::SubmitArgs::new().timespec(&timespec);
                    submitter.submit_with_args(want, &args)
                }
                (true, None) => submitter.submit_and_wait(1),
                (true, Some(deadline)) => {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    if wait.is_zero() {
                        submitter.submit()
                    } else {
                        let timespec = timespec_of(wait);
                        let args = types::SubmitArgs::new().timespec(&timespec);
                        submitter.submit_with_args(1, &args)
                    }
                }
            }
        };
        if let Err(error) = result {
            match error.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => {}
                _ => panic!("io_uring_enter failed: {error}"),
            }
        }
        self.reap();
        self.fire_timers();
    }

    fn reap(&self) {
        // Copy the completions out first: waking a task must not hold the ring borrowed.
        let mut completions = std::mem::take(&mut *self.completions.borrow_mut());
        {
            let mut ring = self.ring.borrow_mut();
            for cqe in ring.completion() {
                completions.push((cqe.user_data(), cqe.result(), cqe.flags()));
            }
        }
        for &(user_data, result, flags) in &completions {
            match user_data {
                EVENTFD_TAG => self.eventfd_completed(),
                CANCEL_TAG => {}
                index => self.slot_completed(index as usize, result, flags),
            }
        }
        completions.clear();
        *self.completions.borrow_mut() = completions;
    }

    fn eventfd_completed(&self) {
        self.eventfd_armed.set(false);
        // Reset before the executor drains its remote queue, so that a waker racing with the
        // drain writes the eventfd again (see RemoteWake::notify).
        self.remote.notified.store(false, Ordering::SeqCst);
    }

    fn slot_completed(&self, index: usize, result: i32, flags: u32) {
        let (waker, device_bytes) = {
            let mut slots = self.slots.borrow_mut();
            let slot = slots[index].as_mut().expect("completion for a free slot");
            if matches!(
                slot.state,
                SlotState::Stream { .. } | SlotState::StreamAbandoned
            ) {
                drop(slots);
                self.stream_completed(index, result, flags);
                return;
            }
            let device_bytes = slot.device_bytes;
            let waker = match std::mem::replace(&mut slot.state, SlotState::Done(result)) {
                SlotState::Waiting(waker) => waker,
                SlotState::Abandoned => {
                    slots[index] = None;
                    self.free_slots.borrow_mut().push(index);
                    None
                }
                SlotState::Done(_) => unreachable!("two completions for one slot"),
                SlotState::Stream { .. } | SlotState::StreamAbandoned => unreachable!("above"),
            };
            (waker, device_bytes)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        let Some(bytes) = device_bytes else {
            self.sockets_in_flight.set(self.sockets_in_flight.get() - 1);
            return;
        };
        self.in_flight.set(self.in_flight.get() - 1);
        self.bytes_in_flight
            .set(self.bytes_in_flight.get() - u64::from(bytes));
        self.pass_depth_wake();
    }

    fn fire_timers(&self) {
        let now = Instant::now();
        super::time::set_turn_time(Some(now));
        loop {
            let due = {
                let mut timers = self.timers.borrow_mut();
                match timers.first_key_value() {
                    Some((key, _)) if key.0 <= now => timers.pop_first().map(|(_, waker)| waker),
                    _ => None,
                }
            };
            match due {
                Some(waker) => waker.wake(),
                None => return,
            }
        }
    }

    /// Cancel everything in flight and wait for every completion, so that no memory the kernel
    /// may still touch is freed. Called once, when the shard stops.
    pub(crate) fn drain(&self) {
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_TAG);
        self.push_entry(cancel);
        while self.in_flight.get() > 0
            || self.sockets_in_flight.get() > 0
            || self.eventfd_armed.get()
        {
            if let Err(error) = self.ring.borrow().submitter().submit_and_wait(1) {
                if error.raw_os_error() != Some(libc::EINTR) {
                    panic!("io_uring_enter failed while draining: {error}");
                }
            }
            self.reap();
            if self.eventfd_armed.get() {
                // The eventfd read may not be cancellable on every kernel: complete it by writing.
                self.remote.notified.store(false, Ordering::SeqCst);
                self.remote.notify();
            }
        }
    }
}

fn ring_sq_len(ring: &IoUring) -> u32 {
    // SAFETY: reading the length of the submission queue does not create aliasing entries; the
    // queue is only pushed to through `push_entry`, which holds the RefCell borrow exclusively.
    unsafe { ring.submission_shared().len() as u32 }
}

fn timespec_of(duration: Duration) -> types::Timespec {
    types::Timespec::new()
        .sec(duration.as_secs())
        .nsec(duration.subsec_nanos())
}

/// Build a ring with DEFER_TASKRUN + SINGLE_ISSUER where the kernel has them, else a plain one.
fn build_ring(entries: u32) -> io::Result<(IoUring, bool)> {
    let deferred = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .build(entries);
    match deferred {
        Ok(ring) => Ok((ring, true)),
        Err(error) => {
            log::info!("io_uring without DEFER_TASKRUN ({error}); using a plain ring");
            Ok((IoUring::new(entries)?, false))
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        // The provided buffers' descriptor ring is unregistered while the ring still exists;
        // `drain` (when the shard stops) already waited for every receive that could fill one.
        if let Some(buffers) = self.receive.get_mut().as_ref() {
            buffers.unregister(self.ring.get_mut());
        }
    }
}
