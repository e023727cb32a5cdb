//! Provided receive buffers: a ring of equal buffers the kernel picks from when a multishot
//! receive completes (`IORING_REGISTER_PBUF_RING`), so that a connection waiting for its next
//! request holds no buffer of its own in the kernel and costs no submission per request.
//!
//! The reactor owns one set per shard. A buffer the kernel filled belongs to the completion
//! that names it until the receiver copies its bytes out; then it goes back to the ring.

use std::alloc::Layout;
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{types, IoUring};

/// Bytes of one provided buffer: a request frame without a payload fits many times.
pub const RECEIVE_BUFFER_BYTES: usize = 4096;
/// The buffer group id of a shard's provided buffers (one group per ring).
pub(crate) const RECEIVE_GROUP: u16 = 0;

/// Whether `count` provided buffers per shard can be asked for: 0 (none) or a power of two up
/// to 32768 (the kernel's ring of buffer descriptors).
pub fn receive_buffers_valid(count: u16) -> bool {
    count == 0 || (count.is_power_of_two() && count <= 1 << 15)
}

/// What a shard's provided buffers did, for stats.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReceiveStats {
    /// Provided buffers of the shard (0: receives go into each connection's own buffer).
    pub buffers: u32,
    /// Buffers filled by the kernel and not yet copied out by their connection.
    pub buffers_lent: u32,
    /// Multishot receives started.
    pub streams_started: u64,
    /// Multishot receives that ended because every buffer was lent (the connection went on
    /// with a plain receive).
    pub buffer_shortages: u64,
    /// Multishot receives cancelled because their connection left too many buffers unread (it
    /// stopped reading, or a large frame arrived in one burst).
    pub streams_cut: u64,
}

pub(crate) struct ProvidedBuffers {
    /// The ring of buffer descriptors the kernel reads (page-aligned, `count` entries).
    ring: *mut types::BufRingEntry,
    ring_layout: Layout,
    /// The buffers themselves, `count` × RECEIVE_BUFFER_BYTES.
    memory: Box<[u8]>,
    count: u16,
    /// Our tail of the descriptor ring: entries before it are the kernel's to take.
    tail: u16,
    pub(crate) stats: ReceiveStats,
}

impl ProvidedBuffers {
    /// Allocate `count` buffers (a power of two, at most 32768) and register them with `ring`.
    pub(crate) fn register(ring: &IoUring, count: u16) -> io::Result<ProvidedBuffers> {
        if count == 0 || !receive_buffers_valid(count) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("receive buffers must be a power of two up to 32768, not {count}"),
            ));
        }
        let ring_layout = Layout::from_size_align(
            usize::from(count) * std::mem::size_of::<types::BufRingEntry>(),
            4096,
        )
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        // SAFETY: the layout has a non-zero size; zeroed entries are valid descriptors.
        let ring_memory = unsafe { std::alloc::alloc_zeroed(ring_layout) };
        if ring_memory.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let mut buffers = ProvidedBuffers {
            ring: ring_memory.cast(),
            ring_layout,
            memory: vec![0u8; usize::from(count) * RECEIVE_BUFFER_BYTES].into_boxed_slice(),
            count,
            tail: 0,
            stats: ReceiveStats {
                buffers: u32::from(count),
                ..ReceiveStats::default()
            },
        };
        // SAFETY: the descriptor ring stays allocated, at this address, until `Drop` (after the
        // reactor unregistered it); the kernel only reads it.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                buffers.ring as u64,
                count,
                RECEIVE_GROUP,
                0,
            )?;
        }
        for bid in 0..count {
            buffers.push(bid);
        }
        buffers.publish();
        Ok(buffers)
    }

    /// The kernel filled buffer `bid`: it is lent until `give_back`.
    pub(crate) fn lent(&mut self) {
        self.stats.buffers_lent += 1;
    }

    /// The first `len` bytes of buffer `bid`.
    pub(crate) fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        assert!(
            bid < self.count && len <= RECEIVE_BUFFER_BYTES,
            "a provided buffer"
        );
        let start = usize::from(bid) * RECEIVE_BUFFER_BYTES;
        &self.memory[start..start + len]
    }

    /// Hand buffer `bid` back to the kernel.
    pub(crate) fn give_back(&mut self, bid: u16) {
        assert!(bid < self.count, "a provided buffer");
        self.stats.buffers_lent -= 1;
        self.push(bid);
        self.publish();
    }

    fn push(&mut self, bid: u16) {
        let index = usize::from(self.tail & (self.count - 1));
        // SAFETY: index < count, inside the descriptor ring; the kernel does not read entries
        // at or past the tail we publish.
        let entry = unsafe { &mut *self.ring.add(index) };
        let start = usize::from(bid) * RECEIVE_BUFFER_BYTES;
        entry.set_addr(self.memory[start..].as_ptr() as u64);
        entry.set_len(RECEIVE_BUFFER_BYTES as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the ring's tail lies in its first entry, an aligned u16 the kernel reads with
        // acquire ordering; we store it with release ordering after writing the entries.
        let tail = unsafe { types::BufRingEntry::tail(self.ring) }.cast_mut();
        // SAFETY: as above; the pointer is valid and aligned for an AtomicU16.
        unsafe { AtomicU16::from_ptr(tail) }.store(self.tail, Ordering::Release);
    }

    /// Unregister from `ring`; the memory is freed when this is dropped.
    pub(crate) fn unregister(&self, ring: &IoUring) {
        if let Err(error) = ring.submitter().unregister_buf_ring(RECEIVE_GROUP) {
            log::warn!("could not unregister the provided receive buffers: {error}");
        }
    }
}

impl Drop for ProvidedBuffers {
    fn drop(&mut self) {
        // SAFETY: allocated in `register` with this layout; the kernel let go of it when the
        // reactor unregistered it (or closed the ring).
        unsafe { std::alloc::dealloc(self.ring.cast(), self.ring_layout) };
    }
}
