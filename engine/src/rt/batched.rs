//! Shard wake-ups gathered on a thread that has more to do before it sleeps.
//!
//! A thread outside the shards (the S3 endpoint's) that sends a shard a message wakes it at
//! once; where the two share a core the woken shard preempts the sender, answers one request,
//! sleeps, and the sender runs again: two context switches per request. Inside [`Batched`]
//! every send of the thread into an `rt::channel` (a shard's inbox, a streamed PUT's chunks)
//! keeps the receiver's waker instead, and the thread wakes them in one go when it is about to
//! sleep ([`wake_batched`], a runtime's park hook), or when the outermost [`Batched`] poll
//! returns with [`BATCHED_MESSAGES_MAX`] sends held or the oldest held [`BATCHED_WAIT_MAX`].
//! So a shard gets the requests of a whole turn of the sender at once.
//!
//! The bound on a held send's wait (the wait bound plus one task's poll) holds where every task
//! of the runtime is [`Batched`] (checks run after their polls), and a [`Batched`] task must not
//! block its thread on a shard's answer other than through `rt::block_on` (which wakes what it
//! holds before it parks): a thread that never sleeps through its runtime's park would hold its
//! sends for good.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;

/// Sends a thread holds back before it wakes their receivers anyway (checked when the outermost
/// [`Batched`] poll returns, so one poll may hold more).
pub const BATCHED_MESSAGES_MAX: usize = 32;

/// How long the oldest held-back message may wait, checked after each poll of a [`Batched`]
/// future (and not waited for when the thread sleeps sooner).
pub const BATCHED_WAIT_MAX: Duration = Duration::from_micros(50);

#[derive(Default)]
struct Held {
    /// Inside a [`Batched`] poll on this thread.
    active: bool,
    /// The receivers to wake, each once.
    wakers: Vec<Waker>,
    messages: usize,
    since: Option<Instant>,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

/// A receiver's wake-up after a send: now, or held back while a [`Batched`] future of this
/// thread is being polled.
pub(crate) fn wake(receiver: &AtomicWaker) {
    // `try_with`: a send from a thread whose locals are being torn down wakes at once.
    let held = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        if !held.active {
            return (false, None);
        }
        held.messages += 1;
        held.since.get_or_insert_with(Instant::now);
        match receiver.take() {
            Some(waker) if held.wakers.iter().any(|kept| kept.will_wake(&waker)) => {
                // Dropped once the borrow is over: a waker's drop may run other code.
                (true, Some(waker))
            }
            Some(waker) => {
                held.wakers.push(waker);
                (true, None)
            }
            None => (true, None),
        }
    });
    match held {
        Ok((true, duplicate)) => drop(duplicate),
        _ => receiver.wake(),
    }
}

/// Wake every receiver this thread held back. A runtime whose tasks are [`Batched`] calls it
/// before its threads sleep (tokio's `on_thread_park`) and when they stop; `rt::block_on` calls
/// it before it parks its thread.
pub fn wake_batched() {
    let Ok(wakers) = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        held.messages = 0;
        held.since = None;
        std::mem::take(&mut held.wakers)
    }) else {
        return;
    };
    // The rest are woken even if one waker's wake panics.
    struct WakeRest(std::vec::IntoIter<Waker>);
    impl Drop for WakeRest {
        fn drop(&mut self) {
            for waker in self.0.by_ref() {
                waker.wake();
            }
        }
    }
    let mut rest = WakeRest(wakers.into_iter());
    for waker in rest.0.by_ref() {
        waker.wake();
    }
}

/// Whether the held-back messages are too many or too old to keep.
fn due() -> bool {
    HELD.with(|held| {
        let held = held.borrow();
        held.messages >= BATCHED_MESSAGES_MAX
            || held
                .since
                .is_some_and(|since| since.elapsed() >= BATCHED_WAIT_MAX)
    })
}

/// A future whose sends to shards are gathered as the module says. Only for futures polled by a
/// runtime that calls [`wake_batched`] before its threads sleep.
pub struct Batched<F> {
    inner: F,
}

impl<F> Batched<F> {
    pub fn new(inner: F) -> Batched<F> {
        Batched { inner }
    }
}

impl<F: Future> Future for Batched<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of `self`.
        let inner = unsafe { self.map_unchecked_mut(|batched| &mut batched.inner) };
        let outer = HELD.with(|held| std::mem::replace(&mut held.borrow_mut().active, true));
        // Restored even if the poll panics, so that the thread does not go on holding wakes.
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                HELD.with(|held| held.borrow_mut().active = self.0);
            }
        }
        let restore = Restore(outer);
        let result = inner.poll(context);
        drop(restore);
        if !outer && due() {
            wake_batched();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn registered() -> (Arc<Count>, AtomicWaker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let receiver = AtomicWaker::new();
        receiver.register(&Waker::from(count.clone()));
        (count, receiver)
    }

    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let noop = Waker::noop();
        Pin::new(future).poll(&mut Context::from_waker(noop))
    }

    #[test]
    fn outside_a_batched_future_a_send_wakes_at_once() {
        let (count, receiver) = registered();
        wake(&receiver);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn inside_one_the_wake_waits_for_the_thread_to_sleep_and_comes_once() {
        let (count, receiver) = registered();
        let mut sends = Batched::new(std::future::poll_fn(|_| {
            for _ in 0..3 {
                wake(&receiver);
            }
            Poll::Ready(())
        }));
        assert!(poll_once(&mut sends).is_ready());
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "held back");
        wake_batched();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "one wake for three sends"
        );
        wake_batched();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn too_many_or_too_old_messages_are_not_held() {
        let (count, receiver) = registered();
        let mut many = Batched::new(std::future::poll_fn(|_| {
            for _ in 0..BATCHED_MESSAGES_MAX {
                wake(&receiver);
            }
            Poll::Ready(())
        }));
        assert!(poll_once(&mut many).is_ready());
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken after the poll");

        let (count, receiver) = registered();
        let mut one = Batched::new(std::future::poll_fn(|_| {
            wake(&receiver);
            Poll::Ready(())
        }));
        assert!(poll_once(&mut one).is_ready());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        std::thread::sleep(BATCHED_WAIT_MAX * 2);
        let mut later = Batched::new(std::future::ready(()));
        assert!(poll_once(&mut later).is_ready());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "woken once the oldest was too old"
        );
    }

    #[test]
    fn a_block_on_inside_a_batched_poll_wakes_what_it_holds_before_it_parks() {
        let (inbox, requests) =
            crate::rt::channel::bounded::<(u64, crate::rt::channel::OneshotSender<u64>)>(4);
        let shard = crate::rt::start_thread(
            "batched-block-on".into(),
            None,
            crate::rt::ReactorConfig::default(),
            move || async move {
                while let Some((value, reply)) = requests.recv().await {
                    reply.send(value + 1);
                }
            },
        )
        .unwrap();
        // Let the shard go to sleep on its empty inbox first.
        std::thread::sleep(Duration::from_millis(50));
        let (done, answered) = std::sync::mpsc::channel();
        let caller = std::thread::spawn(move || {
            let mut call = Batched::new(std::future::poll_fn(|_| {
                Poll::Ready(crate::rt::block_on(async {
                    let (reply, answer) = crate::rt::channel::oneshot();
                    assert!(inbox.send((41, reply)).await.is_ok());
                    answer.await.unwrap()
                }))
            }));
            let _ = done.send(poll_once(&mut call));
        });
        let answer = answered
            .recv_timeout(Duration::from_secs(30))
            .expect("the shard got the message held back by a block_on");
        assert_eq!(answer, Poll::Ready(42));
        caller.join().unwrap();
        shard.join().unwrap();
    }

    #[test]
    fn a_runtime_that_wakes_before_it_sleeps_strands_no_message() {
        // A shard's executor answers on its own thread; a tokio runtime set up as the S3
        // endpoint's is sends from many batched tasks at once and gets every answer.
        let (inbox, requests) =
            crate::rt::channel::bounded::<(u64, crate::rt::channel::OneshotSender<u64>)>(64);
        let shard = crate::rt::start_thread(
            "batched-test".into(),
            None,
            crate::rt::ReactorConfig::default(),
            move || async move {
                while let Some((value, reply)) = requests.recv().await {
                    reply.send(value * 2);
                }
            },
        )
        .unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .on_thread_park(wake_batched)
            .enable_time()
            .build()
            .unwrap();
        let answers = runtime.block_on(async {
            // One at a time, the shard asleep before each: only the wake before the runtime's
            // thread sleeps gets the message there.
            let one_by_one = inbox.clone();
            let alone = tokio::spawn(Batched::new(async move {
                for value in 0..100u64 {
                    let (reply, answer) = crate::rt::channel::oneshot();
                    assert!(one_by_one.send((value, reply)).await.is_ok());
                    assert_eq!(answer.await.unwrap(), value * 2);
                }
            }));
            tokio::time::timeout(Duration::from_secs(30), alone)
                .await
                .expect("each message reached the shard")
                .unwrap();
            let tasks: Vec<_> = (0..500u64)
                .map(|value| {
                    let inbox = inbox.clone();
                    tokio::spawn(Batched::new(async move {
                        let (reply, answer) = crate::rt::channel::oneshot();
                        assert!(inbox.send((value, reply)).await.is_ok());
                        answer.await.unwrap()
                    }))
                })
                .collect();
            tokio::time::timeout(Duration::from_secs(30), async {
                let mut answers = Vec::new();
                for task in tasks {
                    answers.push(task.await.unwrap());
                }
                answers
            })
            .await
            .expect("every message reached the shard")
        });
        assert_eq!(
            answers,
            (0..500u64).map(|value| value * 2).collect::<Vec<_>>()
        );
        drop(inbox);
        shard.join().unwrap();
    }
}
