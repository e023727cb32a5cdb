//! Multishot receive streams into the shard's provided buffers: started, polled, cancelled
//! and completed.

use super::*;

impl Reactor {
    /// Start a multishot receive on `socket` into the provided buffers; `None` without them.
    /// Its completions are taken with `poll_stream`; it ends with a completion without MORE.
    pub(crate) fn start_stream(&self, socket: RawFd) -> Option<usize> {
        if self.streams_refused.get() {
            return None;
        }
        self.receive.borrow_mut().as_mut()?.stats.streams_started += 1;
        let index = self.insert_slot(Slot {
            state: SlotState::Stream {
                completions: VecDeque::new(),
                waker: None,
                cancelled: false,
            },
            keep: Keep::Nothing,
            device_bytes: None,
        });
        let entry = opcode::RecvMulti::new(types::Fd(socket), RECEIVE_GROUP)
            .build()
            .user_data(index as u64);
        self.push_entry(entry);
        self.sockets_in_flight.set(self.sockets_in_flight.get() + 1);
        Some(index)
    }

    /// The next completion (result, flags) of multishot receive `index`, or `None` (the waker
    /// is kept) when none is there yet. The slot is freed with the last one (no MORE flag):
    /// `index` must not be used after that.
    pub(crate) fn poll_stream(&self, index: usize, waker: &Waker) -> Option<(i32, u32)> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots[index].as_mut().expect("polled a free slot");
        let SlotState::Stream {
            completions,
            waker: stored,
            ..
        } = &mut slot.state
        else {
            unreachable!("not a multishot receive")
        };
        match completions.pop_front() {
            Some((result, flags)) => {
                if !io_uring::cqueue::more(flags) {
                    slots[index] = None;
                    self.free_slots.borrow_mut().push(index);
                }
                Some((result, flags))
            }
            None => {
                match stored {
                    Some(existing) if existing.will_wake(waker) => {}
                    _ => *stored = Some(waker.clone()),
                }
                None
            }
        }
    }

    /// Copy the first `len` bytes of provided buffer `bid` to `out` and give the buffer back.
    pub(crate) fn take_provided(&self, bid: u16, len: usize, out: &mut [u8]) {
        let mut receive = self.receive.borrow_mut();
        let buffers = receive
            .as_mut()
            .expect("a completion named a provided buffer");
        out[..len].copy_from_slice(buffers.bytes(bid, len));
        buffers.give_back(bid);
    }

    /// The kernel refused a multishot receive (one older than 6.0 has provided buffers but
    /// not multishot receives): no more are started on this ring.
    pub(crate) fn refuse_streams(&self) {
        if !self.streams_refused.replace(true) {
            log::info!("multishot receives refused by the kernel; plain receives only");
        }
    }

    /// A receive ended for want of a provided buffer.
    pub(crate) fn count_buffer_shortage(&self) {
        if let Some(buffers) = self.receive.borrow_mut().as_mut() {
            buffers.stats.buffer_shortages += 1;
        }
    }

    /// Cancel multishot receive `index` (once); its remaining completions still come, the last
    /// one without MORE.
    pub(crate) fn cancel_stream(&self, index: usize) {
        {
            let mut slots = self.slots.borrow_mut();
            let slot = slots[index].as_mut().expect("cancelled a free slot");
            match &mut slot.state {
                SlotState::Stream { cancelled, .. } if !*cancelled => *cancelled = true,
                _ => return,
            }
        }
        self.push_cancel(index);
    }

    /// The receiver of multishot receive `index` went away: give back the buffers its unread
    /// completions hold, cancel it, and free the slot with its last completion.
    pub(crate) fn abandon_stream(&self, index: usize) {
        let (cancelled, finished, bids) = {
            let mut slots = self.slots.borrow_mut();
            let slot = slots[index].as_mut().expect("abandoned a free slot");
            let SlotState::Stream {
                completions,
                cancelled,
                ..
            } = std::mem::replace(&mut slot.state, SlotState::StreamAbandoned)
            else {
                unreachable!("not a multishot receive")
            };
            let finished = completions
                .back()
                .is_some_and(|&(_, flags)| !io_uring::cqueue::more(flags));
            if finished {
                slots[index] = None;
                self.free_slots.borrow_mut().push(index);
            }
            let bids: Vec<u16> = completions
                .iter()
                .filter_map(|&(_, flags)| io_uring::cqueue::buffer_select(flags))
                .collect();
            (cancelled, finished, bids)
        };
        if let Some(buffers) = self.receive.borrow_mut().as_mut() {
            for bid in bids {
                buffers.give_back(bid);
            }
        }
        if !cancelled && !finished {
            self.push_cancel(index);
        }
    }

    pub(super) fn push_cancel(&self, index: usize) {
        // A cancellation is found by user_data. The slot cannot be reused before it is
        // processed: it is freed only by the stream's last completion, and an operation that
        // reuses it is queued behind this entry.
        let entry = opcode::AsyncCancel::new(index as u64)
            .build()
            .user_data(CANCEL_TAG);
        self.push_entry(entry);
    }

    /// One completion of multishot receive `index`: queued for its receiver (which is woken),
    /// or, for an abandoned one, its buffer given back at once. A receive holding
    /// `STREAM_BUFFERS_UNREAD_MAX` unread buffers is cancelled.
    pub(super) fn stream_completed(&self, index: usize, result: i32, flags: u32) {
        let bid = io_uring::cqueue::buffer_select(flags);
        let last = !io_uring::cqueue::more(flags);
        if last {
            self.sockets_in_flight.set(self.sockets_in_flight.get() - 1);
        }
        let mut receive = self.receive.borrow_mut();
        let buffers = receive
            .as_mut()
            .expect("a multishot receive has provided buffers");
        if bid.is_some() {
            buffers.lent();
        }
        let mut slots = self.slots.borrow_mut();
        let slot = slots[index].as_mut().expect("completion for a free slot");
        let (waker, cut) = match &mut slot.state {
            SlotState::Stream {
                completions,
                waker,
                cancelled,
            } => {
                completions.push_back((result, flags));
                let cut = !last && !*cancelled && completions.len() >= STREAM_BUFFERS_UNREAD_MAX;
                if cut {
                    *cancelled = true;
                    buffers.stats.streams_cut += 1;
                }
                (waker.take(), cut)
            }
            SlotState::StreamAbandoned => {
                if let Some(bid) = bid {
                    buffers.give_back(bid);
                }
                if last {
                    slots[index] = None;
                    self.free_slots.borrow_mut().push(index);
                }
                (None, false)
            }
            _ => unreachable!("checked by the caller"),
        };
        drop(slots);
        drop(receive);
        if cut {
            self.push_cancel(index);
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}
