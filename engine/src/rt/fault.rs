//! A faulty device for tests: a plan, installed on one shard thread, that the device operations
//! of [`super::op`] consult before they are submitted and after they complete. It can
//!
//! - fail the Nth device write, read or flush (fdatasync) with EIO, counted from when the fault
//!   is armed;
//! - tear the failing write: only its first k sectors reach the file, then EIO;
//! - stop the device: after N operations every later one fails;
//! - keep what a power cut could take: the old bytes under every write that no successful flush
//!   has covered yet, so that [`FaultPlan::lose_unflushed`] can put back a random subset of them
//!   (whole sectors) and the next open sees what a device that lost its volatile cache would show.
//!
//! It is compiled always, because the store's randomized fault test (`engine/tests/faults.rs`)
//! is a whole-system test and a cargo feature enabled only for the engine's own tests would
//! still be unified into every workspace build. Inert (no plan installed, the only state outside
//! such a test), each device operation pays one read of a thread-local flag: about a
//! nanosecond beside an NVMe operation's ten microseconds or more.
//!
//! The plan reads old bytes and writes torn prefixes through its own ordinary (buffered) handle
//! on the device file, with positioned reads and writes: no raw pointers, no `unsafe`. A store
//! tested this way runs on one device file. A write whose future is dropped before it completes
//! stays "in flight" for the plan, and so may be lost at a power cut whatever flushes follow: the
//! store never counts such a write as durable either.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::op::FileRef;

thread_local! {
    /// Whether a plan is installed on this thread: the one check an inert hook makes.
    static INSTALLED: Cell<bool> = const { Cell::new(false) };
    static PLAN: RefCell<Option<FaultPlan>> = const { RefCell::new(None) };
}

/// The one fault a plan injects once armed. Counts are 1-based and start when it is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// No fault: the plan only counts operations and keeps what a power cut could lose.
    None,
    /// The `nth` write fails with EIO after its first `sectors_written` sectors of
    /// `sector_bytes` reached the file (0: nothing did; the write's length or more: all of it
    /// did, and it is still reported failed). Later writes succeed.
    Write {
        nth: u64,
        sectors_written: u64,
        sector_bytes: u64,
    },
    /// The `nth` read fails with EIO; later reads succeed.
    Read { nth: u64 },
    /// The `nth` flush fails with EIO without making anything durable; later flushes succeed.
    Flush { nth: u64 },
    /// After `operations` more device operations of any kind, the device is gone: every later
    /// read, write and flush fails with EIO.
    Stop { operations: u64 },
}

/// Device operations a plan failed, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub writes: u64,
    pub reads: u64,
    pub flushes: u64,
}

impl Injected {
    pub fn any(&self) -> bool {
        self.writes + self.reads + self.flushes > 0
    }
}

/// Device operations seen since the fault was armed, by kind.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    writes: u64,
    reads: u64,
    flushes: u64,
    operations: u64,
}

/// A write that no successful flush has covered yet: the bytes it replaced.
struct Unflushed {
    offset: u64,
    old: Vec<u8>,
    /// Its place in the order of completions; `None` while it is in flight.
    completed: Option<u64>,
}

/// What a power cut took back, for the test's report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Loss {
    /// Writes that no flush covered.
    pub writes: u64,
    /// Sectors of them put back to their old bytes.
    pub sectors_lost: u64,
    pub sectors_kept: u64,
}

/// A faulty device: what to inject and when, and what a power cut could lose.
pub struct FaultPlan {
    /// The device file, opened apart from the store's descriptor: old bytes and torn prefixes.
    file: File,
    /// The one file the store under test uses (set by its first operation).
    device: Option<FileRef>,
    fault: Fault,
    seen: Seen,
    stopped: bool,
    injected: Injected,
    record_unflushed: bool,
    /// By id, in the order the writes were submitted.
    unflushed: BTreeMap<u64, Unflushed>,
    next_write: u64,
    completions: u64,
}

/// Handed from a write's submission to its completion.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteTicket(Option<u64>);

/// Handed from a flush's submission to its completion: the completions it covers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlushTicket(Option<u64>);

impl FaultPlan {
    /// A plan over the device file `file` (any handle that reads and writes it), with no fault
    /// armed and nothing recorded for power cuts.
    pub fn new(file: File) -> FaultPlan {
        FaultPlan {
            file,
            device: None,
            fault: Fault::None,
            seen: Seen::default(),
            stopped: false,
            injected: Injected::default(),
            record_unflushed: false,
            unflushed: BTreeMap::new(),
            next_write: 0,
            completions: 0,
        }
    }

    /// Keep the old bytes under every write until a flush covers it (one read of the range
    /// before each write), so that [`FaultPlan::lose_unflushed`] can undo it.
    pub fn recording_unflushed(mut self) -> FaultPlan {
        self.record_unflushed = true;
        self
    }

    pub fn injected(&self) -> Injected {
        self.injected
    }

    /// Simulate a power cut: for every write no successful flush covered, newest first, put
    /// back each of its `sector_bytes` sectors to the bytes it replaced with probability one
    /// half (drawn from `seed`). Forgets them afterwards. Call with the store closed.
    pub fn lose_unflushed(&mut self, seed: u64, sector_bytes: u64) -> io::Result<Loss> {
        assert!(sector_bytes.is_power_of_two() && sector_bytes >= 512);
        let mut random = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut loss = Loss::default();
        for write in std::mem::take(&mut self.unflushed).into_values().rev() {
            loss.writes += 1;
            assert!(write.offset.is_multiple_of(sector_bytes));
            for (index, sector) in write.old.chunks(sector_bytes as usize).enumerate() {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                if random & 1 == 0 {
                    let offset = write.offset + (index as u64) * sector_bytes;
                    self.file.write_all_at(sector, offset)?;
                    loss.sectors_lost += 1;
                } else {
                    loss.sectors_kept += 1;
                }
            }
        }
        Ok(loss)
    }

    fn note_device(&mut self, file: FileRef) {
        let device = *self.device.get_or_insert(file);
        assert_eq!(device, file, "a fault plan covers one device file");
    }

    /// Count one operation; true if it must fail.
    fn count(&mut self, kind: Kind) -> bool {
        self.seen.operations += 1;
        let nth = match kind {
            Kind::Write => {
                self.seen.writes += 1;
                self.seen.writes
            }
            Kind::Read => {
                self.seen.reads += 1;
                self.seen.reads
            }
            Kind::Flush => {
                self.seen.flushes += 1;
                self.seen.flushes
            }
        };
        if let Fault::Stop { operations } = self.fault {
            if self.seen.operations > operations {
                self.stopped = true;
            }
        }
        let fails = self.stopped
            || match (self.fault, kind) {
                (Fault::Write { nth: at, .. }, Kind::Write) => nth == at,
                (Fault::Read { nth: at }, Kind::Read) => nth == at,
                (Fault::Flush { nth: at }, Kind::Flush) => nth == at,
                _ => false,
            };
        if fails {
            match kind {
                Kind::Write => self.injected.writes += 1,
                Kind::Read => self.injected.reads += 1,
                Kind::Flush => self.injected.flushes += 1,
            }
        }
        fails
    }

    fn before_write(
        &mut self,
        file: FileRef,
        offset: u64,
        bytes: &[u8],
    ) -> io::Result<WriteTicket> {
        self.note_device(file);
        if !self.count(Kind::Write) {
            let id = self.record(offset, bytes.len());
            return Ok(WriteTicket(id));
        }
        let torn = match self.fault {
            Fault::Write {
                sectors_written,
                sector_bytes,
                ..
            } if !self.stopped => {
                (sectors_written.saturating_mul(sector_bytes) as usize).min(bytes.len())
            }
            _ => 0,
        };
        if torn > 0 {
            let id = self.record(offset, torn);
            self.file
                .write_all_at(&bytes[..torn], offset)
                .expect("the fault plan writes the torn prefix");
            self.complete(WriteTicket(id));
        }
        Err(eio())
    }

    /// Keep the `len` bytes at `offset` that a write is about to replace; its id.
    fn record(&mut self, offset: u64, len: usize) -> Option<u64> {
        if !self.record_unflushed {
            return None;
        }
        let mut old = vec![0; len];
        self.file
            .read_exact_at(&mut old, offset)
            .expect("the fault plan reads the bytes a write replaces");
        let id = self.next_write;
        self.next_write += 1;
        self.unflushed.insert(
            id,
            Unflushed {
                offset,
                old,
                completed: None,
            },
        );
        Some(id)
    }

    fn complete(&mut self, ticket: WriteTicket) {
        let Some(id) = ticket.0 else { return };
        self.completions += 1;
        // Still there: only a flush drops a record, and only once it has completed.
        let write = self
            .unflushed
            .get_mut(&id)
            .expect("a write in flight is recorded");
        assert!(write.completed.is_none());
        write.completed = Some(self.completions);
    }

    /// A flush succeeded that was submitted after `ticket`'s completions: those writes are
    /// durable. Writes that completed later (or are still in flight) are not.
    fn flushed(&mut self, ticket: FlushTicket) {
        let Some(covered) = ticket.0 else { return };
        self.unflushed
            .retain(|_, write| write.completed.is_none_or(|at| at > covered));
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Write,
    Read,
    Flush,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn with_plan<R>(f: impl FnOnce(&mut FaultPlan) -> R) -> R {
    PLAN.with(|plan| {
        f(plan
            .borrow_mut()
            .as_mut()
            .expect("a fault plan is installed"))
    })
}

/// Install `plan` on this thread: every device operation of this thread consults it.
pub fn install(plan: FaultPlan) {
    PLAN.with(|slot| {
        let previous = slot.borrow_mut().replace(plan);
        assert!(previous.is_none(), "one fault plan per thread");
    });
    INSTALLED.set(true);
}

/// Remove this thread's plan, if any, and hand it back.
pub fn take() -> Option<FaultPlan> {
    INSTALLED.set(false);
    PLAN.with(|slot| slot.borrow_mut().take())
}

/// Arm `fault` in this thread's plan; its counts start now.
pub fn arm(fault: Fault) {
    with_plan(|plan| {
        plan.fault = fault;
        plan.seen = Seen::default();
        plan.stopped = false;
    });
}

/// What this thread's plan has failed so far (nothing when none is installed).
pub fn injected() -> Injected {
    if !INSTALLED.get() {
        return Injected::default();
    }
    with_plan(|plan| plan.injected)
}

#[inline]
pub(crate) fn before_read() -> io::Result<()> {
    if !INSTALLED.get() {
        return Ok(());
    }
    match with_plan(|plan| plan.count(Kind::Read)) {
        true => Err(eio()),
        false => Ok(()),
    }
}

/// Whether a plan is installed on this thread (a caller that would build the bytes of a write
/// only for the plan asks first).
#[inline]
pub(crate) fn installed() -> bool {
    INSTALLED.get()
}

#[inline]
pub(crate) fn before_write(file: FileRef, offset: u64, bytes: &[u8]) -> io::Result<WriteTicket> {
    if !INSTALLED.get() {
        return Ok(WriteTicket(None));
    }
    with_plan(|plan| plan.before_write(file, offset, bytes))
}

/// The write of `ticket` completed (successfully or not: its bytes may have reached the device).
#[inline]
pub(crate) fn after_write(ticket: WriteTicket) {
    if ticket.0.is_some() && INSTALLED.get() {
        with_plan(|plan| plan.complete(ticket));
    }
}

#[inline]
pub(crate) fn before_flush(file: FileRef) -> io::Result<FlushTicket> {
    if !INSTALLED.get() {
        return Ok(FlushTicket(None));
    }
    with_plan(|plan| {
        plan.note_device(file);
        if plan.count(Kind::Flush) {
            return Err(eio());
        }
        Ok(FlushTicket(
            plan.record_unflushed.then_some(plan.completions),
        ))
    })
}

/// The flush of `ticket` completed; on success every write completed before it began is durable.
#[inline]
pub(crate) fn after_flush(ticket: FlushTicket, succeeded: bool) {
    if succeeded && ticket.0.is_some() && INSTALLED.get() {
        with_plan(|plan| plan.flushed(ticket));
    }
}
