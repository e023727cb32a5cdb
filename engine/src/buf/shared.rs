//! Buffers that carry a read's bytes to another thread (the S3 gateway's), reused rather than
//! given back to the allocator: a fresh buffer of a MiB costs a page fault and a page clearing
//! per 4 KiB on its first write, measured at a quarter of the CPU of an S3 GET from NVMe.
//!
//! The pool keeps at most `SHARED_POOL_BYTES_MAX` bytes of idle buffers, each of at most
//! `SHARED_BUFFER_BYTES_MAX`; a buffer dropped beyond that goes back to the allocator.

use std::sync::Mutex;

/// Idle bytes the pool keeps at most.
pub const SHARED_POOL_BYTES_MAX: usize = 64 << 20;
/// A buffer larger than this is never kept.
pub const SHARED_BUFFER_BYTES_MAX: usize = 4 << 20;

struct Pool {
    idle: Vec<Vec<u8>>,
    idle_bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    idle: Vec::new(),
    idle_bytes: 0,
});

/// A buffer of the pool, holding bytes; it goes back to the pool when dropped.
pub struct SharedBuf(Vec<u8>);

impl SharedBuf {
    /// An empty buffer with room for `bytes` bytes: an idle one of the pool when one has the
    /// room, else a new one.
    pub fn with_capacity(bytes: usize) -> SharedBuf {
        if bytes <= SHARED_BUFFER_BYTES_MAX {
            let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(found) = pool.idle.iter().rposition(|idle| idle.capacity() >= bytes) {
                let buffer = pool.idle.swap_remove(found);
                pool.idle_bytes -= buffer.capacity();
                return SharedBuf(buffer);
            }
        }
        SharedBuf(Vec::with_capacity(bytes))
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// As a `bytes::Bytes` (no copy); the buffer returns to the pool when the last clone of it
    /// is dropped.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for SharedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        let mut buffer = std::mem::take(&mut self.0);
        let capacity = buffer.capacity();
        if capacity == 0 || capacity > SHARED_BUFFER_BYTES_MAX {
            return;
        }
        buffer.clear();
        let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if pool.idle_bytes + capacity <= SHARED_POOL_BYTES_MAX {
            pool.idle_bytes += capacity;
            pool.idle.push(buffer);
        }
    }
}

/// Idle buffers and their bytes (for tests and metrics).
pub fn pooled() -> (usize, usize) {
    let pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    (pool.idle.len(), pool.idle_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_and_the_pool_stays_within_its_bound() {
        let mut first = SharedBuf::with_capacity(1 << 20);
        first.extend_from_slice(&[7u8; 1000]);
        let address = first.0.as_ptr();
        let bytes = first.into_bytes();
        assert_eq!(&bytes[..], &[7u8; 1000][..]);
        let clone = bytes.slice(10..20);
        drop(bytes);
        drop(clone);
        // Other tests may take buffers from the pool at the same time: find ours among a few.
        let taken: Vec<SharedBuf> = (0..8).map(|_| SharedBuf::with_capacity(1 << 20)).collect();
        assert!(taken.iter().any(|buffer| buffer.0.as_ptr() == address));
        assert!(taken.iter().all(SharedBuf::is_empty));
        drop(taken);
        let many: Vec<SharedBuf> = (0..(SHARED_POOL_BYTES_MAX >> 20) + 16)
            .map(|_| SharedBuf::with_capacity(1 << 20))
            .collect();
        drop(many);
        assert!(pooled().1 <= SHARED_POOL_BYTES_MAX);
        // Too large to keep.
        drop(SharedBuf::with_capacity(SHARED_BUFFER_BYTES_MAX + 1));
        assert!(pooled().1 <= SHARED_POOL_BYTES_MAX);
    }
}
