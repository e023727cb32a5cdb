//! The same-host path (`--local-socket PATH`): a Unix domain socket for clients on this machine.
//!
//! A client asks for a region (ALLOCATE); the server creates a sealed memfd, maps it, and passes
//! the fd with SCM_RIGHTS. A READ names places in that region; the owning shard reads the
//! object from NVMe straight into the mapping (the device's DMA; no CPU copy) when the place is
//! aligned, or copies it once (from its pinned buffers, the DRAM tier or the origin's answer),
//! and only a small completion crosses the socket. Messages are in `hydrant_proto::local` and
//! docs/protocol.md.
//!
//! Each connection is served by a thread of its own (at most `LOCAL_CONNECTIONS_MAX`), one
//! request at a time; a READ's items run concurrently on their shards. RING_OPEN gives the
//! client a read ring in shared memory served straight by a shard (`ring`): many reads in
//! flight, none of them through this thread. The thread blocks only
//! on its socket and on the shards' answers. Peers are checked with SO_PEERCRED: only the
//! server's own uid, or root. There is no token on this path: the socket file is made 0600 and
//! the kernel tells who is connecting.

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hydrant_engine::buf::ExternalBuf;
use hydrant_engine::rt::sync::Semaphore;
use hydrant_engine::rt::{block_on, spawn};
use hydrant_engine::store::ObjectKey;
use hydrant_engine::{Attributes, ByteRange, Cache, EngineHandle, Precondition};
use hydrant_proto::local::{
    local_message, LocalCondition, LocalHeader, LocalItemResult, LocalOpcode, LocalRead,
    LocalReadAnswer, LocalRegionInfo, LocalWrite, LocalWriteAnswer, LocalWriteMemory,
    LOCAL_HEADER_BYTES, LOCAL_RANGE_TO_END, LOCAL_REGIONS_PER_CONNECTION_MAX,
    LOCAL_REGION_BYTES_MAX, LOCAL_REGION_FLAG_HUGE_PAGES,
};
use hydrant_proto::local_ring::{
    RingInfo, RingOpen, LOCAL_RINGS_PER_CONNECTION_MAX, LOCAL_RING_ANY_SHARD,
    LOCAL_RING_ENTRIES_MAX,
};
use hydrant_proto::Status;
use nix::sys::socket::{self, Shutdown};

use crate::connection::requests::engine_failure;

mod process_memory;
mod region;
mod ring;
use crate::metrics::{
    self, LOCAL_CONNECTIONS, LOCAL_REGIONS, LOCAL_REGIONS_REGISTERED, LOCAL_REGION_BYTES,
};
use process_memory::{ProcessMemory, Writer};
use region::{
    give_back_slot, register_region, reserve_shared_bytes, shared_bytes_refusal, unregister_on,
    Region, REGISTERED_BYTES,
};

/// Same-host connections served at once; more are closed on arrival.
const LOCAL_CONNECTIONS_MAX: u64 = 256;
/// All regions of all same-host clients together.
const LOCAL_REGION_BYTES_TOTAL_MAX: u64 = 64 << 30;
/// Items of one READ read at once on their shards.
const LOCAL_READS_IN_FLIGHT_MAX: usize = 32;
/// Bytes of regions registered with the rings at once: registration pins (and so allocates)
/// every page of a region up front, so regions beyond this are read with plain READs.
const LOCAL_REGISTERED_BYTES_MAX: u64 = 8 << 30;
/// Huge page size tried for regions that are a multiple of it.
const HUGE_PAGE_BYTES: u64 = 2 << 20;

/// The listening side; `stop` closes it and every connection.
pub(crate) struct LocalEndpoint {
    path: PathBuf,
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<HashMap<u64, RawFd>>>,
    thread: std::thread::JoinHandle<()>,
}

pub(crate) fn start(path: &Path, engine: EngineHandle) -> Result<LocalEndpoint, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    // A socket file left by a server that died is in the way; anything else is not ours.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "--local-socket {}: exists and is not a socket",
                path.display()
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path)
        .map_err(|error| format!("cannot listen on {}: {error}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|error| format!("cannot restrict {}: {error}", path.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let connections = Arc::new(Mutex::new(HashMap::new()));
    let accepting = listener
        .try_clone()
        .map_err(|error| format!("{}: {error}", path.display()))?;
    let thread_stop = stop.clone();
    let thread_connections = connections.clone();
    let thread = std::thread::Builder::new()
        .name("hydrant-local".into())
        .spawn(move || accept_loop(accepting, engine, thread_stop, thread_connections))
        .map_err(|error| error.to_string())?;
    Ok(LocalEndpoint {
        path: path.to_path_buf(),
        listener,
        stop,
        connections,
        thread,
    })
}

impl LocalEndpoint {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // The fds are the listener's (this endpoint's) and those of connection threads that
        // remove their fd from the table, under its lock, before closing it.
        let _ = socket::shutdown(self.listener.as_raw_fd(), Shutdown::Both);
        for fd in self.connections.lock().expect("not poisoned").values() {
            let _ = socket::shutdown(*fd, Shutdown::Both);
        }
        let _ = self.thread.join();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(
    listener: UnixListener,
    engine: EngineHandle,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<HashMap<u64, RawFd>>>,
) {
    let mut next_id = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) if stop.load(Ordering::SeqCst) => return,
            Err(error) => {
                log::warn!("local socket: accept failed: {error}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let Some((pid, uid)) = peer_credentials(&stream) else {
            log::warn!("local socket: refused a peer whose credentials are unknown");
            continue;
        };
        let own_uid = nix::unistd::geteuid().as_raw();
        if uid != own_uid && uid != 0 {
            log::warn!(
                "local socket: refused pid {pid} of uid {uid} (serving uid {own_uid} and root)"
            );
            continue;
        }
        if LOCAL_CONNECTIONS.load(Ordering::SeqCst) >= LOCAL_CONNECTIONS_MAX {
            log::warn!("local socket: refused pid {pid}: {LOCAL_CONNECTIONS_MAX} connections open");
            continue;
        }
        log::info!("local socket: client pid {pid} uid {uid}");
        next_id += 1;
        let id = next_id;
        connections
            .lock()
            .expect("not poisoned")
            .insert(id, stream.as_raw_fd());
        LOCAL_CONNECTIONS.fetch_add(1, Ordering::SeqCst);
        let engine = engine.clone();
        let table = connections.clone();
        let spawned = std::thread::Builder::new()
            .name("hydrant-local-conn".into())
            .spawn(move || {
                let mut connection = LocalConnection {
                    engine,
                    regions: HashMap::new(),
                    next_region: 0,
                    rings: HashMap::new(),
                    next_ring: 0,
                    writer: Writer::open(&stream).map_err(|error| error.to_string()),
                };
                if let Err(error) = connection.serve(&stream) {
                    log::debug!("local connection of pid {pid} closed: {error}");
                }
                table.lock().expect("not poisoned").remove(&id);
                drop(stream);
                connection.release_all(); // and unmaps them once no read holds them
                drop(connection);
                LOCAL_CONNECTIONS.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            connections.lock().expect("not poisoned").remove(&id);
            LOCAL_CONNECTIONS.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn precondition_of(condition: LocalCondition) -> Precondition {
    match condition {
        LocalCondition::None => Precondition::Any,
        LocalCondition::Absent => Precondition::Absent,
        LocalCondition::Version(seq) => Precondition::Version(seq),
    }
}

/// The peer's pid and uid, from the kernel (SO_PEERCRED).
fn peer_credentials(stream: &UnixStream) -> Option<(i32, u32)> {
    let credentials = socket::getsockopt(stream, socket::sockopt::PeerCredentials).ok()?;
    Some((credentials.pid(), credentials.uid()))
}

struct LocalConnection {
    engine: EngineHandle,
    regions: HashMap<u32, Arc<Region>>,
    next_region: u32,
    /// Read rings, each bound to a region of this connection.
    rings: HashMap<u32, ring::RingHandle>,
    next_ring: u32,
    /// The client's process, for WRITE_MEMORY (or why it could not be held).
    writer: Result<Writer, String>,
}

impl LocalConnection {
    fn release_all(&mut self) {
        for (_, ring) in std::mem::take(&mut self.rings) {
            ring.close();
        }
        for (_, region) in std::mem::take(&mut self.regions) {
            self.release(region);
        }
    }

    fn serve(&mut self, stream: &UnixStream) -> io::Result<()> {
        let mut reader = stream;
        loop {
            let mut header_bytes = [0u8; LOCAL_HEADER_BYTES];
            match reader.read_exact(&mut header_bytes) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(error) => return Err(error),
            }
            let header = LocalHeader::decode(&header_bytes)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))?;
            let mut body = vec![0u8; header.body_len as usize];
            reader.read_exact(&mut body)?;
            let opcode = match LocalOpcode::from_u8(header.opcode) {
                Ok(opcode) => opcode,
                Err(error) => {
                    // Answer as FREE, the opcode that carries nothing.
                    let message = local_message(
                        LocalOpcode::Free,
                        Status::Unsupported as u8,
                        header.request_id,
                        error.to_string().as_bytes(),
                    );
                    (&*stream).write_all(&message)?;
                    continue;
                }
            };
            match opcode {
                LocalOpcode::Allocate => self.allocate(stream, header.request_id, &body)?,
                LocalOpcode::Read => {
                    let (status, answer) = match LocalRead::decode(&body) {
                        Ok(request) => (Status::Ok, self.read(request).encode()),
                        Err(error) => (Status::for_error(&error), error.to_string().into_bytes()),
                    };
                    let message = local_message(opcode, status as u8, header.request_id, &answer);
                    (&*stream).write_all(&message)?;
                }
                LocalOpcode::Write => {
                    let (status, answer) = match LocalWrite::decode(&body) {
                        Ok(request) => match self.write(stream, request) {
                            Ok(written) => (Status::Ok, written.encode()),
                            Err((status, message)) => (status, message.into_bytes()),
                        },
                        Err(error) => (Status::for_error(&error), error.to_string().into_bytes()),
                    };
                    let message = local_message(opcode, status as u8, header.request_id, &answer);
                    (&*stream).write_all(&message)?;
                }
                LocalOpcode::WriteMemory => {
                    let (status, answer) = match LocalWriteMemory::decode(&body) {
                        Ok(request) => match self.write_memory(stream, request) {
                            Ok(written) => (Status::Ok, written.encode()),
                            Err((status, message)) => (status, message.into_bytes()),
                        },
                        Err(error) => (Status::for_error(&error), error.to_string().into_bytes()),
                    };
                    let message = local_message(opcode, status as u8, header.request_id, &answer);
                    (&*stream).write_all(&message)?;
                }
                LocalOpcode::RingOpen => self.open_ring(stream, header.request_id, &body)?,
                LocalOpcode::Free => {
                    let (status, answer) = self.free(&body);
                    let message =
                        local_message(opcode, status as u8, header.request_id, answer.as_bytes());
                    (&*stream).write_all(&message)?;
                }
            }
        }
    }

    fn allocate(&mut self, stream: &UnixStream, request_id: u64, body: &[u8]) -> io::Result<()> {
        let refuse = |status: Status, message: String| {
            answer_error(stream, LocalOpcode::Allocate, request_id, status, &message)
        };
        let Ok(bytes) = body.try_into().map(u64::from_le_bytes) else {
            return refuse(Status::BadRequest, "ALLOCATE carries a u64".into());
        };
        let held: u64 = self.regions.values().map(|region| region.bytes).sum();
        if bytes == 0 || held + bytes > LOCAL_REGION_BYTES_MAX {
            return refuse(
                Status::TooLarge,
                format!("a connection holds 1 to {LOCAL_REGION_BYTES_MAX} bytes of regions; {held} held, {bytes} asked"),
            );
        }
        if self.regions.len() as u32 >= LOCAL_REGIONS_PER_CONNECTION_MAX {
            return refuse(
                Status::TooLarge,
                format!("a connection holds at most {LOCAL_REGIONS_PER_CONNECTION_MAX} regions"),
            );
        }
        if !reserve_shared_bytes(bytes) {
            return refuse(Status::Busy, shared_bytes_refusal());
        }
        LOCAL_REGIONS.fetch_add(1, Ordering::SeqCst);
        let mut region = match Region::create(bytes) {
            Ok(region) => region,
            Err(error) => {
                LOCAL_REGIONS.fetch_sub(1, Ordering::SeqCst);
                LOCAL_REGION_BYTES.fetch_sub(bytes, Ordering::SeqCst);
                return refuse(Status::Internal, format!("cannot create a region: {error}"));
            }
        };
        region.slot = register_region(&self.engine, region.address(), bytes);
        if region.slot.is_some() {
            LOCAL_REGIONS_REGISTERED.fetch_add(1, Ordering::SeqCst);
        }
        self.next_region += 1;
        let info = LocalRegionInfo {
            region: self.next_region,
            flags: if region.huge_pages {
                LOCAL_REGION_FLAG_HUGE_PAGES
            } else {
                0
            },
            bytes,
        };
        let memfd = region.memfd.as_raw_fd();
        self.regions.insert(info.region, Arc::new(region));
        let message = local_message(
            LocalOpcode::Allocate,
            Status::Ok as u8,
            request_id,
            &info.encode(),
        );
        send_with_fds(stream, &message, &[memfd])
    }

    /// RING_OPEN: a read ring over one of this connection's regions, served by a shard.
    fn open_ring(&mut self, stream: &UnixStream, request_id: u64, body: &[u8]) -> io::Result<()> {
        let refuse = |status: Status, message: String| {
            answer_error(stream, LocalOpcode::RingOpen, request_id, status, &message)
        };
        let open = match RingOpen::decode(body) {
            Ok(open) => open,
            Err(error) => return refuse(Status::for_error(&error), error.to_string()),
        };
        let Some(region) = self.regions.get(&open.region) else {
            return refuse(
                Status::NotFound,
                format!("no region {} on this connection", open.region),
            );
        };
        if !open.entries.is_power_of_two() || open.entries > LOCAL_RING_ENTRIES_MAX {
            return refuse(
                Status::BadRequest,
                format!(
                    "a ring has a power of two of entries, at most {LOCAL_RING_ENTRIES_MAX}; {} asked",
                    open.entries
                ),
            );
        }
        if self.rings.len() as u32 >= LOCAL_RINGS_PER_CONNECTION_MAX {
            return refuse(
                Status::TooLarge,
                format!("a connection holds at most {LOCAL_RINGS_PER_CONNECTION_MAX} rings"),
            );
        }
        let shards = self.engine.shard_count() as u32;
        let shard = match open.shard {
            LOCAL_RING_ANY_SHARD => self.next_ring % shards,
            shard if shard < shards => shard,
            shard => {
                return refuse(
                    Status::BadRequest,
                    format!("shard {shard} of a server of {shards}"),
                )
            }
        };
        // The ring file counts with the regions against the bound of all clients' memory.
        let bytes = ring::RingShared::bytes_for(open.entries);
        if !reserve_shared_bytes(bytes) {
            return refuse(Status::Busy, shared_bytes_refusal());
        }
        let shared = match ring::RingShared::create(open.entries) {
            Ok(shared) => Arc::new(shared), // gives the bytes back when dropped
            Err(error) => {
                LOCAL_REGION_BYTES.fetch_sub(bytes, Ordering::SeqCst);
                return refuse(Status::Internal, format!("cannot create a ring: {error}"));
            }
        };
        let handle = match ring::start(
            &self.engine,
            shard as usize,
            shared.clone(),
            open.region,
            Self::external(region),
        ) {
            Ok(handle) => handle,
            Err(error) => {
                let (status, message) = engine_failure(error);
                return refuse(status, message);
            }
        };
        self.next_ring = self.next_ring.wrapping_add(1).max(1);
        let info = RingInfo {
            ring: self.next_ring,
            entries: open.entries,
            shard,
            shards,
            placement_hash: hydrant_engine::format::PLACEMENT_CRC32C,
        };
        self.rings.insert(info.ring, handle);
        let message = local_message(
            LocalOpcode::RingOpen,
            Status::Ok as u8,
            request_id,
            &info.encode(),
        );
        send_with_fds(stream, &message, &shared.client_fds())
    }

    fn free(&mut self, body: &[u8]) -> (Status, String) {
        let Ok(region) = body.try_into().map(u32::from_le_bytes) else {
            return (Status::BadRequest, "FREE carries a u32".into());
        };
        match self.regions.remove(&region) {
            Some(freed) => {
                // Its rings first: they stop, and their reads end, before the region goes.
                let rings: Vec<u32> = self
                    .rings
                    .iter()
                    .filter(|(_, ring)| ring.region == region)
                    .map(|(&id, _)| id)
                    .collect();
                for id in rings {
                    self.rings.remove(&id).expect("listed above").close();
                }
                self.release(freed);
                (Status::Ok, String::new())
            }
            None => (Status::NotFound, format!("no region {region}")),
        }
    }

    /// Let go of a region: its slot is emptied on every ring first (no read of this connection
    /// is in flight: the connection serves one request at a time), then the mapping goes with
    /// the last holder.
    fn release(&self, region: Arc<Region>) {
        if let Some(slot) = region.slot {
            if unregister_on(&self.engine, slot, (0..self.engine.shard_count()).collect()) {
                give_back_slot(slot);
            }
            REGISTERED_BYTES.fetch_sub(region.bytes, Ordering::SeqCst);
            LOCAL_REGIONS_REGISTERED.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The whole of `region`, as memory the engine may read or write.
    fn external(region: &Arc<Region>) -> ExternalBuf {
        // SAFETY: the region's mapping is `region.bytes` long and lives as long as the Arc (the
        // owner); the server holds no reference into it.
        let whole = unsafe {
            ExternalBuf::new(
                region.clone() as Arc<dyn std::any::Any + Send + Sync>,
                region.address(),
                region.bytes as usize,
            )
        };
        match region.slot {
            // SAFETY: the region is registered at `slot` on every ring until `release`, which
            // runs only after this connection's request in flight has ended and its rings over
            // the region have closed (each waits for its reads).
            Some(slot) => unsafe { whole.with_fixed_slot(slot) },
            None => whole,
        }
    }

    /// A WRITE: the owning shard takes the bytes from the region (see
    /// `EngineHandle::put_shared`); answered once the put is durable as its bucket's write mode
    /// requires.
    fn write(
        &self,
        stream: &UnixStream,
        request: LocalWrite,
    ) -> Result<LocalWriteAnswer, (Status, String)> {
        let region = self.regions.get(&request.region).ok_or_else(|| {
            (
                Status::NotFound,
                format!("no region {} on this connection", request.region),
            )
        })?;
        let fits = request
            .offset
            .checked_add(request.length)
            .is_some_and(|end| end <= region.bytes);
        if !fits {
            return Err((
                Status::InvalidRange,
                format!(
                    "offset {} + length {} is outside the region of {} bytes",
                    request.offset, request.length, region.bytes
                ),
            ));
        }
        let key = ObjectKey::new(&request.bucket, &request.key).map_err(engine_failure)?;
        let source = Self::external(region)
            .slice(request.offset as usize, request.length as usize)
            .expect("checked to fit above");
        // The region stays mapped until the put ends: this thread owns it and waits here,
        // watching the socket meanwhile (a client that goes away abandons its put).
        let abandoned = Arc::new(AtomicBool::new(false));
        let put = self.engine.put_shared(
            key,
            source,
            abandoned.clone(),
            request.length,
            precondition_of(request.condition),
            &Attributes::default(),
        );
        let meta = block_on_watching(put, stream, &abandoned).map_err(engine_failure)?;
        Ok(LocalWriteAnswer {
            seq: meta.seq,
            bytes: meta.bytes,
            dirty: meta.dirty,
        })
    }

    /// A WRITE_MEMORY: this thread reads the bytes from the client's own memory and streams
    /// them to the owning shard (see `process_memory`); answered as a WRITE is.
    fn write_memory(
        &self,
        stream: &UnixStream,
        request: LocalWriteMemory,
    ) -> Result<LocalWriteAnswer, (Status, String)> {
        let writer = self.writer.as_ref().map_err(|why| {
            (
                Status::Unsupported,
                format!(
                    "this server cannot hold the writer's process ({why}): write from a region"
                ),
            )
        })?;
        let key = ObjectKey::new(&request.bucket, &request.key).map_err(engine_failure)?;
        let source = ProcessMemory::new(writer, &request.parts)
            .map_err(|why| (Status::InvalidRange, why))?;
        if let Some(address) = source.first_address() {
            // Whether this server may read the writer at all, before anything is placed.
            match writer.probe(address) {
                Ok(()) => {}
                Err(nix::errno::Errno::EFAULT) => {
                    return Err((
                        Status::InvalidRange,
                        format!("address {address:#x} is not mapped in the writer's process"),
                    ))
                }
                Err(errno) => {
                    return Err((
                        Status::Unsupported,
                        format!(
                            "this server may not read the writer's memory ({errno}; the kernel's \
                             ptrace rules decide): write from a region"
                        ),
                    ))
                }
            }
        }
        process_memory::store(
            &self.engine,
            stream,
            key,
            source,
            precondition_of(request.condition),
        )
    }

    /// Every item of a READ, concurrently on the shards that own them; per-item results.
    fn read(&self, request: LocalRead) -> LocalReadAnswer {
        let mut results: Vec<Option<LocalItemResult>> = vec![None; request.items.len()];
        let Some(region) = self.regions.get(&request.region) else {
            let message = format!("no region {} on this connection", request.region);
            return LocalReadAnswer {
                items: results
                    .iter()
                    .map(|_| failed(Status::NotFound, message.clone()))
                    .collect(),
            };
        };
        // Items whose places overlap an earlier item's are refused: two shards must never write
        // the same bytes at once.
        let mut places: Vec<(u64, u64, usize)> = request
            .items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| {
                let end = item.offset.checked_add(item.length)?;
                (item.length > 0).then_some((item.offset, end, index))
            })
            .collect();
        places.sort_unstable();
        let mut overlapping = std::collections::HashSet::new();
        let mut reached = 0u64;
        for &(offset, end, index) in &places {
            if offset < reached {
                overlapping.insert(index);
            }
            reached = reached.max(end);
        }
        let mut per_shard: HashMap<usize, Vec<ShardItem>> = HashMap::new();
        for (index, item) in request.items.into_iter().enumerate() {
            if overlapping.contains(&index) {
                results[index] = Some(failed(
                    Status::InvalidRange,
                    format!(
                        "offset {} + length {} overlaps another item of this read",
                        item.offset, item.length
                    ),
                ));
                continue;
            }
            let fits = item
                .offset
                .checked_add(item.length)
                .is_some_and(|end| end <= region.bytes);
            if !fits {
                results[index] = Some(failed(
                    Status::InvalidRange,
                    format!(
                        "offset {} + length {} is outside the region of {} bytes",
                        item.offset, item.length, region.bytes
                    ),
                ));
                continue;
            }
            let key = match ObjectKey::new(&item.bucket, &item.key) {
                Ok(key) => key,
                Err(error) => {
                    let (status, message) = engine_failure(error);
                    results[index] = Some(failed(status, message));
                    continue;
                }
            };
            let range = ByteRange {
                start: item.range_start,
                end: (item.range_end != LOCAL_RANGE_TO_END).then_some(item.range_end),
            };
            let destination = Self::external(region)
                .slice(item.offset as usize, item.length as usize)
                .expect("checked to fit above");
            per_shard
                .entry(self.engine.shard_of(&key))
                .or_default()
                .push(ShardItem {
                    index,
                    key,
                    range,
                    destination,
                });
        }
        // The region stays mapped until these complete: this thread owns it and waits here.
        let calls: Vec<Pin<Box<dyn Future<Output = ShardOutcome> + Send>>> = per_shard
            .into_iter()
            .map(|(shard, items)| {
                let indexes: Vec<usize> = items.iter().map(|item| item.index).collect();
                let call = self
                    .engine
                    .on_shard(shard, move |cache| read_on_shard(cache, items));
                Box::pin(async move { (indexes, call.await) })
                    as Pin<Box<dyn Future<Output = ShardOutcome> + Send>>
            })
            .collect();
        for (indexes, outcome) in block_on(JoinAll::new(calls)) {
            match outcome {
                Ok(done) => {
                    for (index, result) in done {
                        results[index] = Some(result);
                    }
                }
                Err(error) => {
                    let (status, message) = engine_failure(error);
                    for index in indexes {
                        results[index] = Some(failed(status, message.clone()));
                    }
                }
            }
        }
        LocalReadAnswer {
            items: results
                .into_iter()
                .map(|result| result.expect("every item has a result"))
                .collect(),
        }
    }
}

/// How often a connection waiting for a WRITE looks whether its client is still there.
const PEER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// `block_on` for a WRITE: drive `future` to completion on this thread and, every
/// `PEER_CHECK_INTERVAL` meanwhile, set `abandoned` once the client has closed its end of
/// `stream` (it sends nothing while it waits for the answer, so a read that finds the end of
/// the stream means it is gone).
fn block_on_watching<F: Future>(
    future: F,
    stream: &UnixStream,
    abandoned: &AtomicBool,
) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        // What this thread held back (rt::batched) must not wait for it to wake.
        hydrant_engine::rt::batched::wake_batched();
        std::thread::park_timeout(PEER_CHECK_INTERVAL);
        if !abandoned.load(Ordering::Acquire) {
            let mut byte = [0u8; 1];
            let peeked = socket::recv(
                stream.as_raw_fd(),
                &mut byte,
                socket::MsgFlags::MSG_PEEK | socket::MsgFlags::MSG_DONTWAIT,
            );
            if matches!(peeked, Ok(0)) {
                abandoned.store(true, Ordering::Release);
            }
        }
    }
}

/// The items a shard was given, and what it did with them.
type ShardOutcome = (
    Vec<usize>,
    hydrant_engine::Result<Vec<(usize, LocalItemResult)>>,
);

struct ShardItem {
    index: usize,
    key: ObjectKey,
    range: ByteRange,
    destination: ExternalBuf,
}

fn failed(status: Status, message: String) -> LocalItemResult {
    LocalItemResult {
        status: status as u8,
        object_bytes: 0,
        range_start: 0,
        written: 0,
        message,
    }
}

/// The items of one shard, at most `LOCAL_READS_IN_FLIGHT_MAX` at once.
async fn read_on_shard(
    cache: Rc<Cache>,
    items: Vec<ShardItem>,
) -> hydrant_engine::Result<Vec<(usize, LocalItemResult)>> {
    let reading = Rc::new(Semaphore::new(LOCAL_READS_IN_FLIGHT_MAX));
    let tasks: Vec<_> = items
        .into_iter()
        .map(|item| {
            let cache = cache.clone();
            let reading = reading.clone();
            spawn(async move {
                let _permit = reading.acquire_owned().await;
                (item.index, read_item(&cache, &item).await)
            })
        })
        .collect();
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await);
    }
    Ok(done)
}

/// Read one object into its destination: straight from the device when it is on NVMe (no CPU
/// copy), or copied once from the DRAM tier or the origin's answer. Nothing is written when it
/// does not fit.
async fn read_item(cache: &Cache, item: &ShardItem) -> LocalItemResult {
    let placed = match cache
        .get_into(&item.key, Some(item.range), &item.destination)
        .await
    {
        Ok(Some(placed)) => placed,
        Ok(None) => {
            return failed(
                Status::NotFound,
                format!("{}/{} is not stored", item.key.bucket(), item.key.key()),
            )
        }
        Err(error) => {
            let (status, message) = engine_failure(error);
            return failed(status, message);
        }
    };
    if !placed.written {
        let mut result = failed(
            Status::TooLarge,
            format!(
                "{} bytes do not fit in the {} bytes given",
                placed.len,
                item.destination.len()
            ),
        );
        result.object_bytes = placed.bytes;
        result.range_start = placed.start;
        return result;
    }
    metrics::count_copies(metrics::PATH_LOCAL, placed.copied_bytes, placed.len);
    LocalItemResult {
        status: Status::Ok as u8,
        object_bytes: placed.bytes,
        range_start: placed.start,
        written: placed.len,
        message: String::new(),
    }
}

/// Answer request `request_id` with `status` and a one-line reason.
fn answer_error(
    stream: &UnixStream,
    opcode: LocalOpcode,
    request_id: u64,
    status: Status,
    message: &str,
) -> io::Result<()> {
    let answer = local_message(opcode, status as u8, request_id, message.as_bytes());
    (&*stream).write_all(&answer)
}

/// Send `message` with `fds` attached (SCM_RIGHTS) to its first byte.
fn send_with_fds(stream: &UnixStream, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let sent = socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &[io::IoSlice::new(message)],
        &[socket::ControlMessage::ScmRights(fds)],
        socket::MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    (&*stream).write_all(&message[sent..])
}

/// Waits for every future and returns their outputs in order (so that the reads of several
/// shards proceed together).
struct JoinAll<T> {
    futures: Vec<Option<Pin<Box<dyn Future<Output = T> + Send>>>>,
    outputs: Vec<Option<T>>,
}

impl<T> JoinAll<T> {
    fn new(futures: Vec<Pin<Box<dyn Future<Output = T> + Send>>>) -> JoinAll<T> {
        let outputs = futures.iter().map(|_| None).collect();
        JoinAll {
            futures: futures.into_iter().map(Some).collect(),
            outputs,
        }
    }
}

impl<T> Future for JoinAll<T> {
    type Output = Vec<T>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Vec<T>> {
        let this = self.get_mut();
        let mut pending = false;
        for (slot, output) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(
            this.outputs
                .iter_mut()
                .map(|output| output.take().expect("ready"))
                .collect(),
        )
    }
}

// The outputs are never pinned (only the boxed futures are, and a Box keeps them in place).
impl<T> Unpin for JoinAll<T> {}
