//! A single-threaded executor for one shard. Tasks are woken by completions on the shard's own
//! ring (on this thread) or by other threads (through a queue and the reactor's eventfd).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};

use super::reactor::{Reactor, ReactorConfig, RemoteWake};

/// Most tasks polled in one round before the executor looks at the ring again, so that a task
/// that keeps waking itself cannot starve I/O completions.
const POLLS_PER_ROUND_MAX: usize = 256;

type TaskId = (usize, u32);

/// The part of an executor that other threads may touch: where to queue a wake-up.
struct Home {
    queue: mpsc::Sender<TaskId>,
    remote: Arc<RemoteWake>,
}

struct TaskWaker {
    id: TaskId,
    /// True from a wake until the task is next polled; deduplicates wake-ups, which bounds the
    /// remote queue by the number of live tasks.
    scheduled: AtomicBool,
    home: Arc<Home>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let home = Arc::as_ptr(&self.home);
        let on_home_thread = CURRENT_HOME.with(|current| current.get() == home);
        if on_home_thread {
            if let Some(executor) = current_executor() {
                executor.ready.borrow_mut().push_back(self.id);
            }
        } else if self.home.queue.send(self.id).is_ok() {
            self.home.remote.notify();
        }
    }
}

struct Task {
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Arc<TaskWaker>,
}

pub(crate) struct Executor {
    reactor: Rc<Reactor>,
    tasks: RefCell<Vec<Option<Task>>>,
    free_tasks: RefCell<Vec<usize>>,
    generation: Cell<u32>,
    ready: RefCell<VecDeque<TaskId>>,
    remote_queue: mpsc::Receiver<TaskId>,
    home: Arc<Home>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Executor>>> = const { RefCell::new(None) };
    static CURRENT_HOME: Cell<*const Home> = const { Cell::new(std::ptr::null()) };
    /// The executor `CURRENT` holds, for the hot paths (an operation's poll, a wake-up): read
    /// without borrowing a RefCell. Set and cleared by `run` with `CURRENT`.
    static CURRENT_EXECUTOR: Cell<*const Executor> = const { Cell::new(std::ptr::null()) };
}

/// This thread's executor, if it is a shard thread.
fn current_executor<'a>() -> Option<&'a Executor> {
    let executor = CURRENT_EXECUTOR.with(Cell::get);
    // SAFETY: `run` sets the pointer from the executor it keeps alive (through `CURRENT` and
    // its own handle) and clears it before letting go; the reference is used within the caller's
    // call, never kept past `run`.
    unsafe { executor.as_ref() }
}

/// Run `f` with this thread's reactor. Panics outside a shard thread: I/O futures only run on
/// the shard that owns the ring.
pub(crate) fn with_reactor<R>(f: impl FnOnce(&Reactor) -> R) -> R {
    let executor = current_executor().expect("hydrant I/O used outside a shard thread");
    f(&executor.reactor)
}

/// The reactor of this shard thread, for callers that keep it (registration at start-up).
pub fn current_reactor() -> Rc<Reactor> {
    CURRENT.with(|current| {
        current
            .borrow()
            .as_ref()
            .expect("no reactor on this thread")
            .reactor
            .clone()
    })
}

impl Executor {
    fn spawn_boxed(&self, future: Pin<Box<dyn Future<Output = ()>>>) {
        let generation = self.generation.get().wrapping_add(1);
        self.generation.set(generation);
        let index = match self.free_tasks.borrow_mut().pop() {
            Some(index) => index,
            None => {
                let mut tasks = self.tasks.borrow_mut();
                tasks.push(None);
                tasks.len() - 1
            }
        };
        let id = (index, generation);
        let waker = Arc::new(TaskWaker {
            id,
            scheduled: AtomicBool::new(true),
            home: self.home.clone(),
        });
        self.tasks.borrow_mut()[index] = Some(Task {
            future: Some(future),
            waker,
        });
        self.ready.borrow_mut().push_back(id);
    }

    fn poll_task(&self, id: TaskId) {
        let (mut future, waker) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(Some(task)) = tasks.get_mut(id.0) else {
                return;
            };
            if task.waker.id != id {
                return; // a stale wake-up for a task that has finished
            }
            let Some(future) = task.future.take() else {
                return; // already being polled further up the stack
            };
            task.waker.scheduled.store(false, Ordering::Release);
            (future, task.waker.clone())
        };
        let waker = Waker::from(waker);
        let mut context = Context::from_waker(&waker);
        let finished = future.as_mut().poll(&mut context).is_ready();
        let mut tasks = self.tasks.borrow_mut();
        if finished {
            tasks[id.0] = None;
            self.free_tasks.borrow_mut().push(id.0);
        } else if let Some(task) = tasks[id.0].as_mut() {
            task.future = Some(future);
        }
    }

    fn run_ready(&self) {
        for _ in 0..POLLS_PER_ROUND_MAX {
            let next = self.ready.borrow_mut().pop_front();
            match next {
                Some(id) => self.poll_task(id),
                None => return,
            }
        }
    }

    fn drain_remote(&self) {
        while let Ok(id) = self.remote_queue.try_recv() {
            self.ready.borrow_mut().push_back(id);
        }
    }
}

/// Spawn a task on the current shard thread. The task runs until it completes or the shard stops.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
{
    let state = Rc::new(RefCell::new(JoinState {
        output: None,
        waker: None,
    }));
    let task_state = state.clone();
    let task = async move {
        let output = future.await;
        let mut state = task_state.borrow_mut();
        state.output = Some(output);
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    };
    current_executor()
        .expect("spawn outside a shard thread")
        .spawn_boxed(Box::pin(task));
    JoinHandle { state }
}

struct JoinState<T> {
    output: Option<T>,
    waker: Option<Waker>,
}

/// Awaits the output of a spawned task. Dropping it detaches the task.
pub struct JoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        let mut state = self.state.borrow_mut();
        match state.output.take() {
            Some(output) => Poll::Ready(output),
            None => {
                state.waker = Some(context.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Run an executor with `main` as its first task on this thread until `main` completes.
pub(crate) fn run<F, Fut>(config: ReactorConfig, main: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let reactor = match Reactor::new(&config) {
        Ok(reactor) => Rc::new(reactor),
        Err(error) => {
            // The caller learns of the failure when `main`'s channels are dropped unanswered.
            log::error!("cannot create an io_uring ring: {error}");
            return;
        }
    };
    let (sender, receiver) = mpsc::channel();
    let executor = Rc::new(Executor {
        home: Arc::new(Home {
            queue: sender,
            remote: reactor.remote.clone(),
        }),
        reactor,
        tasks: RefCell::new(Vec::new()),
        free_tasks: RefCell::new(Vec::new()),
        generation: Cell::new(0),
        ready: RefCell::new(VecDeque::new()),
        remote_queue: receiver,
    });
    CURRENT.with(|current| *current.borrow_mut() = Some(executor.clone()));
    CURRENT_HOME.with(|home| home.set(Arc::as_ptr(&executor.home)));
    CURRENT_EXECUTOR.with(|current| current.set(Rc::as_ptr(&executor)));

    let finished = Rc::new(Cell::new(false));
    let finished_flag = finished.clone();
    let main_future = main();
    executor.spawn_boxed(Box::pin(async move {
        main_future.await;
        finished_flag.set(true);
    }));
    loop {
        executor.run_ready();
        executor.drain_remote();
        if finished.get() {
            break;
        }
        let idle = executor.ready.borrow().is_empty();
        executor.reactor.turn(idle);
        executor.drain_remote();
    }

    // Drop the remaining tasks while this thread's context still exists: their I/O futures hand
    // their buffers to the reactor, which keeps them until the kernel is done with them.
    let tasks: Vec<Option<Task>> = std::mem::take(&mut *executor.tasks.borrow_mut());
    drop(tasks);
    executor.reactor.drain();
    CURRENT_HOME.with(|home| home.set(std::ptr::null()));
    CURRENT_EXECUTOR.with(|current| current.set(std::ptr::null()));
    CURRENT.with(|current| *current.borrow_mut() = None);
    super::time::set_turn_time(None);
}

struct ThreadWaker {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Drive `future` to completion on the calling thread, parking it between wake-ups. For threads
/// that are not shards: tests, command-line tools and the engine's blocking calls.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let thread_waker = Arc::new(ThreadWaker {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let waker = Waker::from(thread_waker.clone());
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        // What this thread held back (rt::batched) must not wait for it to wake.
        super::batched::wake_batched();
        while !thread_waker.woken.swap(false, Ordering::Acquire) {
            std::thread::park();
        }
    }
}
