//! Timers on the shard's reactor: the reactor's wait in `io_uring_enter` ends at the earliest one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::executor::with_reactor;

thread_local! {
    /// When this shard's reactor last came back from the ring.
    static TURN_TIME: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The time the reactor last came back from waiting on the ring: what a task woken by that
/// turn sees as "now" to within the turn's work, without reading the clock. Off a shard thread
/// (or before the first turn), the clock's time.
pub fn now_coarse() -> Instant {
    TURN_TIME
        .with(std::cell::Cell::get)
        .unwrap_or_else(Instant::now)
}

/// Record the time a turn came back from the ring (the reactor, once per turn; `None` when the
/// executor stops, so that nothing later on this thread sees its last turn).
pub(crate) fn set_turn_time(now: Option<Instant>) {
    TURN_TIME.with(|time| time.set(now));
}

/// Completes once `duration` has passed. Only on a shard thread.
pub fn sleep(duration: Duration) -> Sleep {
    Sleep {
        deadline: Instant::now() + duration,
        timer: None,
    }
}

pub struct Sleep {
    deadline: Instant,
    timer: Option<(Instant, u64)>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            if let Some(timer) = self.timer.take() {
                with_reactor(|reactor| reactor.cancel_timer(timer));
            }
            return Poll::Ready(());
        }
        // Re-register on every poll so that the latest waker is the one woken.
        if let Some(timer) = self.timer.take() {
            with_reactor(|reactor| reactor.cancel_timer(timer));
        }
        let deadline = self.deadline;
        let waker = context.waker().clone();
        self.timer = Some(with_reactor(|reactor| reactor.add_timer(deadline, waker)));
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            with_reactor(|reactor| reactor.cancel_timer(timer));
        }
    }
}
