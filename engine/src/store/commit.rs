//! Group commit: a write waits for a flush that started after it completed. Whoever finds no
//! flush running starts one for everybody; writes completed during it wait for the next. Many
//! writes, one fdatasync, then every acknowledgement.

use std::cell::Cell;

use crate::rt::sync::WaitQueue;

#[derive(Default)]
pub(crate) struct Commit {
    /// The id the next flush to start will take.
    next_flush: Cell<u64>,
    /// The id of the newest flush that completed.
    durable: Cell<u64>,
    flushing: Cell<bool>,
    queue: WaitQueue,
    flushes: Cell<u64>,
}

/// Returned to the caller that must run the flush it was given.
pub(crate) struct FlushTurn {
    id: u64,
}

pub(crate) enum CommitStep {
    /// The write is durable.
    Durable,
    /// This caller must flush now and report with `finish`.
    Flush(FlushTurn),
    /// Another caller is flushing; wait and ask again.
    Wait,
}

impl Commit {
    pub(crate) fn new() -> Commit {
        let commit = Commit::default();
        commit.next_flush.set(1);
        commit
    }

    /// The ticket of a write that has just completed: it is durable once flush `ticket` is.
    pub(crate) fn ticket(&self) -> u64 {
        self.next_flush.get()
    }

    pub(crate) fn step(&self, ticket: u64) -> CommitStep {
        if self.durable.get() >= ticket {
            return CommitStep::Durable;
        }
        if self.flushing.get() {
            return CommitStep::Wait;
        }
        let id = self.next_flush.get();
        self.next_flush.set(id + 1);
        self.flushing.set(true);
        CommitStep::Flush(FlushTurn { id })
    }

    /// Report the end of a flush; on success everything completed before it started is durable.
    pub(crate) fn finish(&self, turn: FlushTurn, succeeded: bool) {
        self.flushing.set(false);
        if succeeded {
            assert!(turn.id > self.durable.get());
            self.durable.set(turn.id);
            self.flushes.set(self.flushes.get() + 1);
        }
        self.queue.wake_all();
    }

    pub(crate) async fn wait(&self) {
        self.queue.wait().await;
    }

    pub(crate) fn flushes(&self) -> u64 {
        self.flushes.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_during_a_flush_need_the_next_one() {
        let commit = Commit::new();
        let first = commit.ticket();
        let CommitStep::Flush(turn) = commit.step(first) else {
            panic!("nobody is flushing, so the first waiter flushes");
        };
        let during = commit.ticket();
        assert!(matches!(commit.step(first), CommitStep::Wait));
        commit.finish(turn, true);
        assert!(matches!(commit.step(first), CommitStep::Durable));
        let CommitStep::Flush(turn) = commit.step(during) else {
            panic!("a write completed during the flush needs another");
        };
        commit.finish(turn, false);
        assert!(
            matches!(commit.step(during), CommitStep::Flush(_)),
            "a failed flush is retried"
        );
    }
}
