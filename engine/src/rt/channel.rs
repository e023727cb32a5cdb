//! Channels between threads: a bounded multi-producer queue into a shard, and a one-shot reply.
//! The queue itself is lock-free; a mutex is taken only by a sender that found it full.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;

struct Shared<T> {
    queue: ArrayQueue<T>,
    receiver_waker: AtomicWaker,
    receiver_closed: AtomicBool,
    senders: AtomicUsize,
    /// Senders waiting for room; touched only when the queue was full.
    space_waiters: Mutex<VecDeque<Waker>>,
    space_waiting: AtomicUsize,
}

pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A channel that holds at most `capacity` messages; senders wait when it is full.
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    assert!(capacity > 0);
    let shared = Arc::new(Shared {
        queue: ArrayQueue::new(capacity),
        receiver_waker: AtomicWaker::new(),
        receiver_closed: AtomicBool::new(false),
        senders: AtomicUsize::new(1),
        space_waiters: Mutex::new(VecDeque::new()),
        space_waiting: AtomicUsize::new(0),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.receiver_waker.wake();
        }
    }
}

impl<T> Sender<T> {
    /// Send `value`, waiting while the channel is full. Gives the value back if the receiver is
    /// gone.
    pub async fn send(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        poll_fn(|context| {
            let item = value.take().expect("send polled after completion");
            if self.shared.receiver_closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(item));
            }
            let item = match self.shared.queue.push(item) {
                Ok(()) => {
                    self.pushed();
                    return Poll::Ready(Ok(()));
                }
                Err(item) => item,
            };
            {
                let mut waiters = self.shared.space_waiters.lock().expect("poisoned");
                waiters.push_back(context.waker().clone());
                self.shared.space_waiting.fetch_add(1, Ordering::SeqCst);
            }
            // The receiver may have made room between the failed push and the registration.
            match self.shared.queue.push(item) {
                Ok(()) => {
                    self.pushed();
                    Poll::Ready(Ok(()))
                }
                Err(item) => {
                    value = Some(item);
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Send without waiting; gives the value back when the channel is full or closed.
    pub fn try_send(&self, value: T) -> Result<(), T> {
        if self.shared.receiver_closed.load(Ordering::Acquire) {
            return Err(value);
        }
        self.shared.queue.push(value)?;
        self.pushed();
        Ok(())
    }

    fn pushed(&self) {
        // At once, or with the other sends of this thread's turn (rt::batched).
        super::batched::wake(&self.shared.receiver_waker);
        // The receiver may have closed between our check and the push, after draining: drop
        // what is queued so that nothing waits on a reply that will never come.
        if self.shared.receiver_closed.load(Ordering::SeqCst) {
            while self.shared.queue.pop().is_some() {}
        }
    }
}

impl<T> Receiver<T> {
    /// Wake every sender waiting for room. Waking all (not one) means a waker left behind by
    /// a sender that got in on its retry, or was dropped, cannot swallow the wake-up.
    fn popped(&self) {
        if self.shared.space_waiting.load(Ordering::SeqCst) > 0 {
            let waiters = std::mem::take(&mut *self.shared.space_waiters.lock().expect("poisoned"));
            self.shared.space_waiting.store(0, Ordering::SeqCst);
            for waiter in waiters {
                waiter.wake();
            }
        }
    }

    /// The next message, or `None` once every sender is gone and the queue is empty.
    pub fn recv(&self) -> impl Future<Output = Option<T>> + '_ {
        poll_fn(|context| {
            if let Some(item) = self.shared.queue.pop() {
                self.popped();
                return Poll::Ready(Some(item));
            }
            self.shared.receiver_waker.register(context.waker());
            if let Some(item) = self.shared.queue.pop() {
                self.popped();
                return Poll::Ready(Some(item));
            }
            if self.shared.senders.load(Ordering::Acquire) == 0 {
                // The last sender may have pushed just before it went away.
                let last = self.shared.queue.pop();
                return Poll::Ready(last);
            }
            Poll::Pending
        })
    }

    /// A message if one is queued now.
    pub fn try_recv(&self) -> Option<T> {
        let item = self.shared.queue.pop()?;
        self.popped();
        Some(item)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receiver_closed.store(true, Ordering::SeqCst);
        // Drop what is queued: each message's reply channel then tells its caller.
        while self.shared.queue.pop().is_some() {}
        let waiters = std::mem::take(&mut *self.shared.space_waiters.lock().expect("poisoned"));
        for waiter in waiters {
            waiter.wake();
        }
    }
}

struct OneshotShared<T> {
    value: Mutex<Option<T>>,
    waker: AtomicWaker,
    sender_gone: AtomicBool,
}

/// Sends one reply.
pub struct OneshotSender<T> {
    shared: Arc<OneshotShared<T>>,
}

/// Receives one reply; completes with `Err(Canceled)` if the sender is dropped unanswered.
pub struct OneshotReceiver<T> {
    shared: Arc<OneshotShared<T>>,
}

/// The sender of a one-shot channel went away without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canceled;

pub fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let shared = Arc::new(OneshotShared {
        value: Mutex::new(None),
        waker: AtomicWaker::new(),
        sender_gone: AtomicBool::new(false),
    });
    (
        OneshotSender {
            shared: shared.clone(),
        },
        OneshotReceiver { shared },
    )
}

impl<T> OneshotSender<T> {
    pub fn send(self, value: T) {
        *self.shared.value.lock().expect("poisoned") = Some(value);
        // Dropping self marks the sender gone and wakes the receiver.
    }
}

impl<T> Drop for OneshotSender<T> {
    fn drop(&mut self) {
        self.shared.sender_gone.store(true, Ordering::Release);
        self.shared.waker.wake();
    }
}

impl<T> Future for OneshotReceiver<T> {
    type Output = Result<T, Canceled>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.waker.register(context.waker());
        if let Some(value) = self.shared.value.lock().expect("poisoned").take() {
            return Poll::Ready(Ok(value));
        }
        if self.shared.sender_gone.load(Ordering::Acquire) {
            if let Some(value) = self.shared.value.lock().expect("poisoned").take() {
                return Poll::Ready(Ok(value));
            }
            return Poll::Ready(Err(Canceled));
        }
        Poll::Pending
    }
}
