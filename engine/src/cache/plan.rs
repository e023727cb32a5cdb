//! Loader-order prefetch. A reader that knows the order in which it will read keys (a data
//! loader's epoch) announces it as a plan; each shard keeps its share of the plan (the keys it
//! owns, in order) and reads them through from the origin ahead of the readers, in that order,
//! `PLAN_READS_IN_FLIGHT` at a time, while what it has read ahead of the furthest planned key
//! a reader has asked for, and the reads in flight (counted at the mean size of those
//! finished), stay within the plan's window of bytes. What it reads is admitted as any read through is (the
//! policy may decline it). A plan ends when a new plan of the same id replaces it, when no
//! reader has asked for one of its keys for its idle time (the readers stopped), when its
//! readers have passed its last key, or when a shard has `PLANS_PER_SHARD_MAX` plans and a new
//! one comes (the one read least recently goes); what it read ahead that no reader asked for
//! is counted as wasted.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::future::select;

use super::*;

/// Plans one shard follows at once; a new one beyond them ends the one read least recently.
pub const PLANS_PER_SHARD_MAX: usize = 16;
/// Origin reads one plan has in flight on one shard (each holds at most a chunk in memory).
pub const PLAN_READS_IN_FLIGHT: usize = 8;

/// A shard's plan counters (see `Plans`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanStats {
    /// Plans followed now.
    pub active: u64,
    /// Keys announced in plans.
    pub planned: u64,
    /// Objects, and their bytes, read through from the origin ahead of their readers.
    pub prefetched: u64,
    pub prefetched_bytes: u64,
    /// Reads of a key that a plan had read ahead (or was reading when the read came).
    pub hits: u64,
    /// Objects read ahead that no reader asked for before their plan ended.
    pub wasted: u64,
    /// Plans ended because no reader followed them for their idle time.
    pub idle_ended: u64,
}

/// Where one key of a plan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// Not read ahead (yet).
    Pending,
    /// Being read ahead; `asked` once a reader has asked for it meanwhile.
    InFlight { asked: bool },
    /// Read ahead, `bytes` of it, and not asked for since.
    Ahead { bytes: u64 },
    /// Asked for by a reader (or already held when the plan reached it, or failed).
    Done,
}

struct Progress {
    /// The next key to read ahead.
    next: usize,
    /// One past the furthest key a reader has asked for.
    reached: usize,
    marks: Vec<Mark>,
    /// Bytes read ahead at or past `reached` and not asked for.
    ahead_bytes: u64,
    in_flight: usize,
    /// Reads ahead finished, and their bytes: their mean is what a read in flight is counted
    /// as against the window.
    finished: u64,
    finished_bytes: u64,
    last_read: Instant,
    ended: bool,
}

impl Progress {
    /// What the reads in flight will add to the bytes ahead, by the mean of those finished
    /// (nothing before the first finishes: the bound on reads in flight holds them then).
    fn in_flight_bytes(&self) -> u64 {
        self.finished_bytes
            .checked_div(self.finished)
            .map_or(0, |mean| mean * self.in_flight as u64)
    }
}

struct Plan {
    id: u64,
    keys: Vec<ObjectKey>,
    /// A hash of each key to its first position (the key at it is compared on a match).
    positions: HashMap<u64, u32>,
    window_bytes: u64,
    idle: Duration,
    progress: RefCell<Progress>,
    /// Woken when readers move on, a read ahead finishes, or the plan ends.
    wake: WaitQueue,
}

impl Plan {
    /// A reader asked for the key at `index`.
    fn asked(&self, index: usize, stats: &Cell<PlanStats>) {
        let mut progress = self.progress.borrow_mut();
        progress.last_read = crate::rt::time::now_coarse();
        let mut counted = stats.get();
        match progress.marks[index] {
            Mark::Ahead { bytes } => {
                counted.hits += 1;
                if index >= progress.reached {
                    progress.ahead_bytes -= bytes;
                }
                progress.marks[index] = Mark::Done;
            }
            Mark::InFlight { .. } => {
                counted.hits += 1;
                progress.marks[index] = Mark::InFlight { asked: true };
            }
            Mark::Pending => progress.marks[index] = Mark::Done,
            Mark::Done => {}
        }
        stats.set(counted);
        if index >= progress.reached {
            // Keys read ahead that the readers passed are behind them now: out of the window.
            for skipped in progress.reached..index {
                if let Mark::Ahead { bytes } = progress.marks[skipped] {
                    progress.ahead_bytes -= bytes;
                }
            }
            progress.reached = index + 1;
        }
        drop(progress);
        self.wake.wake_all();
    }

    /// A read ahead of the key at `index` finished with `bytes` (`None`: not read).
    fn read_ahead(&self, index: usize, bytes: Option<u64>, stats: &Cell<PlanStats>) {
        let mut progress = self.progress.borrow_mut();
        progress.in_flight -= 1;
        let Mark::InFlight { asked } = progress.marks[index] else {
            unreachable!("only keys in flight finish");
        };
        if let Some(bytes) = bytes {
            progress.finished += 1;
            progress.finished_bytes += bytes;
            let mut counted = stats.get();
            counted.prefetched += 1;
            counted.prefetched_bytes += bytes;
            stats.set(counted);
        }
        progress.marks[index] = match bytes {
            Some(bytes) if !asked && !progress.ended => {
                if index >= progress.reached {
                    progress.ahead_bytes += bytes;
                }
                Mark::Ahead { bytes }
            }
            Some(bytes) if !asked => Mark::Ahead { bytes },
            _ => Mark::Done,
        };
        let wasted = progress.ended && matches!(progress.marks[index], Mark::Ahead { .. });
        drop(progress);
        if wasted {
            let mut counted = stats.get();
            counted.wasted += 1;
            stats.set(counted);
        }
        self.wake.wake_all();
    }
}

/// The plans a shard follows.
#[derive(Default)]
pub(crate) struct Plans {
    active: RefCell<Vec<Rc<Plan>>>,
    stats: Cell<PlanStats>,
    hasher: std::collections::hash_map::RandomState,
}

impl Plans {
    fn hash(&self, key: &ObjectKey) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn stats(&self) -> PlanStats {
        let mut stats = self.stats.get();
        stats.active = self.active.borrow().len() as u64;
        stats
    }

    /// A reader asks for `key`: plans that hold it move on.
    pub(crate) fn asked(&self, key: &ObjectKey) {
        let active = self.active.borrow();
        if active.is_empty() {
            return;
        }
        let hash = self.hash(key);
        for plan in active.iter() {
            if let Some(&index) = plan.positions.get(&hash) {
                if plan.keys[index as usize] == *key {
                    plan.asked(index as usize, &self.stats);
                }
            }
        }
    }

    /// End `plan`: it is no longer followed, and what it read ahead that nobody asked for is
    /// wasted.
    fn end(&self, plan: &Rc<Plan>) {
        self.active
            .borrow_mut()
            .retain(|active| !Rc::ptr_eq(active, plan));
        let mut progress = plan.progress.borrow_mut();
        if progress.ended {
            return;
        }
        progress.ended = true;
        let wasted = progress
            .marks
            .iter()
            .filter(|mark| matches!(mark, Mark::Ahead { .. }))
            .count() as u64;
        drop(progress);
        let mut counted = self.stats.get();
        counted.wasted += wasted;
        self.stats.set(counted);
        plan.wake.wake_all();
    }
}

impl Cache {
    /// Follow a plan named `id` of `keys` (this shard's, in the order they will be read):
    /// read them ahead from the origin at most `window_bytes` beyond the readers, until no
    /// reader asks for one for `idle`. It replaces a plan of the same id; no keys just end
    /// that one. Returns how many keys are planned.
    pub fn plan(
        self: &Rc<Self>,
        id: u64,
        keys: Vec<ObjectKey>,
        window_bytes: u64,
        idle: Duration,
    ) -> usize {
        let plans = &self.plans;
        let replaced: Vec<_> = plans
            .active
            .borrow()
            .iter()
            .filter(|plan| plan.id == id)
            .cloned()
            .collect();
        for plan in &replaced {
            plans.end(plan);
        }
        if keys.is_empty() {
            return 0;
        }
        if plans.active.borrow().len() >= PLANS_PER_SHARD_MAX {
            let stalest = plans
                .active
                .borrow()
                .iter()
                .min_by_key(|plan| plan.progress.borrow().last_read)
                .cloned();
            if let Some(stalest) = stalest {
                plans.end(&stalest);
            }
        }
        let mut positions = HashMap::with_capacity(keys.len());
        for (index, key) in keys.iter().enumerate() {
            positions.entry(plans.hash(key)).or_insert(index as u32);
        }
        let count = keys.len();
        let plan = Rc::new(Plan {
            id,
            positions,
            window_bytes,
            idle,
            progress: RefCell::new(Progress {
                next: 0,
                reached: 0,
                marks: vec![Mark::Pending; count],
                ahead_bytes: 0,
                in_flight: 0,
                finished: 0,
                finished_bytes: 0,
                last_read: crate::rt::time::now_coarse(),
                ended: false,
            }),
            keys,
            wake: WaitQueue::new(),
        });
        plans.active.borrow_mut().push(plan.clone());
        let mut counted = plans.stats.get();
        counted.planned += count as u64;
        plans.stats.set(counted);
        crate::rt::spawn(follow(self.clone(), plan));
        count
    }

    pub fn plan_stats(&self) -> PlanStats {
        self.plans.stats()
    }
}

/// Follow `plan` until it ends: start reads ahead while the window and the reads in flight
/// allow, and wait for readers to move on.
async fn follow(cache: Rc<Cache>, plan: Rc<Plan>) {
    loop {
        let mut starts = Vec::new();
        let wait_for = {
            let mut progress = plan.progress.borrow_mut();
            if progress.ended {
                return;
            }
            while progress.in_flight < PLAN_READS_IN_FLIGHT
                && progress.next < plan.keys.len()
                && progress.ahead_bytes + progress.in_flight_bytes() < plan.window_bytes
            {
                let index = progress.next;
                progress.next += 1;
                if index < progress.reached || progress.marks[index] != Mark::Pending {
                    continue;
                }
                if cache.store.version(&plan.keys[index]).is_some() {
                    // Held already (a reader of it will be a hit whatever the plan does).
                    progress.marks[index] = Mark::Done;
                    continue;
                }
                progress.marks[index] = Mark::InFlight { asked: false };
                progress.in_flight += 1;
                starts.push(index);
            }
            let finished = progress.reached >= plan.keys.len() && progress.in_flight == 0;
            let idle_for =
                crate::rt::time::now_coarse().saturating_duration_since(progress.last_read);
            if finished || idle_for >= plan.idle {
                drop(progress);
                if !finished {
                    let mut counted = cache.plans.stats.get();
                    counted.idle_ended += 1;
                    cache.plans.stats.set(counted);
                }
                cache.plans.end(&plan);
                return;
            }
            plan.idle - idle_for
        };
        for index in starts {
            let cache = cache.clone();
            let plan = plan.clone();
            crate::rt::spawn(async move {
                let key = &plan.keys[index];
                let bytes = match cache.warm(key).await {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        log::debug!("reading {key:?} ahead for a plan: {error}");
                        None
                    }
                };
                plan.read_ahead(index, bytes, &cache.plans.stats);
            });
        }
        let woken = plan.wake.wait();
        let deadline = crate::rt::time::sleep(wait_for + Duration::from_millis(1));
        futures::pin_mut!(woken, deadline);
        select(woken, deadline).await;
    }
}
