//! The answer budget: room for the object bytes a connection's answers hold, from the read
//! until the send, handed out in the order asked.

use super::*;

/// Room for the object bytes a connection's answers hold, handed out in the order asked (so a
/// large answer is not overtaken forever by small ones).
pub(super) struct AnswerBudget {
    pub(super) available: Cell<usize>,
    /// Tickets of the reservations waiting, oldest first.
    pub(super) waiting: RefCell<VecDeque<u64>>,
    pub(super) next_ticket: Cell<u64>,
    pub(super) changed: WaitQueue,
}

/// Room reserved in an `AnswerBudget`, given back when dropped (once the answer is sent).
pub(super) struct Reservation {
    pub(super) budget: Rc<AnswerBudget>,
    pub(super) bytes: usize,
}

impl Reservation {
    /// Give back what is reserved beyond `bytes` (the answer turned out smaller).
    pub(super) fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            let budget = &self.budget;
            budget
                .available
                .set(budget.available.get() + self.bytes - bytes);
            self.bytes = bytes;
            budget.changed.wake_all();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let budget = &self.budget;
        budget.available.set(budget.available.get() + self.bytes);
        assert!(budget.available.get() <= ANSWER_BYTES_MAX);
        budget.changed.wake_all();
    }
}

/// A place in an `AnswerBudget`'s queue; leaving the queue without room (the task was dropped)
/// lets the next one in.
pub(super) struct Ticket<'a> {
    pub(super) budget: &'a AnswerBudget,
    pub(super) number: u64,
    pub(super) served: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.budget
                .waiting
                .borrow_mut()
                .retain(|&number| number != self.number);
            self.budget.changed.wake_all();
        }
    }
}

impl AnswerBudget {
    pub(super) fn new() -> AnswerBudget {
        AnswerBudget {
            available: Cell::new(ANSWER_BYTES_MAX),
            waiting: RefCell::new(VecDeque::new()),
            next_ticket: Cell::new(0),
            changed: WaitQueue::new(),
        }
    }

    /// Room for `bytes` now, if nobody waits before and there is room; else `None`.
    pub(super) fn try_reserve(self: &Rc<Self>, bytes: usize) -> Option<Reservation> {
        let bytes = bytes.min(ANSWER_BYTES_MAX);
        if !self.waiting.borrow().is_empty() || self.available.get() < bytes {
            return None;
        }
        self.available.set(self.available.get() - bytes);
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    /// Room for `bytes` (at most the whole budget), after every reservation asked before.
    pub(super) async fn reserve(self: &Rc<Self>, bytes: usize) -> Reservation {
        let bytes = bytes.min(ANSWER_BYTES_MAX);
        let mut ticket = Ticket {
            budget: self,
            number: self.next_ticket.get(),
            served: false,
        };
        self.next_ticket.set(ticket.number + 1);
        self.waiting.borrow_mut().push_back(ticket.number);
        while self.waiting.borrow().front() != Some(&ticket.number) || self.available.get() < bytes
        {
            self.changed.wait().await;
        }
        self.waiting.borrow_mut().pop_front();
        ticket.served = true;
        self.available.set(self.available.get() - bytes);
        // The next in line may fit too.
        self.changed.wake_all();
        Reservation {
            budget: self.clone(),
            bytes,
        }
    }
}
