//! Same-host regions: sealed memfds mapped by the server and the client, registered with every
//! shard's ring at one fixed-buffer slot when the bound on registered bytes allows, and the
//! bound on the bytes of all clients' regions and ring files.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use hydrant_engine::rt::{block_on, current_reactor, EXTERNAL_FIXED_SLOTS};
use hydrant_engine::EngineHandle;
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

use super::{HUGE_PAGE_BYTES, LOCAL_REGION_BYTES_TOTAL_MAX, LOCAL_REGISTERED_BYTES_MAX};
use crate::metrics::{LOCAL_REGIONS, LOCAL_REGION_BYTES};

/// Count `bytes` more of regions or ring files against `LOCAL_REGION_BYTES_TOTAL_MAX`; false
/// (and nothing counted) when that would pass it. Given back by whoever holds them when
/// they go (`Region`'s and the ring file's drop).
pub(super) fn reserve_shared_bytes(bytes: u64) -> bool {
    let total = LOCAL_REGION_BYTES.fetch_add(bytes, Ordering::SeqCst) + bytes;
    if total > LOCAL_REGION_BYTES_TOTAL_MAX {
        LOCAL_REGION_BYTES.fetch_sub(bytes, Ordering::SeqCst);
        return false;
    }
    true
}

/// Why `reserve_shared_bytes` said no.
pub(super) fn shared_bytes_refusal() -> String {
    format!(
        "same-host regions and rings are at their bound of {LOCAL_REGION_BYTES_TOTAL_MAX} bytes"
    )
}

/// A shared region: a sealed memfd and the server's mapping of it.
pub(super) struct Region {
    pub(super) memfd: OwnedFd,
    /// The server's shared mapping of the whole memfd, unmapped when the region is dropped.
    mapping: MmapRaw,
    pub(super) bytes: u64,
    pub(super) huge_pages: bool,
    /// The fixed-buffer slot it is registered at on every shard's ring, if it is.
    pub(super) slot: Option<u16>,
}

/// Fixed-buffer slots (1 to `EXTERNAL_FIXED_SLOTS`) taken by regions, the same on every ring.
/// A slot is given back only after every ring has emptied it.
static SLOTS_TAKEN: Mutex<u64> = Mutex::new(0);

fn take_slot() -> Option<u16> {
    let mut taken = SLOTS_TAKEN.lock().expect("not poisoned");
    let slot = (1..=EXTERNAL_FIXED_SLOTS).find(|slot| *taken & (1 << (slot - 1)) == 0)?;
    *taken |= 1 << (slot - 1);
    Some(slot)
}

pub(super) fn give_back_slot(slot: u16) {
    *SLOTS_TAKEN.lock().expect("not poisoned") &= !(1 << (slot - 1));
}

/// Register `region` with every shard's ring at one slot, so that reads into it are READ_FIXED
/// (no per-read page pinning). `None` when there is no free slot or a ring refuses (memlock
/// limit, an old kernel): the region is then read with plain READs, which work as well.
pub(super) fn register_region(engine: &EngineHandle, address: usize, bytes: u64) -> Option<u16> {
    let total = REGISTERED_BYTES.fetch_add(bytes, Ordering::SeqCst) + bytes;
    let slot = if total <= LOCAL_REGISTERED_BYTES_MAX {
        take_slot()
    } else {
        None
    };
    let Some(slot) = slot else {
        REGISTERED_BYTES.fetch_sub(bytes, Ordering::SeqCst);
        return None;
    };
    let mut registered = Vec::new();
    for shard in 0..engine.shard_count() {
        let call = engine.on_shard(shard, move |_cache| async move {
            let iovec = libc::iovec {
                iov_base: address as *mut libc::c_void,
                iov_len: bytes as usize,
            };
            // SAFETY: the region stays mapped until `unregister_region` has emptied this slot
            // on every ring (the connection does that before it lets go of the region).
            unsafe { current_reactor().register_external(slot, iovec) }
                .map_err(|error| hydrant_engine::Error::io("fixed-buffer registration", error))
        });
        match block_on(call) {
            Ok(()) => registered.push(shard),
            Err(error) => {
                if !REGISTRATION_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                    log::warn!("local socket: a region could not be registered with the rings ({error}); regions are read with plain READs");
                }
                if unregister_on(engine, slot, registered) {
                    give_back_slot(slot);
                }
                REGISTERED_BYTES.fetch_sub(bytes, Ordering::SeqCst);
                return None;
            }
        }
    }
    Some(slot)
}

static REGISTRATION_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);
/// Bytes of the regions registered now.
pub(super) static REGISTERED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Empty `slot` on `shards`; false when a ring refused (the slot must then not be reused: that
/// ring still holds the old region's pages).
pub(super) fn unregister_on(engine: &EngineHandle, slot: u16, shards: Vec<usize>) -> bool {
    let mut emptied = true;
    for shard in shards {
        let call = engine.on_shard(shard, move |_cache| async move {
            current_reactor()
                .unregister_external(slot)
                .map_err(|error| hydrant_engine::Error::io("fixed-buffer unregistration", error))
        });
        if let Err(error) = block_on(call) {
            log::error!("local socket: slot {slot} of shard {shard} could not be emptied: {error}");
            emptied = false;
        }
    }
    emptied
}

impl Region {
    /// Huge pages when the size allows and the system has them reserved; else plain pages.
    pub(super) fn create(bytes: u64) -> io::Result<Region> {
        if bytes.is_multiple_of(HUGE_PAGE_BYTES) {
            if let Ok(region) = Region::create_with(bytes, true) {
                return Ok(region);
            }
        }
        Region::create_with(bytes, false)
    }

    fn create_with(bytes: u64, huge_pages: bool) -> io::Result<Region> {
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        if huge_pages {
            flags |= MFdFlags::MFD_HUGETLB;
        }
        let memfd = memfd_create(c"hydrant-region", flags)?;
        let length = libc::off_t::try_from(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        nix::unistd::ftruncate(&memfd, length)?;
        // The client must not shrink the file under our mapping (a write past its end would
        // raise SIGBUS in the server) nor grow it; SEAL_SEAL keeps these seals final.
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals))?;
        let mapping = MmapOptions::new().len(bytes as usize).map_raw(&memfd)?;
        Ok(Region {
            memfd,
            mapping,
            bytes,
            huge_pages,
            slot: None,
        })
    }
}

impl Region {
    /// Where the server's mapping starts. The server writes the region only through
    /// `ExternalBuf` (device reads and copies into ranges of it) and never hands out references
    /// into it.
    pub(super) fn address(&self) -> usize {
        self.mapping.as_mut_ptr() as usize
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // The mapping goes with the last holder: the connection, and every read that may still
        // write into it (an operation in flight on a ring holds its `ExternalBuf`, and so this
        // region, until its completion arrives).
        LOCAL_REGIONS.fetch_sub(1, Ordering::SeqCst);
        LOCAL_REGION_BYTES.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}
