//! Pinned buffers for O_DIRECT I/O.
//!
//! Each shard owns one [`Arena`]: a page-aligned mapping, locked in memory and registered with
//! the shard's ring as fixed buffer 0, so that READ_FIXED/WRITE_FIXED skip per-I/O page pinning.
//! When locking or registration is refused (RLIMIT_MEMLOCK without CAP_IPC_LOCK), the arena
//! keeps working as plain aligned memory and says so once. When the arena is exhausted, a
//! buffer comes from the heap (aligned, unregistered) instead of failing.

mod arena;
mod buddy;
mod chunk;
mod external;
mod shared;

pub use arena::{Arena, ArenaInfo, IoBuf};
pub use chunk::ChunkData;
pub use external::ExternalBuf;
pub use shared::{pooled, SharedBuf, SHARED_BUFFER_BYTES_MAX, SHARED_POOL_BYTES_MAX};

/// Every buffer is aligned to, and sized in multiples of, this many bytes: the largest direct
/// I/O alignment we accept from a device, and the unit of the on-disk format.
pub const BUFFER_ALIGN_BYTES: usize = 4096;

/// Round `bytes` up to a multiple of [`BUFFER_ALIGN_BYTES`].
pub const fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(BUFFER_ALIGN_BYTES) * BUFFER_ALIGN_BYTES
}
