//! The per-core runtime: one thread per shard, pinned to its core, running a single-threaded
//! async executor whose only source of wake-ups is its own io_uring ring.
//!
//! - [`Reactor`] owns the ring and a table of in-flight operations. A buffer handed to the ring
//!   is moved into that table and stays there until the completion arrives, whatever happens to
//!   the future that asked for it (see [`op`]).
//! - The executor polls ready tasks, submits everything they queued in one `io_uring_enter`, and
//!   when nothing is ready sleeps inside `io_uring_enter` until a completion, a timer or a wake-up
//!   from another thread (an eventfd read kept armed on the ring). It never spins.
//! - Device I/O in flight per shard is bounded by `io_depth_max` operations and `io_bytes_max`
//!   bytes; an operation past either bound waits before it is submitted (one larger than the
//!   byte bound goes alone). Socket operations are not counted.
//! - A connection waiting for small requests keeps one multishot receive armed ([`net::RecvStream`]):
//!   the kernel fills the shard's provided buffers as bytes arrive, with no submission per
//!   request. A receive that leaves `STREAM_BUFFERS_UNREAD_MAX` buffers unread is cancelled, one
//!   that finds none free ends, and its connection goes on with a plain receive.
//! - A thread outside the shards whose tasks are [`batched::Batched`] wakes a shard once per
//!   turn of its own, not once per message (so that a shard sharing its core does not preempt
//!   it for every request).
//! - [`fault`] is a faulty device for tests (failed, torn and lost writes, failed reads and
//!   flushes, a device that stops); with no plan installed, device operations pass it by.

pub mod batched;
pub mod channel;
mod executor;
pub mod fault;
pub mod net;
pub mod op;
mod provided;
mod reactor;
pub mod sync;
pub mod time;

pub use executor::current_reactor;
/// A shard's executor on the calling thread, for the engine's own async unit tests.
#[cfg(test)]
pub(crate) use executor::run;
pub use executor::{block_on, spawn, JoinHandle};
pub use provided::{receive_buffers_valid, ReceiveStats, RECEIVE_BUFFER_BYTES};
pub use reactor::{
    Reactor, ReactorConfig, ReactorInfo, EXTERNAL_FIXED_SLOTS, IO_BYTES_MAX_DEFAULT,
    RECEIVE_BUFFERS_DEFAULT, STREAM_BUFFERS_UNREAD_MAX, WAITER_PASSES_MAX,
};

use std::future::Future;
use std::io;

/// Start a shard thread named `name`, optionally pinned to `cpu`, build its ring and run
/// `main` on its executor until `main` completes. Other tasks still running then are dropped
/// and every operation still in flight is reaped before the ring and its buffers go away.
pub fn start_thread<F, Fut>(
    name: String,
    cpu: Option<usize>,
    config: ReactorConfig,
    main: F,
) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    std::thread::Builder::new().name(name).spawn(move || {
        if let Some(cpu) = cpu {
            pin_current_thread(cpu);
        }
        // A panic would unwind through the reactor and free buffers the kernel may still be
        // writing into: stop the process instead (a broken invariant is not recoverable).
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| executor::run(config, main)));
        if outcome.is_err() {
            eprintln!("hydrant: a shard thread panicked; aborting so that no in-flight I/O touches freed memory");
            std::process::abort();
        }
    })
}

/// Pin the calling thread to one CPU. Failure (a restricted cpuset, for example) is logged and
/// otherwise ignored: pinning is a performance hint, not a correctness requirement.
pub fn pin_current_thread(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it, and
    // sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes from it.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        log::warn!(
            "could not pin a thread to cpu {cpu}: {}",
            io::Error::last_os_error()
        );
    }
}
