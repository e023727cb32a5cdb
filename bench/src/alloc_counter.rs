//! A global allocator that counts live heap bytes, so that memory costs are measured, not
//! estimated. It counts only once a measurement has called `start_counting`: the counter is one
//! cache line for every thread, and a benchmark of a server and its clients in this process
//! (on two cores) would otherwise pay for it on every allocation of both.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

fn count(bytes: isize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
    }
}

pub struct CountingAllocator;

// SAFETY: every call is forwarded to the system allocator unchanged; we only count sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the pointer came from this allocator with this layout.
        unsafe { System.dealloc(pointer, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the pointer came from this allocator with this layout.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// Count allocations and frees from now on (every thread's). Differences of `live_bytes` taken
/// after this are what was allocated and not freed in between.
pub fn start_counting() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Heap bytes allocated and not yet freed, by every thread, since `start_counting`.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
