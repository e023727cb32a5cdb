//! The same-host client: reads land in a memory region shared with a server on this machine
//! (`hydrant-server --local-socket PATH`); only a small completion crosses the socket.
//!
//! ```no_run
//! # fn main() -> hydrant_client::Result<()> {
//! use hydrant_client::local::LocalClient;
//! let mut client = LocalClient::connect("/run/hydrant.sock")?;
//! let mut region = client.allocate(64 << 20)?;
//! let _ = region.register_cuda(); // pinned for the GPU when CUDA is there; fine without
//! let info = client.read_into(&mut region, 0, "bucket", "key", None)?;
//! let bytes = &region.as_slice()[..info.written as usize];
//! # let _ = bytes; Ok(()) }
//! ```
//!
//! A region belongs to the connection that allocated it: the server frees its side when the
//! connection closes, and the client's mapping lives until the `Region` is dropped.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memmap2::{MmapMut, MmapOptions};
use nix::sys::socket;

use hydrant_proto::local::{
    local_message, LocalHeader, LocalOpcode, LocalRead, LocalReadAnswer, LocalReadItem,
    LocalRegionInfo, LocalWrite, LocalWriteMemory, LOCAL_HEADER_BYTES, LOCAL_RANGE_TO_END,
    LOCAL_REGION_FLAG_HUGE_PAGES, LOCAL_WRITE_PARTS_MAX,
};
pub use hydrant_proto::local::{LocalCondition, LocalWriteAnswer as WriteInfo};
use hydrant_proto::Status;

use crate::cuda::{CudaError, CudaRuntime};

mod ring;
use crate::{ClientError, Result};
pub use ring::{wait_rings, LocalRing, RingDone};

/// How long a request may wait for its answer.
const LOCAL_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a WRITE may wait for its answer: a large object to a write-through bucket is
/// answered only once the origin has it.
const LOCAL_WRITE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Distinguishes connections, so that a region is only used with the one it belongs to.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// What a read did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadInfo {
    /// Size of the whole object.
    pub object_bytes: u64,
    /// Offset in the object of the first byte written.
    pub range_start: u64,
    /// Bytes written into the region at the read's offset.
    pub written: u64,
}

/// One read of a batch: `bucket/key` (or `range`: start, exclusive end) into the region at
/// `offset`, using at most `length` bytes there.
#[derive(Clone, Debug)]
pub struct LocalGet {
    pub offset: u64,
    pub length: u64,
    pub bucket: String,
    pub key: String,
    pub range: Option<(u64, Option<u64>)>,
}

/// A connection to a server's same-host socket.
pub struct LocalClient {
    stream: UnixStream,
    connection: u64,
    next_request: u64,
    /// The process that connected: the server reads its memory for `write_memory`, so a forked
    /// child may not use this connection for that.
    pid: u32,
    /// Whether the server was named this process's tracer (`allow_server_to_read`).
    tracer_named: bool,
}

/// A shared memory region: the server writes reads into it; the client reads (and may register
/// it with CUDA).
pub struct Region {
    _memfd: OwnedFd,
    /// The client's shared mapping of the whole memfd.
    mapping: MmapMut,
    id: u32,
    connection: u64,
    huge_pages: bool,
    cuda: Option<Arc<CudaRuntime>>,
}

impl Region {
    pub fn len(&self) -> usize {
        self.mapping.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty()
    }

    /// Whether the server backed it with huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// Whether it is registered with CUDA (page-locked for DMA).
    pub fn cuda_registered(&self) -> bool {
        self.cuda.is_some()
    }

    /// The region's bytes. The server writes into it only during a read, which takes
    /// `&mut self`.
    pub fn as_slice(&self) -> &[u8] {
        &self.mapping
    }

    /// The region to write into (a consumer's own scratch use between reads).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mapping
    }

    /// The start of the mapping, for handing to a device API (cudaMemcpy and the like).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.mapping.as_mut_ptr()
    }

    /// Register the region with CUDA (loaded at run time). On error the region works as before,
    /// unpinned.
    pub fn register_cuda(&mut self) -> std::result::Result<(), CudaError> {
        if self.cuda.is_some() {
            return Ok(());
        }
        let runtime = CudaRuntime::load()?;
        self.register_with(runtime)
    }

    /// Register with a runtime the caller loaded.
    pub fn register_with(
        &mut self,
        runtime: Arc<CudaRuntime>,
    ) -> std::result::Result<(), CudaError> {
        // SAFETY: the mapping stays until Drop, which unregisters first.
        unsafe { runtime.register(self.mapping.as_mut_ptr(), self.mapping.len())? };
        self.cuda = Some(runtime);
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(runtime) = self.cuda.take() {
            // SAFETY: registered with this runtime in register_with.
            let _ = unsafe { runtime.unregister(self.mapping.as_mut_ptr()) };
        }
        // The mapping is unmapped as it is dropped, after the unregistration.
    }
}

impl LocalClient {
    pub fn connect(path: impl AsRef<Path>) -> Result<LocalClient> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|error| {
            ClientError::Io(io::Error::new(
                error.kind(),
                format!("{}: {error}", path.display()),
            ))
        })?;
        stream.set_read_timeout(Some(LOCAL_REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(LOCAL_REQUEST_TIMEOUT))?;
        Ok(LocalClient {
            stream,
            connection: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            next_request: 1,
            pid: std::process::id(),
            tracer_named: false,
        })
    }

    /// A region of `bytes` shared with the server (at most 16 GiB per connection in all).
    pub fn allocate(&mut self, bytes: u64) -> Result<Region> {
        let (_, body, fds) = self.call(LocalOpcode::Allocate, &bytes.to_le_bytes())?;
        let info = LocalRegionInfo::decode(&body)?;
        let memfd = fds.into_iter().next().ok_or_else(|| {
            ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server's ALLOCATE answer came without a file descriptor",
            ))
        })?;
        // SAFETY: a shared mapping of the whole memfd the server sized and sealed against
        // shrinking (so no access past its end can fault); the server writes into it only
        // during a read, which takes the region by `&mut`.
        let mapping = unsafe {
            MmapOptions::new()
                .len(info.bytes as usize)
                .map_mut(&memfd)?
        };
        Ok(Region {
            _memfd: memfd,
            mapping,
            id: info.region,
            connection: self.connection,
            huge_pages: info.flags & LOCAL_REGION_FLAG_HUGE_PAGES != 0,
            cuda: None,
        })
    }

    /// Read `bucket/key` (or `range`) into `region` at `offset`, using the rest of the region.
    pub fn read_into(
        &mut self,
        region: &mut Region,
        offset: u64,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<ReadInfo> {
        let item = LocalGet {
            offset,
            length: (region.len() as u64).saturating_sub(offset),
            bucket: bucket.to_string(),
            key: key.to_string(),
            range,
        };
        self.read_batch(region, &[item])?
            .pop()
            .expect("one result per item")
    }

    /// Several reads into one region in one request; one result per item, in order.
    pub fn read_batch(
        &mut self,
        region: &mut Region,
        items: &[LocalGet],
    ) -> Result<Vec<Result<ReadInfo>>> {
        if region.connection != self.connection {
            return Err(ClientError::Usage(
                "this region belongs to another connection".into(),
            ));
        }
        self.read_raw(region.id, items)
    }

    fn read_raw(&mut self, region: u32, items: &[LocalGet]) -> Result<Vec<Result<ReadInfo>>> {
        let request = LocalRead {
            region,
            items: items
                .iter()
                .map(|item| {
                    let (range_start, range_end) = match item.range {
                        None => (0, LOCAL_RANGE_TO_END),
                        Some((start, end)) => (start, end.unwrap_or(LOCAL_RANGE_TO_END)),
                    };
                    LocalReadItem {
                        offset: item.offset,
                        length: item.length,
                        range_start,
                        range_end,
                        bucket: item.bucket.clone(),
                        key: item.key.clone(),
                    }
                })
                .collect(),
        };
        let (_, body, _) = self.call(LocalOpcode::Read, &request.encode())?;
        let answer = LocalReadAnswer::decode(&body)?;
        if answer.items.len() != items.len() {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server answered a different number of items",
            )));
        }
        Ok(answer
            .items
            .into_iter()
            .map(|item| {
                if item.status == Status::Ok as u8 {
                    Ok(ReadInfo {
                        object_bytes: item.object_bytes,
                        range_start: item.range_start,
                        written: item.written,
                    })
                } else {
                    Err(ClientError::Status {
                        status: item.status,
                        message: item.message,
                    })
                }
            })
            .collect())
    }

    /// Store the `length` bytes at `offset` of `region` as `bucket/key`, by the bucket's write
    /// mode, if the key is as `condition` requires (else a PRECONDITION_FAILED status). The
    /// bytes do not cross the socket: the shard that owns the key checksums them in the region
    /// and has the device write them from there (from an `offset` that is a multiple of 4096;
    /// else it copies them into its own buffers first). Answers once the object is durable (on
    /// NVMe, or at the origin for a write-through bucket). Leave the bytes as they are until
    /// then: with bytes changed meanwhile the object may fail its checksums (its reads answer
    /// DATA_CORRUPT, and a restart after a crash drops it); no other object is affected. A
    /// client that goes away before the answer abandons the write
    /// (nothing becomes visible, unless its last chunk was already written).
    pub fn write_from(
        &mut self,
        region: &Region,
        offset: u64,
        length: u64,
        bucket: &str,
        key: &str,
        condition: LocalCondition,
    ) -> Result<WriteInfo> {
        if region.connection != self.connection {
            return Err(ClientError::Usage(
                "this region belongs to another connection".into(),
            ));
        }
        let request = LocalWrite {
            region: region.id,
            offset,
            length,
            condition,
            bucket: bucket.to_string(),
            key: key.to_string(),
        };
        self.stream.set_read_timeout(Some(LOCAL_WRITE_TIMEOUT))?;
        let answered = self.call(LocalOpcode::Write, &request.encode());
        self.stream.set_read_timeout(Some(LOCAL_REQUEST_TIMEOUT))?;
        let (_, body, _) = answered?;
        Ok(WriteInfo::decode(&body)?)
    }

    /// Store the concatenation of `parts`, bytes of this process's own memory, as
    /// `bucket/key`, as `write_from` does but with no region: the server reads them from this
    /// process (`process_vm_readv`) on its thread for this connection and streams them to the
    /// shard that owns the key. The kernel's
    /// ptrace rules decide whether the server may (a server of the same user or root may, and
    /// this client names the server as its tracer for Yama's `ptrace_scope` 1); where it may
    /// not, the answer is an UNSUPPORTED status and `write_from` is the way. Leave the bytes as
    /// they are until the answer, as for `write_from`.
    pub fn write_memory(
        &mut self,
        parts: &[&[u8]],
        bucket: &str,
        key: &str,
        condition: LocalCondition,
    ) -> Result<WriteInfo> {
        if std::process::id() != self.pid {
            // The server would read the connecting process's memory at this one's addresses.
            return Err(ClientError::Usage(
                "write_memory on a connection made by another process (before a fork): connect anew".into(),
            ));
        }
        self.allow_server_to_read();
        let request = LocalWriteMemory {
            parts: parts
                .iter()
                .filter(|part| !part.is_empty())
                .map(|part| (part.as_ptr() as u64, part.len() as u64))
                .collect(),
            condition,
            bucket: bucket.to_string(),
            key: key.to_string(),
        };
        if request.parts.len() > LOCAL_WRITE_PARTS_MAX as usize {
            return Err(ClientError::Usage(format!(
                "a write of {} parts; at most {LOCAL_WRITE_PARTS_MAX}",
                request.parts.len()
            )));
        }
        self.stream.set_read_timeout(Some(LOCAL_WRITE_TIMEOUT))?;
        let answered = self.call(LocalOpcode::WriteMemory, &request.encode());
        self.stream.set_read_timeout(Some(LOCAL_REQUEST_TIMEOUT))?;
        let (_, body, _) = answered?;
        Ok(WriteInfo::decode(&body)?)
    }

    /// Name the server (the socket's peer) as the process that may read this one, once per
    /// connection, where Yama's `ptrace_scope` is 1 (only descendants otherwise; it replaces a
    /// tracer the process named before). Best effort: where it fails, or the server's pid is
    /// not known here (another pid namespace), the server's own rights decide.
    fn allow_server_to_read(&mut self) {
        if std::mem::replace(&mut self.tracer_named, true) {
            return;
        }
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
        if scope.map(|scope| scope.trim() != "1").unwrap_or(true) {
            return;
        }
        let Ok(credentials) = socket::getsockopt(&self.stream, socket::sockopt::PeerCredentials)
        else {
            return;
        };
        if credentials.pid() <= 0 {
            return;
        }
        // SAFETY: PR_SET_PTRACER takes a pid; it changes only who may trace this process.
        unsafe {
            libc::prctl(
                libc::PR_SET_PTRACER,
                credentials.pid() as libc::c_ulong,
                0,
                0,
                0,
            )
        };
    }

    /// A read ring of `entries` (a power of two, at most 1024) over `region`, served by
    /// `shard` (or one the server chooses): many reads in flight on this connection, each
    /// landing in the region (see `LocalRing`).
    pub fn open_ring(
        &mut self,
        region: &Region,
        entries: u32,
        shard: Option<u32>,
    ) -> Result<LocalRing> {
        use hydrant_proto::local_ring::{RingInfo, RingOpen, LOCAL_RING_ANY_SHARD};
        if region.connection != self.connection {
            return Err(ClientError::Usage(
                "this region belongs to another connection".into(),
            ));
        }
        let open = RingOpen {
            region: region.id,
            entries,
            shard: shard.unwrap_or(LOCAL_RING_ANY_SHARD),
        };
        let (_, body, fds) = self.call(LocalOpcode::RingOpen, &open.encode())?;
        let info = RingInfo::decode(&body)?;
        let [memfd, submit, complete]: [OwnedFd; 3] = fds.try_into().map_err(|_| {
            ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server's RING_OPEN answer came without its three file descriptors",
            ))
        })?;
        LocalRing::new(
            memfd,
            submit,
            complete,
            self.stream.try_clone()?,
            info,
            region.id,
            region.len() as u64,
            self.connection,
        )
    }

    /// Give the server's side of a region back before the connection closes.
    pub fn free(&mut self, region: Region) -> Result<()> {
        self.release(&region)
    }

    /// Give the server's side of `region` back, keeping this side's mapping until the `Region`
    /// is dropped (for callers whose views of it may outlive the server's use: reads into it
    /// fail from now on).
    pub fn release(&mut self, region: &Region) -> Result<()> {
        if region.connection != self.connection {
            return Err(ClientError::Usage(
                "this region belongs to another connection".into(),
            ));
        }
        self.call(LocalOpcode::Free, &region.id.to_le_bytes())?;
        Ok(())
    }

    /// Send one request and read its answer (with the fd it carries, if any).
    fn call(
        &mut self,
        opcode: LocalOpcode,
        body: &[u8],
    ) -> Result<(LocalHeader, Vec<u8>, Vec<OwnedFd>)> {
        let request_id = self.next_request;
        self.next_request += 1;
        self.stream
            .write_all(&local_message(opcode, 0, request_id, body))?;
        let mut header_bytes = [0u8; LOCAL_HEADER_BYTES];
        let fds = receive_with_fds(&self.stream, &mut header_bytes)?;
        let header = LocalHeader::decode(&header_bytes)?;
        let mut answer = vec![0u8; header.body_len as usize];
        self.stream.read_exact(&mut answer)?;
        if header.request_id != request_id {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "an answer to another request",
            )));
        }
        if header.status != Status::Ok as u8 {
            return Err(ClientError::Status {
                status: header.status,
                message: String::from_utf8_lossy(&answer).into_owned(),
            });
        }
        Ok((header, answer, fds))
    }
}

/// Fill `buffer` from the socket with recvmsg, keeping the file descriptors passed with the
/// bytes (at most 4).
fn receive_with_fds(stream: &UnixStream, buffer: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut received = 0;
    let mut fds = Vec::new();
    while received < buffer.len() {
        let mut control = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [io::IoSliceMut::new(&mut buffer[received..])];
        let message = match socket::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut control),
            socket::MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => message,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(error.into()),
        };
        if message.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        received += message.bytes;
        for control in message.cmsgs()? {
            if let socket::ControlMessageOwned::ScmRights(passed) = control {
                for passed in passed {
                    // SAFETY: the kernel installed this descriptor in our table for us alone.
                    fds.push(unsafe { OwnedFd::from_raw_fd(passed) });
                }
            }
        }
    }
    Ok(fds)
}

/// `slots` reads in flight into one region of `slots` slots on one connection, through the
/// server's same-host read rings (one per shard, each key on its owner's), so that the next
/// objects are read while the caller works on the previous one; completions are taken in the
/// order the reads were submitted:
///
/// ```no_run
/// # fn main() -> hydrant_client::Result<()> {
/// # let keys = vec!["a".to_string(), "b".to_string()];
/// use hydrant_client::local::ReadRing;
/// let mut ring = ReadRing::new("/run/hydrant.sock", 2, 64 << 20)?;
/// let mut pending = keys.iter();
/// for key in pending.by_ref().take(ring.slots()) {
///     ring.submit("bucket", key, None)?;
/// }
/// while let Some(done) = ring.complete() {
///     let _bytes: &[u8] = done?.data; // the other slots are being filled meanwhile
///     if let Some(key) = pending.next() {
///         ring.submit("bucket", key, None)?;
///     }
/// }
/// # Ok(()) }
/// ```
pub struct ReadRing {
    rings: Vec<LocalRing>,
    region: Region,
    /// The connection the rings and the region belong to (it closes when the ring is dropped).
    _client: LocalClient,
    /// Slot `i` starts at `i * stride` in the region: `slot_bytes` rounded up to whole 4 KiB
    /// blocks, so that reads land by the device's DMA.
    stride: u64,
    busy: Vec<bool>,
    /// Results that came before the caller asked for them, by slot.
    results: Vec<Option<Result<ReadInfo>>>,
    /// Slots in submission order that have a read in flight or a result not yet taken.
    order: std::collections::VecDeque<usize>,
    done: Vec<RingDone>,
}

/// A read the ring completed: its bytes stay valid until this is dropped (the slot is not
/// reused before).
pub struct Completed<'a> {
    pub info: ReadInfo,
    pub data: &'a [u8],
    /// The slot the bytes are in (see `ReadRing::slot_memory`).
    pub slot: usize,
}

impl ReadRing {
    /// At most 1,024 slots, and 16 GiB of them in all.
    pub fn new(path: impl AsRef<Path>, slots: usize, slot_bytes: u64) -> Result<ReadRing> {
        use hydrant_proto::local_ring::LOCAL_RING_ENTRIES_MAX;
        if slots == 0 || slots > LOCAL_RING_ENTRIES_MAX as usize {
            return Err(ClientError::Usage(format!(
                "a ring has 1 to {LOCAL_RING_ENTRIES_MAX} slots, not {slots}"
            )));
        }
        let stride = slot_bytes.div_ceil(4096).max(1) * 4096;
        let mut client = LocalClient::connect(path)?;
        let region = client.allocate(stride * slots as u64)?;
        let entries = (slots as u32).next_power_of_two();
        let first = client.open_ring(&region, entries, Some(0))?;
        let mut rings = vec![first];
        for shard in 1..rings[0].shards() {
            rings.push(client.open_ring(&region, entries, Some(shard))?);
        }
        Ok(ReadRing {
            rings,
            region,
            _client: client,
            stride,
            busy: vec![false; slots],
            results: (0..slots).map(|_| None).collect(),
            order: Default::default(),
            done: Vec::with_capacity(slots),
        })
    }

    pub fn slots(&self) -> usize {
        self.busy.len()
    }

    /// Where slot `index` is mapped, and its length (`slot_bytes` rounded up to 4 KiB): for handing its bytes to code that cannot
    /// hold a borrow of the ring (the Python package's views). The mapping lives as long as the
    /// ring; a slot's bytes change when a read is submitted into it.
    pub fn slot_memory(&self, index: usize) -> Option<(*const u8, usize)> {
        (index < self.slots()).then(|| {
            // SAFETY: inside the region: index < slots and the region is slots * stride long.
            let address = unsafe {
                self.region
                    .as_slice()
                    .as_ptr()
                    .add(index * self.stride as usize)
            };
            (address, self.stride as usize)
        })
    }

    /// Start a read into the next free slot; an error when every slot is taken.
    pub fn submit(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<()> {
        let Some(index) = self.busy.iter().position(|busy| !busy) else {
            return Err(ClientError::Usage(
                "every slot of the ring is in use: take a completion first".into(),
            ));
        };
        let get = LocalGet {
            offset: index as u64 * self.stride,
            // The whole stride: room for a read from NVMe rounded up to whole blocks, so that
            // it lands by the device's DMA.
            length: self.stride,
            bucket: bucket.to_string(),
            key: key.to_string(),
            range,
        };
        let last = self.rings.len() - 1;
        let shard = (self.rings[0].shard_for(bucket, key) as usize).min(last);
        let ring = &mut self.rings[shard];
        ring.push(&get, index as u64)?;
        ring.submit();
        self.busy[index] = true;
        self.order.push_back(index);
        Ok(())
    }

    /// The oldest submitted read, once complete; `None` when nothing is in flight.
    pub fn complete(&mut self) -> Option<Result<Completed<'_>>> {
        let index = *self.order.front()?;
        while self.results[index].is_none() {
            self.done.clear();
            if let Err(error) = wait_rings(
                &mut self.rings,
                1,
                &mut self.done,
                Some(LOCAL_REQUEST_TIMEOUT),
            ) {
                return Some(Err(error));
            }
            if self.done.is_empty() {
                // Nothing in flight any more, yet no answer for this slot (a completion the
                // client could not decode): waiting would never end.
                return Some(Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the server never answered a read of this ring",
                ))));
            }
            for done in self.done.drain(..) {
                if let Some(result) = self.results.get_mut(done.user_data as usize) {
                    *result = Some(done.result);
                }
            }
        }
        self.order.pop_front();
        self.busy[index] = false;
        let result = self.results[index].take().expect("checked above");
        let start = index * self.stride as usize;
        Some(result.map(|info| Completed {
            info,
            data: &self.region.as_slice()[start..start + info.written as usize],
            slot: index,
        }))
    }
}
