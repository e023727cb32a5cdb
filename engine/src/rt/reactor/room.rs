//! The line of operations waiting for room: the bounds on device operations and bytes in
//! flight, and who passes whom (see docs/architecture.md, "Thread per core").

use super::*;

impl Reactor {
    /// Whether a device operation of `bytes` fits under both bounds now. One larger than the
    /// byte bound fits when no other device bytes are in flight.
    pub(super) fn has_room_for(&self, bytes: u32) -> bool {
        let in_flight = self.bytes_in_flight.get();
        self.in_flight.get() < self.io_depth_max
            && (in_flight == 0 || in_flight + u64::from(bytes) <= self.io_bytes_max)
    }

    /// Whether a waiter ahead of `ticket` (the caller's place in line, if it has one) closes
    /// the line.
    pub(super) fn line_closed_before(&self, ticket: Option<u64>) -> bool {
        if self.closing_waiters.get() == 0 {
            return false;
        }
        self.depth_waiters
            .borrow()
            .iter()
            .take_while(|waiter| Some(waiter.ticket) != ticket)
            .any(|waiter| waiter.closes_line)
    }

    /// An operation that was not waiting went past the first in line (if any is waiting).
    pub(super) fn count_a_pass(&self) {
        let mut waiters = self.depth_waiters.borrow_mut();
        if let Some(first) = waiters.front_mut() {
            first.passed += 1;
            if first.passed >= WAITER_PASSES_MAX && !first.closes_line {
                first.closes_line = true;
                self.closing_waiters.set(self.closing_waiters.get() + 1);
            }
        }
    }

    /// Take a place in line (or, holding one, update its waker).
    pub(super) fn wait_in_line(&self, bytes: u32, ticket: &mut Option<u64>, waker: &Waker) {
        let mut waiters = self.depth_waiters.borrow_mut();
        if let Some(mine) = *ticket {
            if let Some(waiter) = waiters.iter_mut().find(|waiter| waiter.ticket == mine) {
                waiter.waker.clone_from(waker);
                return;
            }
        }
        let mine = self.next_ticket.get();
        self.next_ticket.set(mine + 1);
        *ticket = Some(mine);
        let closes_line = u64::from(bytes) > self.io_bytes_max;
        if closes_line {
            self.closing_waiters.set(self.closing_waiters.get() + 1);
        }
        waiters.push_back(Waiter {
            ticket: mine,
            bytes,
            waker: waker.clone(),
            passed: 0,
            closes_line,
        });
    }

    /// Remove `ticket` from the line.
    pub(super) fn leave_waiters(&self, ticket: u64) {
        let mut waiters = self.depth_waiters.borrow_mut();
        if let Some(position) = waiters.iter().position(|waiter| waiter.ticket == ticket) {
            let waiter = waiters.remove(position).expect("found");
            if waiter.closes_line {
                self.closing_waiters.set(self.closing_waiters.get() - 1);
            }
        }
    }

    /// A device operation that waited in line (`ticket`) was dropped before it was submitted:
    /// its place goes to those behind it.
    pub(crate) fn leave_line(&self, ticket: u64) {
        self.leave_waiters(ticket);
        self.pass_depth_wake();
    }
}
