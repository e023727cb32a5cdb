//! Memory outside the shard's arena that a device read may land in directly: a same-host
//! client's shared region, for instance. The ring never sees a dangling pointer: the buffer
//! carries an owner that keeps the memory alive, and an operation in flight holds the buffer
//! (and so the owner) until its completion arrives, even if the future that asked is dropped.

use std::any::Any;
use std::sync::Arc;

use super::BUFFER_ALIGN_BYTES;

/// `length` bytes at `address`, valid and writable for as long as `owner` lives.
#[derive(Clone)]
pub struct ExternalBuf {
    owner: Arc<dyn Any + Send + Sync>,
    address: usize,
    length: usize,
    /// The rings' fixed-buffer slot that holds this memory, when it is registered.
    fixed: Option<u16>,
}

impl ExternalBuf {
    /// # Safety
    /// `address..address + length` must be memory that stays mapped and writable for as long
    /// as `owner` lives, that no Rust reference points into while a read may write it, and
    /// whose bytes may be read at any time (other processes may write it too: readers of it
    /// get plain bytes, never a promise that they stay put).
    pub unsafe fn new(
        owner: Arc<dyn Any + Send + Sync>,
        address: usize,
        length: usize,
    ) -> ExternalBuf {
        ExternalBuf {
            owner,
            address,
            length,
            fixed: None,
        }
    }

    /// The same memory, read with READ_FIXED through fixed-buffer slot `slot`.
    ///
    /// # Safety
    /// Slot `slot` of every ring this buffer is read on must hold memory that contains this
    /// buffer's range (`Reactor::register_external`), and stay registered while it is read:
    /// the kernel writes to the pages it pinned for the slot, whatever is mapped here now.
    pub unsafe fn with_fixed_slot(mut self, slot: u16) -> ExternalBuf {
        self.fixed = Some(slot);
        self
    }

    /// The fixed-buffer slot it is read through, if any.
    pub fn fixed_slot(&self) -> Option<u16> {
        self.fixed
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    pub fn address(&self) -> usize {
        self.address
    }

    /// Whether a direct (O_DIRECT) read may land at its start.
    pub fn is_aligned(&self) -> bool {
        self.address.is_multiple_of(BUFFER_ALIGN_BYTES)
    }

    /// `length` bytes from `offset`, with the same owner; `None` past the end.
    pub fn slice(&self, offset: usize, length: usize) -> Option<ExternalBuf> {
        let end = offset.checked_add(length)?;
        (end <= self.length).then(|| ExternalBuf {
            owner: self.owner.clone(),
            address: self.address + offset,
            length,
            fixed: self.fixed,
        })
    }

    /// Copy `bytes` to `offset`. Panics past the end.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) {
        let end = offset.checked_add(bytes.len()).expect("no overflow");
        assert!(
            end <= self.length,
            "write of {end} bytes into {}",
            self.length
        );
        // SAFETY: within the memory the constructor's caller vouched for; `bytes` is engine
        // memory, which cannot overlap memory no Rust reference points into.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (self.address + offset) as *mut u8,
                bytes.len(),
            )
        }
    }

    /// The CRC32C of `length` bytes from `offset`, read where they lie. Panics past the end.
    pub fn crc32c(&self, offset: usize, length: usize) -> u32 {
        self.with_bytes(offset, length, hydrant_crc::crc32c)
    }

    /// `f` of the `length` bytes from `offset`, read where they lie (to checksum them, or copy
    /// them). Panics past the end. Another process may change the bytes meanwhile: `f` gets
    /// plain bytes, never a promise that they stay put (a checksum of them may then fail later).
    pub fn with_bytes<R>(&self, offset: usize, length: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let end = offset.checked_add(length).expect("no overflow");
        assert!(end <= self.length, "{end} bytes of {}", self.length);
        // SAFETY: within the memory the constructor's caller vouched for; the slice lives only
        // for this call, while no read of ours writes there.
        let bytes =
            unsafe { std::slice::from_raw_parts((self.address + offset) as *const u8, length) };
        f(bytes)
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.address as *mut u8
    }
}
