//! Many reads in flight on one same-host connection: a submission and a completion queue in
//! memory shared with one shard of the server (RING_OPEN). Submitting writes an entry and moves a
//! counter; a doorbell (an eventfd write) is rung only when the shard said it may sleep, and the
//! client sleeps on its own doorbell only when no completion is there.
//!
//! ```no_run
//! # fn main() -> hydrant_client::Result<()> {
//! use hydrant_client::local::{LocalClient, LocalGet};
//! let mut client = LocalClient::connect("/run/hydrant.sock")?;
//! let region = client.allocate(32 << 20)?;
//! let mut ring = client.open_ring(&region, 32, None)?;
//! for slot in 0..32u64 {
//!     let get = LocalGet {
//!         offset: slot << 20,
//!         length: 1 << 20,
//!         bucket: "bucket".into(),
//!         key: format!("shard-{slot}"),
//!         range: None,
//!     };
//!     ring.push(&get, slot)?;
//! }
//! ring.submit();
//! let mut done = Vec::new();
//! while ring.in_flight() > 0 {
//!     ring.wait(1, &mut done, None)?;
//! }
//! for completion in &done {
//!     let info = completion.result.as_ref().expect("read");
//!     let offset = (completion.user_data << 20) as usize;
//!     let _bytes = &region.as_slice()[offset..offset + info.written as usize];
//! }
//! # Ok(()) }
//! ```
//!
//! A ring belongs to its connection and reads into one region of it: the server stops it when
//! the connection closes or the region is freed, once its reads in flight have ended.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use hydrant_proto::local::LOCAL_RANGE_TO_END;
use hydrant_proto::local_ring::{
    cqe_offset, ring_file_bytes, sqe_offset, RingCompletion, RingInfo, RingSubmission,
    LOCAL_RING_CQE_BYTES, LOCAL_RING_SQE_BYTES, RING_CLIENT_WAITING, RING_CLOSED, RING_CQ_HEAD,
    RING_CQ_TAIL, RING_SERVER_IDLE, RING_SQ_HEAD, RING_SQ_TAIL,
};
use hydrant_proto::Status;

use super::{LocalGet, ReadInfo};
use crate::{ClientError, Result};

/// A completed read: the `user_data` it was pushed with, and how it went.
#[derive(Debug)]
pub struct RingDone {
    pub user_data: u64,
    pub result: Result<ReadInfo>,
}

/// A same-host read ring (see the module's documentation).
pub struct LocalRing {
    _memfd: OwnedFd,
    /// The shared ring file; the server writes completions and its counters into it.
    mapping: MmapRaw,
    submit: OwnedFd,
    complete: OwnedFd,
    /// A handle on the connection, to notice the server going away while waiting.
    socket: UnixStream,
    info: RingInfo,
    region: u32,
    region_bytes: u64,
    connection: u64,
    /// Entries written, and those of them published to the server.
    pushed: u32,
    published: u32,
    /// Completions consumed.
    consumed: u32,
}

impl LocalRing {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        memfd: OwnedFd,
        submit: OwnedFd,
        complete: OwnedFd,
        socket: UnixStream,
        info: RingInfo,
        region: u32,
        region_bytes: u64,
        connection: u64,
    ) -> Result<LocalRing> {
        if info.entries == 0 || !info.entries.is_power_of_two() {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the server answered a ring of {} entries", info.entries),
            )));
        }
        // A shared mapping of the whole ring file, which the server sized and sealed against
        // shrinking; both sides reach it only through raw pointers and atomics.
        let mapping = MmapOptions::new()
            .len(ring_file_bytes(info.entries))
            .map_raw(&memfd)?;
        Ok(LocalRing {
            _memfd: memfd,
            mapping,
            submit,
            complete,
            socket,
            info,
            region,
            region_bytes,
            connection,
            pushed: 0,
            published: 0,
            consumed: 0,
        })
    }

    pub fn entries(&self) -> u32 {
        self.info.entries
    }

    /// The shard that serves this ring, and how many the server has.
    pub fn shard(&self) -> u32 {
        self.info.shard
    }

    pub fn shards(&self) -> u32 {
        self.info.shards
    }

    /// The shard that owns `bucket/key` (reads of it are cheapest on that shard's ring).
    pub fn shard_for(&self, bucket: &str, key: &str) -> u32 {
        crate::placement::shard_for(
            self.info.placement_hash,
            self.info.shards as u16,
            bucket,
            key,
        )
        .unwrap_or(0) as u32
    }

    /// Reads pushed and not yet taken back as completions.
    pub fn in_flight(&self) -> u32 {
        self.pushed.wrapping_sub(self.consumed)
    }

    /// Entries that may still be pushed.
    pub fn room(&self) -> u32 {
        self.info.entries - self.in_flight()
    }

    /// Whether `region` is the one this ring reads into.
    pub fn reads_into(&self, region: &super::Region) -> bool {
        region.connection == self.connection && region.id == self.region
    }

    /// Write a read into the next entry; the server sees it after `submit`. An error, with
    /// nothing written, when the ring is full or the place is outside the region.
    pub fn push(&mut self, get: &LocalGet, user_data: u64) -> Result<()> {
        if get
            .offset
            .checked_add(get.length)
            .is_none_or(|end| end > self.region_bytes)
        {
            return Err(ClientError::Usage(format!(
                "offset {} + length {} is outside the region of {} bytes",
                get.offset, get.length, self.region_bytes
            )));
        }
        let (range_start, range_end) = match get.range {
            None => (0, LOCAL_RANGE_TO_END),
            Some((start, end)) => (start, end.unwrap_or(LOCAL_RANGE_TO_END)),
        };
        let submission = RingSubmission {
            user_data,
            offset: get.offset,
            length: get.length,
            range_start,
            range_end,
            bucket: get.bucket.clone(),
            key: get.key.clone(),
        };
        let mut slot = [0u8; LOCAL_RING_SQE_BYTES];
        submission
            .encode_into(&mut slot)
            .map_err(|error| ClientError::Usage(error.to_string()))?;
        self.push_raw(&slot)
    }

    /// Write raw bytes as the next entry (for tests of the server's checks).
    #[doc(hidden)]
    pub fn push_raw(&mut self, slot: &[u8; LOCAL_RING_SQE_BYTES]) -> Result<()> {
        if self.room() == 0 {
            return Err(ClientError::Usage(format!(
                "the ring's {} entries are in flight: take completions first",
                self.info.entries
            )));
        }
        let offset = sqe_offset(self.info.entries, self.pushed);
        // SAFETY: the slot lies inside the mapping (ring_file_bytes); the server reads it only
        // once it is published, after this write.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slot.as_ptr(),
                self.mapping.as_mut_ptr().add(offset),
                LOCAL_RING_SQE_BYTES,
            )
        };
        self.pushed = self.pushed.wrapping_add(1);
        Ok(())
    }

    /// Set the submission counter the server reads to `tail`, whatever was pushed (for tests
    /// of the server's bounds against a client that lies).
    #[doc(hidden)]
    pub fn publish_raw_tail(&mut self, tail: u32) {
        self.counter(RING_SQ_TAIL).store(tail, Ordering::Release);
        self.wake_server();
    }

    /// Entries the server has taken (its counter in the ring file).
    pub fn taken_by_server(&self) -> u32 {
        self.counter(RING_SQ_HEAD).load(Ordering::Acquire)
    }

    /// Publish the entries pushed since the last submit, and ring the server if it may sleep.
    pub fn submit(&mut self) {
        if self.published == self.pushed {
            return;
        }
        self.published = self.pushed;
        self.counter(RING_SQ_TAIL)
            .store(self.published, Ordering::Release);
        self.wake_server();
    }

    /// The completions there now, appended to `done`; never waits. Returns how many.
    pub fn completions(&mut self, done: &mut Vec<RingDone>) -> usize {
        let tail = self.counter(RING_CQ_TAIL).load(Ordering::Acquire);
        let mut taken = 0;
        while self.consumed != tail && self.in_flight() > 0 {
            let offset = cqe_offset(self.info.entries, self.consumed);
            let mut copy = [0u8; LOCAL_RING_CQE_BYTES];
            // SAFETY: the slot lies inside the mapping; the server wrote it before it published
            // cq_tail (acquired above) and does not write it again before we consume it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.mapping.as_ptr().add(offset),
                    copy.as_mut_ptr(),
                    LOCAL_RING_CQE_BYTES,
                )
            };
            let completion = RingCompletion::decode(&copy);
            self.consumed = self.consumed.wrapping_add(1);
            taken += 1;
            done.push(match completion {
                Ok(completion) => RingDone {
                    user_data: completion.user_data,
                    result: if completion.status == Status::Ok as u8 {
                        Ok(ReadInfo {
                            object_bytes: completion.object_bytes,
                            range_start: completion.range_start,
                            written: completion.written,
                        })
                    } else {
                        Err(ClientError::Status {
                            status: completion.status,
                            message: completion.message,
                        })
                    },
                },
                Err(error) => RingDone {
                    user_data: u64::MAX,
                    result: Err(ClientError::Io(io::Error::new(
                        io::ErrorKind::InvalidData,
                        error.to_string(),
                    ))),
                },
            });
        }
        if taken > 0 {
            self.counter(RING_CQ_HEAD)
                .store(self.consumed, Ordering::Release);
            // A server that stopped for want of completion room waits for this (only if it
            // has entries left to take).
            if self.counter(RING_SQ_HEAD).load(Ordering::Acquire) != self.published {
                self.wake_server();
            }
        }
        taken
    }

    /// Submit what was pushed, then wait until at least `min` completions (no more than are in
    /// flight) have been appended to `done`, or `timeout` passes (an error then; those that
    /// came are in `done`). An error too if the server goes away meanwhile.
    pub fn wait(
        &mut self,
        min: usize,
        done: &mut Vec<RingDone>,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        wait_rings(std::slice::from_mut(self), min, done, timeout)
    }

    /// Say the client may sleep until `wanted` completions are unconsumed, then look once
    /// more: true if a completion came in between (the request is then taken back), else the
    /// server sees it and rings once that many are there.
    fn arm_doorbell(&self, wanted: u32) -> bool {
        self.counter(RING_CLIENT_WAITING)
            .store(wanted.max(1), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.counter(RING_CQ_TAIL).load(Ordering::Acquire) != self.consumed {
            self.counter(RING_CLIENT_WAITING).store(0, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Whether the server stopped this ring (its region freed, its connection closed) with
    /// nothing more to consume: reads in flight will never complete.
    fn closed(&self) -> bool {
        self.counter(RING_CLOSED).load(Ordering::Acquire) != 0
            && self.counter(RING_CQ_TAIL).load(Ordering::Acquire) == self.consumed
    }

    fn wake_server(&self) {
        fence(Ordering::SeqCst);
        if self.counter(RING_SERVER_IDLE).load(Ordering::SeqCst) != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 bytes from a live array; a full counter (EAGAIN) is already a ring.
            unsafe { libc::write(self.submit.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    fn counter(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the counters lie in the mapping's first page, 64-byte aligned, reached only
        // through this raw pointer; the server changes them concurrently, which atomics allow.
        unsafe { &*(self.mapping.as_ptr().add(offset) as *const AtomicU32) }
    }
}

/// Submit what was pushed on each of `rings` (say, one per shard of a server, over one region),
/// then wait until at least `min` completions from any of them (no more than are in flight in
/// all) have been appended to `done`, or `timeout` passes (an error then; those that came are in
/// `done`). An error too if the server goes away meanwhile.
pub fn wait_rings(
    rings: &mut [LocalRing],
    min: usize,
    done: &mut Vec<RingDone>,
    timeout: Option<Duration>,
) -> Result<usize> {
    for ring in rings.iter_mut() {
        ring.submit();
    }
    let in_flight: usize = rings.iter().map(|ring| ring.in_flight() as usize).sum();
    let min = min.min(in_flight);
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let harvest = |rings: &mut [LocalRing], done: &mut Vec<RingDone>| -> usize {
        rings.iter_mut().map(|ring| ring.completions(done)).sum()
    };
    let mut taken = harvest(rings, done);
    while taken < min {
        if let Some(ring) = rings
            .iter()
            .find(|ring| ring.in_flight() > 0 && ring.closed())
        {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!(
                    "the server closed the ring with {} reads in flight (its region was freed or its connection closed)",
                    ring.in_flight()
                ),
            )));
        }
        // One ring is asked to wake this thread once it has what is still needed (or all it
        // has in flight); several are each asked for one, since what is needed may come from
        // any of them.
        let needed = (min - taken) as u32;
        let busy = rings.iter().filter(|ring| ring.in_flight() > 0).count();
        if rings.iter().any(|ring| {
            let wanted = if busy > 1 {
                1
            } else {
                needed.min(ring.in_flight())
            };
            ring.in_flight() > 0 && ring.arm_doorbell(wanted)
        }) {
            taken += harvest(rings, done);
            continue;
        }
        let wait_ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{taken} of {min} completions came in time"),
                    )));
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        sleep(rings, wait_ms)?;
        taken += harvest(rings, done);
    }
    Ok(taken)
}

/// Sleep until a completion doorbell of `rings` rings, a connection hangs up, or `wait_ms`
/// pass.
fn sleep(rings: &[LocalRing], wait_ms: i32) -> Result<()> {
    let mut fds: Vec<libc::pollfd> = rings
        .iter()
        .flat_map(|ring| {
            [
                libc::pollfd {
                    fd: ring.complete.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: ring.socket.as_raw_fd(),
                    events: libc::POLLRDHUP,
                    revents: 0,
                },
            ]
        })
        .collect();
    // SAFETY: a live array of fds.len() pollfds.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(error.into());
    }
    for (ring, pair) in rings.iter().zip(fds.chunks_exact(2)) {
        if pair[0].revents & libc::POLLIN != 0 {
            let mut count = [0u8; 8];
            // SAFETY: at most 8 bytes into a live array; the eventfd is non-blocking.
            unsafe { libc::read(ring.complete.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        if pair[1].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
            && ring.counter(RING_CQ_TAIL).load(Ordering::Acquire) == ring.consumed
        {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server closed the connection with reads in flight on its ring",
            )));
        }
    }
    Ok(())
}
