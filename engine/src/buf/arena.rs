//! The per-shard pinned arena and the buffers it lends.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::io;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::buddy::{Buddy, BLOCK_MAX_BYTES};
use super::BUFFER_ALIGN_BYTES;
use crate::rt::Reactor;

/// A registered buffer may be at most 1 GiB.
const ARENA_BYTES_MAX: usize = 1 << 30;

static LOCK_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);
static REGISTER_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);

struct ArenaMemory {
    base: NonNull<u8>,
    bytes: usize,
    locked: bool,
    registered: Cell<bool>,
    buddy: RefCell<Buddy>,
    heap_fallbacks: Cell<u64>,
}

impl Drop for ArenaMemory {
    fn drop(&mut self) {
        // SAFETY: base/bytes describe the mapping made in Arena::new; every IoBuf lent from it
        // holds an Rc to this memory, so none is alive now.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
        }
    }
}

/// What the arena got from the system, for stats.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArenaInfo {
    pub bytes: usize,
    pub locked: bool,
    pub registered: bool,
    pub free_bytes: usize,
    pub heap_fallbacks: u64,
}

/// A shard's pool of page-aligned, locked, ring-registered memory.
#[derive(Clone)]
pub struct Arena {
    memory: Rc<ArenaMemory>,
}

impl Arena {
    /// Map `bytes` (rounded up to 8 MiB, at most 1 GiB) and try to lock them.
    pub fn new(bytes: usize) -> io::Result<Arena> {
        let bytes = bytes
            .clamp(BLOCK_MAX_BYTES, ARENA_BYTES_MAX)
            .div_ceil(BLOCK_MAX_BYTES)
            * BLOCK_MAX_BYTES;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Ask for huge pages before the memory is touched, then lock (which faults it in): a
        // buffer in one huge page is one DMA segment, where 4 KiB pages would split a 1 MiB I/O
        // past the device's segment limit.
        // SAFETY: base is a live mapping of `bytes` bytes; these calls only give hints or lock.
        let locked = unsafe {
            libc::madvise(base, bytes, libc::MADV_HUGEPAGE);
            libc::mlock(base, bytes) == 0
        };
        if !locked {
            // Unlocked: fault the pages in now rather than on the first I/O.
            // SAFETY: base is a live, writable mapping of `bytes` bytes.
            unsafe { libc::madvise(base, bytes, libc::MADV_POPULATE_WRITE) };
        }
        if !locked && !LOCK_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "could not lock the {bytes}-byte buffer arena ({}); using unlocked memory",
                io::Error::last_os_error()
            );
        }
        Ok(Arena {
            memory: Rc::new(ArenaMemory {
                base: NonNull::new(base.cast()).expect("mmap returned null"),
                bytes,
                locked,
                registered: Cell::new(false),
                buddy: RefCell::new(Buddy::new(bytes)),
                heap_fallbacks: Cell::new(0),
            }),
        })
    }

    /// Register the arena with `reactor` as fixed buffer 0. A refusal is logged once and the
    /// arena goes on unregistered.
    pub fn register(&self, reactor: &Reactor) {
        let iovec = libc::iovec {
            iov_base: self.memory.base.as_ptr().cast(),
            iov_len: self.memory.bytes,
        };
        // SAFETY: the mapping outlives the ring's use of it: the shard drops its ring (after
        // reaping every operation) before the last Rc to this memory goes.
        match unsafe { reactor.register_buffers(&[iovec]) } {
            Ok(()) => self.memory.registered.set(true),
            Err(error) => {
                if !REGISTER_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                    log::warn!("could not register the buffer arena with io_uring ({error}); using unregistered buffers");
                }
            }
        }
    }

    /// A buffer of at least `bytes` capacity (rounded up to 4 KiB), length 0. Comes from the
    /// heap when the arena has no block large enough.
    pub fn allocate(&self, bytes: usize) -> IoBuf {
        let order = Buddy::order_for(bytes);
        let offset = order.and_then(|order| self.memory.buddy.borrow_mut().allocate(order));
        match (order, offset) {
            (Some(order), Some(offset)) => IoBuf {
                // SAFETY: offset + block size lies inside the mapping (the buddy allocator
                // manages exactly `bytes` bytes).
                pointer: unsafe { NonNull::new_unchecked(self.memory.base.as_ptr().add(offset)) },
                capacity: super::buddy::BLOCK_MIN_BYTES << order,
                len: 0,
                home: Home::Arena {
                    memory: self.memory.clone(),
                    offset,
                    order: order as u8,
                },
            },
            _ => {
                self.memory
                    .heap_fallbacks
                    .set(self.memory.heap_fallbacks.get() + 1);
                IoBuf::heap(bytes)
            }
        }
    }

    pub fn info(&self) -> ArenaInfo {
        ArenaInfo {
            bytes: self.memory.bytes,
            locked: self.memory.locked,
            registered: self.memory.registered.get(),
            free_bytes: self.memory.buddy.borrow().free_bytes(),
            heap_fallbacks: self.memory.heap_fallbacks.get(),
        }
    }
}

enum Home {
    Arena {
        memory: Rc<ArenaMemory>,
        offset: usize,
        order: u8,
    },
    Heap {
        layout: Layout,
    },
    /// A streamed chunk's allocation, which goes back to the chunk pool.
    Chunk {
        layout: Layout,
    },
}

/// An aligned buffer for direct I/O, owned by one shard. Its memory is always initialised (the
/// arena's mapping starts zeroed, the heap fallback is allocated zeroed), so any length up to
/// the capacity may be exposed.
pub struct IoBuf {
    pointer: NonNull<u8>,
    capacity: usize,
    len: usize,
    home: Home,
}

impl IoBuf {
    /// An aligned, zeroed, unregistered buffer from the heap.
    pub fn heap(bytes: usize) -> IoBuf {
        let capacity = super::align_up(bytes.max(1));
        let layout = Layout::from_size_align(capacity, BUFFER_ALIGN_BYTES).expect("valid layout");
        // SAFETY: layout has a non-zero size.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        let pointer =
            NonNull::new(pointer).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf {
            pointer,
            capacity,
            len: 0,
            home: Home::Heap { layout },
        }
    }

    /// A buffer of a chunk allocation (`super::chunk`) at `pointer`, made with `layout`, whose
    /// first `capacity` bytes are initialised; it goes back to the chunk pool when dropped.
    ///
    /// # Safety
    /// `pointer` must come from the chunk pool with `layout` (aligned to
    /// `BUFFER_ALIGN_BYTES`, at least `capacity` bytes) and be owned by nothing else.
    pub(super) unsafe fn from_chunk(
        pointer: NonNull<u8>,
        capacity: usize,
        layout: Layout,
    ) -> IoBuf {
        debug_assert!(capacity <= layout.size() && layout.align() >= BUFFER_ALIGN_BYTES);
        IoBuf {
            pointer,
            capacity,
            len: 0,
            home: Home::Chunk { layout },
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the length; the bytes up to it are whatever the buffer holds.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "length {len} past capacity {}",
            self.capacity
        );
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: pointer is valid for `capacity` initialised bytes and len <= capacity.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.len) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.pointer.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.pointer.as_ptr()
    }

    /// The ring's fixed-buffer index when this buffer lies in a registered arena.
    pub fn fixed_index(&self) -> Option<u16> {
        match &self.home {
            Home::Arena { memory, .. } if memory.registered.get() => Some(0),
            _ => None,
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.home {
            Home::Arena {
                memory,
                offset,
                order,
            } => memory.buddy.borrow_mut().release(*offset, *order as usize),
            // SAFETY: pointer was allocated with this layout in IoBuf::heap.
            Home::Heap { layout } => unsafe { std::alloc::dealloc(self.pointer.as_ptr(), *layout) },
            // SAFETY: from the chunk pool with this layout (`from_chunk`), used no more.
            Home::Chunk { layout } => unsafe { super::chunk::give_back(self.pointer, *layout) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_fall_back_to_the_heap() {
        let arena = Arena::new(BLOCK_MAX_BYTES).unwrap();
        let big = arena.allocate(BLOCK_MAX_BYTES);
        assert_eq!(big.as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        assert_eq!(arena.info().free_bytes, 0);
        let mut spill = arena.allocate(10_000);
        assert_eq!(spill.capacity(), 12_288);
        assert_eq!(spill.as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        assert_eq!(arena.info().heap_fallbacks, 1);
        spill.set_len(10_000);
        spill.as_mut_slice().fill(7);
        assert!(spill.as_slice().iter().all(|&byte| byte == 7));
        drop(big);
        assert_eq!(arena.info().free_bytes, BLOCK_MAX_BYTES);
    }
}
