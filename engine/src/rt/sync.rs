//! Synchronisation between tasks of one shard. Everything here is single-threaded (`!Send`): a
//! shard owns its state, so these are queues of wakers, not locks.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Most waiters whose list a `WaitQueue` keeps allocated once they are woken.
const WAITERS_KEPT_MAX: usize = 16;

/// Tasks waiting for a condition that another task will announce with [`WaitQueue::wake_all`].
#[derive(Default)]
pub struct WaitQueue {
    waiters: RefCell<Vec<Waker>>,
}

impl WaitQueue {
    pub fn new() -> WaitQueue {
        WaitQueue::default()
    }

    /// Completes after the next `wake_all` (or spuriously): callers re-check their condition in
    /// a loop.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        let mut registered = false;
        poll_fn(move |context| {
            if registered {
                return Poll::Ready(());
            }
            registered = true;
            self.waiters.borrow_mut().push(context.waker().clone());
            Poll::Pending
        })
    }

    pub fn wake_all(&self) {
        let mut waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        if waiters.is_empty() {
            *self.waiters.borrow_mut() = waiters;
            return;
        }
        for waiter in waiters.drain(..) {
            waiter.wake();
        }
        // Keep the list's memory for the next waiters (a queue waited on in a loop would
        // otherwise allocate on every wait), unless a crowd once made it large.
        let mut current = self.waiters.borrow_mut();
        if current.is_empty() && waiters.capacity() <= WAITERS_KEPT_MAX {
            *current = waiters;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.borrow().is_empty()
    }
}

/// An async mutual-exclusion flag for one shard's tasks (no data inside: it orders sections of
/// async code that must not interleave, such as opening a new region).
#[derive(Default)]
pub struct Section {
    held: Cell<bool>,
    queue: WaitQueue,
}

pub struct SectionGuard<'a> {
    section: &'a Section,
}

impl Section {
    pub async fn enter(&self) -> SectionGuard<'_> {
        while self.held.get() {
            self.queue.wait().await;
        }
        self.held.set(true);
        SectionGuard { section: self }
    }
}

impl Drop for SectionGuard<'_> {
    fn drop(&mut self) {
        self.section.held.set(false);
        self.section.queue.wake_all();
    }
}

/// A counting semaphore for one shard's tasks.
pub struct Semaphore {
    permits: Cell<usize>,
    queue: WaitQueue,
}

pub struct Permit<'a> {
    semaphore: &'a Semaphore,
}

impl Semaphore {
    pub fn new(permits: usize) -> Semaphore {
        Semaphore {
            permits: Cell::new(permits),
            queue: WaitQueue::new(),
        }
    }

    pub async fn acquire(&self) -> Permit<'_> {
        while self.permits.get() == 0 {
            self.queue.wait().await;
        }
        self.permits.set(self.permits.get() - 1);
        Permit { semaphore: self }
    }

    pub fn available(&self) -> usize {
        self.permits.get()
    }

    /// Like `acquire`, with a permit that owns a handle to the semaphore (for spawned tasks).
    pub async fn acquire_owned(self: &Rc<Self>) -> OwnedPermit {
        while self.permits.get() == 0 {
            self.queue.wait().await;
        }
        self.permits.set(self.permits.get() - 1);
        OwnedPermit {
            semaphore: self.clone(),
        }
    }
}

pub struct OwnedPermit {
    semaphore: Rc<Semaphore>,
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.semaphore.permits.set(self.semaphore.permits.get() + 1);
        self.semaphore.queue.wake_all();
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.semaphore.permits.set(self.semaphore.permits.get() + 1);
        self.semaphore.queue.wake_all();
    }
}
