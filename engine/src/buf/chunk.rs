//! A streamed put's chunk: filled on whichever thread receives its bytes, then written to the
//! device from where it lies. Its allocation is aligned for direct I/O and has a block in front
//! for the entry's header and room after for the padding, so the shard writes it without first
//! copying it into its arena (`ChunkData::into_entry_buf`).
//!
//! Allocations are reused rather than given back to the allocator (as `SharedBuf`'s are): a
//! fresh one of 4 MiB costs a page fault and a page clearing per 4 KiB on its first write,
//! which made a streamed put cost more CPU than the copy into the arena it saves. The pool
//! keeps at most `CHUNK_POOL_BYTES_MAX` bytes of idle allocations.

use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::{align_up, IoBuf, BUFFER_ALIGN_BYTES};
use crate::format::BLOCK_BYTES;

/// Idle bytes of chunk allocations the pool keeps at most (the node's default bound on
/// streamed bytes in memory is 128 MiB).
pub const CHUNK_POOL_BYTES_MAX: usize = 64 << 20;

/// The huge page the allocations are aligned to (a multiple of `BUFFER_ALIGN_BYTES`).
const HUGE_PAGE_BYTES: usize = 2 << 20;
const _: () = assert!(HUGE_PAGE_BYTES.is_multiple_of(BUFFER_ALIGN_BYTES));

/// An idle allocation.
struct Idle {
    pointer: NonNull<u8>,
    layout: Layout,
}

// SAFETY: an idle allocation is owned by the pool alone.
unsafe impl Send for Idle {}

struct Pool {
    idle: Vec<Idle>,
    idle_bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    idle: Vec::new(),
    idle_bytes: 0,
});

/// An allocation of at least `bytes` (aligned for direct I/O): an idle one of the pool when
/// one is large enough, else a new one. Its bytes are not initialised.
fn allocate(bytes: usize) -> (NonNull<u8>, Layout) {
    {
        let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = pool
            .idle
            .iter()
            .rposition(|idle| idle.layout.size() >= bytes)
        {
            let idle = pool.idle.swap_remove(found);
            pool.idle_bytes -= idle.layout.size();
            return (idle.pointer, idle.layout);
        }
    }
    // Aligned to a huge page and advised to be backed by them, as the arena is: a 4 MiB
    // write from 4 KiB pages reaches the device in many more pieces.
    let layout = Layout::from_size_align(bytes, HUGE_PAGE_BYTES).expect("valid layout");
    // SAFETY: the layout's size is at least a block (every caller asks for one).
    let pointer = unsafe { std::alloc::alloc(layout) };
    let pointer = NonNull::new(pointer).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
    // SAFETY: advice on memory this allocation owns; failure only loses the advice.
    unsafe { libc::madvise(pointer.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE) };
    (pointer, layout)
}

/// Give an allocation of `allocate` back: kept idle within the pool's bound, else freed.
///
/// # Safety
/// `pointer` must come from `allocate` with `layout`, and nothing may use it after.
pub(super) unsafe fn give_back(pointer: NonNull<u8>, layout: Layout) {
    let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if pool.idle_bytes + layout.size() <= CHUNK_POOL_BYTES_MAX {
        pool.idle_bytes += layout.size();
        pool.idle.push(Idle { pointer, layout });
        return;
    }
    drop(pool);
    // SAFETY: allocated with this layout (the caller's promise).
    unsafe { std::alloc::dealloc(pointer.as_ptr(), layout) };
}

/// The bytes of one chunk, up to the capacity it was made with; see the module's comment.
pub struct ChunkData {
    /// The allocation's start: the header block, then the data from `BLOCK_BYTES`. Dangling
    /// when `layout` is `None` (an empty chunk of no allocation).
    pointer: NonNull<u8>,
    layout: Option<Layout>,
    capacity: usize,
    /// Data bytes written (all initialised).
    len: usize,
}

// SAFETY: a `ChunkData` owns its allocation outright; nothing else points into it.
unsafe impl Send for ChunkData {}
// SAFETY: shared references only read initialised bytes.
unsafe impl Sync for ChunkData {}

impl Default for ChunkData {
    fn default() -> ChunkData {
        ChunkData {
            pointer: NonNull::dangling(),
            layout: None,
            capacity: 0,
            len: 0,
        }
    }
}

impl ChunkData {
    /// Room for `bytes` data bytes, none written yet.
    pub fn with_capacity(bytes: usize) -> ChunkData {
        // The bytes are not initialised: only those written (`len`) are ever read, and
        // `into_entry_buf` writes the others it exposes.
        let (pointer, layout) = allocate(BLOCK_BYTES + align_up(bytes));
        ChunkData {
            pointer,
            layout: Some(layout),
            capacity: bytes,
            len: 0,
        }
    }

    /// A chunk holding a copy of `bytes`.
    pub fn copied_from(bytes: &[u8]) -> ChunkData {
        let mut data = ChunkData::with_capacity(bytes.len());
        data.extend_from_slice(bytes);
        data
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

    fn data_pointer(&self) -> *mut u8 {
        if self.layout.is_none() {
            return self.pointer.as_ptr();
        }
        // SAFETY: the allocation is at least a block long.
        unsafe { self.pointer.as_ptr().add(BLOCK_BYTES) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` data bytes are written (for an empty chunk: none, at a
        // dangling but aligned pointer).
        unsafe { std::slice::from_raw_parts(self.data_pointer(), self.len) }
    }

    /// Append `bytes`; panics past the capacity.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() <= self.capacity - self.len,
            "{} bytes into a chunk with room for {}",
            bytes.len(),
            self.capacity - self.len
        );
        // SAFETY: within the capacity (checked above), and `bytes` cannot overlap memory this
        // chunk owns exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.data_pointer().add(self.len),
                bytes.len(),
            )
        };
        self.len += bytes.len();
    }

    /// The room not yet written, for a read that fills it before `set_len` (as `Vec`'s).
    pub fn spare_capacity_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: within the allocation; MaybeUninit makes no claim about the bytes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.data_pointer().add(self.len).cast::<MaybeUninit<u8>>(),
                self.capacity - self.len,
            )
        }
    }

    /// Set the bytes written.
    ///
    /// # Safety
    /// The first `len` bytes must have been written (`len` at most the capacity).
    pub unsafe fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "length {len} past capacity {}",
            self.capacity
        );
        self.len = len;
    }

    /// The entry's buffer: a zeroed header block, the data, and zeros to the next block
    /// boundary; its length is that whole entry. The bytes stay where they are.
    pub(crate) fn into_entry_buf(self) -> IoBuf {
        let entry_bytes = BLOCK_BYTES + align_up(self.len);
        let this = std::mem::ManuallyDrop::new(self);
        let Some(layout) = this.layout else {
            let mut buf = IoBuf::heap(BLOCK_BYTES);
            buf.set_len(BLOCK_BYTES);
            return buf;
        };
        // SAFETY: the header block and the padding lie within the allocation (made for the
        // capacity, and len <= capacity); writing them makes every byte of the entry
        // initialised. The allocation passes to the IoBuf, which gives it back to the pool.
        unsafe {
            std::ptr::write_bytes(this.pointer.as_ptr(), 0, BLOCK_BYTES);
            let end = BLOCK_BYTES + this.len;
            std::ptr::write_bytes(this.pointer.as_ptr().add(end), 0, entry_bytes - end);
            let mut buf = IoBuf::from_chunk(this.pointer, entry_bytes, layout);
            buf.set_len(entry_bytes);
            buf
        }
    }
}

impl std::ops::Deref for ChunkData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for ChunkData {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: from `allocate` with this layout in `with_capacity`.
            unsafe { give_back(self.pointer, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_becomes_its_entry_where_it_lies() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut chunk = ChunkData::with_capacity(data.len());
        chunk.extend_from_slice(&data[..3000]);
        chunk.extend_from_slice(&data[3000..]);
        assert_eq!(&chunk[..], &data[..]);
        let data_at = chunk.as_slice().as_ptr() as usize;
        let buf = chunk.into_entry_buf();
        assert_eq!(buf.as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        assert_eq!(buf.as_ptr() as usize + BLOCK_BYTES, data_at, "not copied");
        assert_eq!(buf.len(), BLOCK_BYTES + align_up(data.len()));
        let bytes = buf.as_slice();
        assert!(bytes[..BLOCK_BYTES].iter().all(|&byte| byte == 0));
        assert_eq!(&bytes[BLOCK_BYTES..BLOCK_BYTES + data.len()], &data[..]);
        assert!(bytes[BLOCK_BYTES + data.len()..]
            .iter()
            .all(|&byte| byte == 0));
        let empty = ChunkData::default().into_entry_buf();
        assert_eq!(empty.len(), BLOCK_BYTES);
    }

    #[test]
    #[should_panic(expected = "into a chunk with room for")]
    fn a_chunk_refuses_bytes_past_its_capacity() {
        let mut chunk = ChunkData::with_capacity(10);
        chunk.extend_from_slice(&[1; 11]);
    }
}
