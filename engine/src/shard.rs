//! All that one core owns: its thread, ring, arena and store, and the loop that takes requests
//! from other threads through its bounded inbox.

use std::os::fd::RawFd;
use std::rc::Rc;

use crate::buf::Arena;
use crate::cache::Cache;
use crate::origin::Origins;
use crate::rt::channel::{self, OneshotSender};
use crate::rt::op::FileRef;
use crate::rt::sync::Semaphore;
use crate::rt::{self, ReactorConfig};
use crate::store::{Geometry, RegionPlace, Store, StoreParts};
use crate::{Error, ErrorKind, Result};

/// A call to run on a shard: it receives the shard's store and spawns its own task.
pub(crate) type Call = Box<dyn FnOnce(Rc<Cache>, crate::rt::sync::OwnedPermit) + Send>;

pub(crate) enum Message {
    Call(Call),
    /// Stop taking requests, let those in flight finish, then exit.
    Stop,
}

/// Everything a shard thread needs to open its store; plain data, so it can cross threads.
pub(crate) struct ShardPlan {
    pub shard: u32,
    pub cpu: Option<usize>,
    pub geometry: Geometry,
    /// (device index, region index on the device, byte offset) of each region of this shard.
    pub regions: Vec<(u32, u32, u64)>,
    pub device_fds: Vec<RawFd>,
    pub arena_bytes: usize,
    pub reactor: ReactorConfig,
    pub requests_in_flight_max: usize,
    pub origins: Option<std::sync::Arc<Origins>>,
    /// This shard's share of the DRAM tier.
    pub dram_bytes: u64,
    /// This shard's share of the NVMe admission write budget.
    pub admission_bytes_per_second: Option<u64>,
    pub checkpoints: crate::store::CheckpointPolicy,
}

/// The other threads' handle on a running shard.
pub(crate) struct ShardHandle {
    pub inbox: channel::Sender<Message>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// Start a shard thread; `ready` gets the outcome of opening its store.
pub(crate) fn start(
    plan: ShardPlan,
    inbox_requests_max: usize,
    ready: OneshotSender<Result<()>>,
) -> Result<ShardHandle> {
    let (sender, receiver) = channel::bounded(inbox_requests_max);
    let name = format!("hydrant-shard-{}", plan.shard);
    let cpu = plan.cpu;
    let reactor = plan.reactor.clone();
    let thread = rt::start_thread(name, cpu, reactor, move || run(plan, receiver, ready))
        .map_err(|error| Error::io("cannot start a shard thread", error))?;
    Ok(ShardHandle {
        inbox: sender,
        thread: Some(thread),
    })
}

async fn run(plan: ShardPlan, inbox: channel::Receiver<Message>, ready: OneshotSender<Result<()>>) {
    let store = match open_store(&plan).await {
        Ok(store) => Cache::new(
            Rc::new(store),
            plan.dram_bytes,
            plan.admission_bytes_per_second,
            plan.origins.clone(),
        ),
        Err(error) => {
            ready.send(Err(error));
            return;
        }
    };
    ready.send(Ok(()));
    let checkpoints = store.store().clone();
    rt::spawn(async move { checkpoints.run_checkpoints().await });
    serve(store, inbox, plan.requests_in_flight_max).await;
}

async fn open_store(plan: &ShardPlan) -> Result<Store> {
    let reactor = rt::current_reactor();
    let arena = Arena::new(plan.arena_bytes)
        .map_err(|error| Error::io("cannot map the buffer arena", error))?;
    arena.register(&reactor);
    let files: Vec<FileRef> = match reactor.register_files(&plan.device_fds) {
        Ok(()) => (0..plan.device_fds.len() as u32)
            .map(FileRef::Fixed)
            .collect(),
        Err(error) => {
            log::info!(
                "shard {}: using unregistered device files ({error})",
                plan.shard
            );
            plan.device_fds.iter().map(|&fd| FileRef::Raw(fd)).collect()
        }
    };
    let places = plan
        .regions
        .iter()
        .map(|&(device, region_index, offset)| RegionPlace {
            file: files[device as usize],
            device,
            region_index,
            offset,
        })
        .collect();
    Store::open(StoreParts {
        shard: plan.shard,
        geometry: plan.geometry.clone(),
        places,
        files,
        arena,
        checkpoints: plan.checkpoints,
        writes_from_client_memory: plan
            .device_fds
            .iter()
            .all(|&fd| crate::device::allows_unstable_writes(fd)),
    })
    .await
}

/// Take requests until told to stop, at most `requests_in_flight_max` at once; then wait for
/// those in flight.
async fn serve(store: Rc<Cache>, inbox: channel::Receiver<Message>, requests_in_flight_max: usize) {
    let in_flight = Rc::new(Semaphore::new(requests_in_flight_max));
    loop {
        let permit = in_flight.acquire_owned().await;
        match inbox.recv().await {
            Some(Message::Call(call)) => call(store.clone(), permit),
            Some(Message::Stop) | None => break,
        }
    }
    // Refuse (and answer) whatever is still queued, then let the requests in flight finish.
    drop(inbox);
    for _ in 0..requests_in_flight_max {
        std::mem::forget(in_flight.acquire().await);
    }
    if let Err(error) = store.store().close().await {
        log::warn!(
            "shard {}: could not seal the log on close ({error}); the next open verifies it",
            store.shard()
        );
    }
    log::debug!("shard {} stopped", store.shard());
}

/// An error for calls that reach a shard that is gone.
pub(crate) fn shard_gone() -> Error {
    Error::new(ErrorKind::ShuttingDown, "the engine is shutting down")
}
