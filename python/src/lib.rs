//! `hydrant._hydrant`: the native client (`hydrant_client::SharedClient`) for Python. The
//! Python package (python/hydrant) wraps it: names, buffers, files and iterators are handled
//! there; this module makes the calls, with the GIL released for every wait.
//!
//! One `NativeClient` may be shared by threads (the client pools connections per node). A
//! client used in a process forked from the one that made it (a DataLoader worker) connects
//! anew instead of sharing its parent's sockets.

use std::sync::Mutex;
use std::time::Duration;

use hydrant_client::local::{LocalClient, LocalCondition, LocalGet, ReadRing, Region};
use hydrant_client::{ClientConfig, ClientError, GetItem, ObjectInfo, SharedClient};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// The client of this process, and the process it was made in.
struct Owned {
    pid: u32,
    client: SharedClient,
}

#[pyclass(frozen, module = "hydrant._hydrant")]
struct NativeClient {
    config: ClientConfig,
    owned: Mutex<Owned>,
}

/// (size, version, dirty) of an object, as Python's `ObjectInfo` takes them.
type Info = (u64, u64, bool);

fn info_of(info: &ObjectInfo) -> Info {
    (info.object_bytes, info.seq, info.dirty)
}

/// The Python exception for `error`: a class of `hydrant.errors` chosen by its kind (and, for a
/// status, by the status), made with the status and the message.
fn python_error(py: Python<'_>, error: ClientError) -> PyErr {
    let (class, status, message, extra) = match &error {
        ClientError::Status { status, message } => {
            ("status_error", Some(*status), message.clone(), None)
        }
        ClientError::Io(io) => ("ConnectionFailed", None, io.to_string(), None),
        ClientError::Protocol(_) => ("ProtocolError", None, error.to_string(), None),
        ClientError::Usage(message) => ("UsageError", None, message.clone(), None),
        ClientError::BufferTooSmall { needed, capacity } => (
            "BufferTooSmall",
            None,
            error.to_string(),
            Some((*needed, *capacity as u64)),
        ),
        ClientError::Local(io) => ("LocalError", None, io.to_string(), None),
    };
    let made = (|| -> PyResult<PyErr> {
        let errors = py.import("hydrant.errors")?;
        let exception =
            match (class, status, extra) {
                ("status_error", Some(status), _) => errors
                    .getattr("status_error")?
                    .call1((status, message.clone()))?,
                ("BufferTooSmall", _, Some((needed, capacity))) => errors
                    .getattr(class)?
                    .call1((message.clone(), needed, capacity))?,
                _ => errors.getattr(class)?.call1((message.clone(),))?,
            };
        Ok(PyErr::from_value(exception))
    })();
    made.unwrap_or_else(|failure| failure)
}

/// `start..end` (end exclusive, `None`: to the end) as the client takes a range.
fn range_of(start: Option<u64>, end: Option<u64>) -> Option<(u64, Option<u64>)> {
    match (start, end) {
        (None, None) => None,
        (start, end) => Some((start.unwrap_or(0), end)),
    }
}

impl NativeClient {
    /// The client to use in this process: the one made here, or (after a fork) a new one. Call
    /// with the GIL released, so that a thread holding the lock never waits for the GIL that a
    /// thread waiting for the lock holds.
    fn client_detached(&self) -> hydrant_client::Result<SharedClient> {
        let mut owned = self
            .owned
            .lock()
            .map_err(|_| ClientError::Usage("the client's lock is poisoned".into()))?;
        let pid = std::process::id();
        if owned.pid != pid {
            let fresh = SharedClient::connect(self.config.clone())?;
            // The parent's connections are the parent's: their sockets are left open here
            // (closing them could not disturb the parent, but shutting them down would).
            std::mem::forget(std::mem::replace(&mut owned.client, fresh));
            owned.pid = pid;
        }
        Ok(owned.client.clone())
    }

    /// Run `call` on this process's client with the GIL released (once per call: a small GET
    /// is dominated by the GIL's hand-offs).
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&SharedClient) -> hydrant_client::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| call(&self.client_detached()?))
            .map_err(|error| python_error(py, error))
    }
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (servers, token, connect_timeout, request_timeout, retries, backoff_initial, backoff_max, retry_deadline, max_connections_per_node, shard_aware))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        token: Option<Vec<u8>>,
        connect_timeout: f64,
        request_timeout: f64,
        retries: u32,
        backoff_initial: f64,
        backoff_max: f64,
        retry_deadline: f64,
        max_connections_per_node: usize,
        shard_aware: bool,
    ) -> PyResult<NativeClient> {
        let seconds = |value: f64, name: &str| {
            Duration::try_from_secs_f64(value).map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{name} must be a number of seconds >= 0, not {value}"
                ))
            })
        };
        let config = ClientConfig::new(&servers)
            .token(token.as_deref())
            .connect_timeout(seconds(connect_timeout, "connect_timeout")?)
            .request_timeout(seconds(request_timeout, "request_timeout")?)
            .retries_max(retries)
            .backoff(
                seconds(backoff_initial, "backoff")?,
                seconds(backoff_max, "backoff")?,
            )
            .retry_deadline(seconds(retry_deadline, "retry_deadline")?)
            .max_connections_per_node(max_connections_per_node)
            .shard_aware(shard_aware);
        let connecting = config.clone();
        let client = py
            .detach(|| SharedClient::connect(connecting))
            .map_err(|error| python_error(py, error))?;
        Ok(NativeClient {
            config,
            owned: Mutex::new(Owned {
                pid: std::process::id(),
                client,
            }),
        })
    }

    /// The servers, as given.
    fn servers(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.run(py, |client| Ok(client.servers().to_vec()))
    }

    #[pyo3(signature = (bucket, key, start=None, end=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        bucket: &str,
        key: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<(Info, Bound<'py, PyBytes>)> {
        let (info, data) = self.run(py, |client| client.get(bucket, key, range_of(start, end)))?;
        Ok((info_of(&info), PyBytes::new(py, &data)))
    }

    /// Read into `length` bytes of memory at `address`, which the caller keeps alive and
    /// writable for the call (the Python layer takes them from a buffer it holds).
    #[pyo3(signature = (bucket, key, address, length, start=None, end=None))]
    #[allow(clippy::too_many_arguments)]
    fn get_into_address(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        address: usize,
        length: usize,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<(Info, usize)> {
        if address == 0 && length > 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("a null buffer"));
        }
        let (info, read) = self.run(py, move |client| {
            // SAFETY: the caller (hydrant.Client.get_into) holds an export of a writable,
            // contiguous buffer of `length` bytes at `address` for the whole call, so the
            // memory stays valid and nothing else resizes it; the GIL is released, and Python
            // code that writes the same buffer meanwhile races as it would with any reader.
            let buffer: &mut [u8] = if length == 0 {
                &mut []
            } else {
                unsafe { std::slice::from_raw_parts_mut(address as *mut u8, length) }
            };
            client.get_into(bucket, key, range_of(start, end), buffer)
        })?;
        Ok((info_of(&info), read))
    }

    fn put(&self, py: Python<'_>, bucket: &str, key: &str, data: &[u8]) -> PyResult<Info> {
        let info = self.run(py, |client| client.put(bucket, key, data))?;
        Ok(info_of(&info))
    }

    /// Store `length` bytes at `address` (kept alive by the caller, as `get_into_address`).
    fn put_address(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        address: usize,
        length: usize,
    ) -> PyResult<Info> {
        if address == 0 && length > 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("a null buffer"));
        }
        let info = self.run(py, move |client| {
            // SAFETY: as in get_into_address; the bytes are only read.
            let data: &[u8] = if length == 0 {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(address as *const u8, length) }
            };
            client.put(bucket, key, data)
        })?;
        Ok(info_of(&info))
    }

    /// Store the concatenation of `parts`, sent from where each lies (no joined copy), retried
    /// as `put` is. A part is a `bytes` (immutable, and the list holds it for the call) or an
    /// `(address, length)` of memory the caller keeps alive and unchanged until this returns,
    /// as `put_address`; all are read without the GIL.
    fn put_parts(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Info> {
        let slices = part_slices(&parts)?;
        let info = self.run(py, move |client| {
            // SAFETY: as `part_slices` requires: `parts` is held until this call returns.
            let slices = unsafe { slices_of(&slices) };
            client.put_parts(bucket, key, &slices)
        })?;
        drop(parts);
        Ok(info_of(&info))
    }

    /// Store `size` bytes read from `reader` (an object with `readinto`), streamed: never whole
    /// in memory.
    fn put_reader(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        reader: Py<PyAny>,
        size: u64,
    ) -> PyResult<Info> {
        let mut source = PyReader { reader };
        let info = self.run(py, move |client| {
            client.put_from(bucket, key, &mut source, size, None)
        })?;
        Ok(info_of(&info))
    }

    fn stat(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<Info> {
        let info = self.run(py, |client| client.head(bucket, key))?;
        Ok(info_of(&info))
    }

    fn delete(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<()> {
        self.run(py, |client| client.delete(bucket, key))
    }

    /// A page of keys: (key, size, version, dirty), at most `limit`, after `start_after`.
    #[pyo3(signature = (bucket, prefix, start_after, limit))]
    fn list(
        &self,
        py: Python<'_>,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: u32,
    ) -> PyResult<Vec<(String, u64, u64, bool)>> {
        let entries = self.run(py, |client| client.list(bucket, prefix, start_after, limit))?;
        Ok(entries
            .into_iter()
            .map(|entry| (entry.key, entry.object_bytes, entry.seq, entry.dirty))
            .collect())
    }

    /// Each item (bucket, key, start, end): (info, bytes) or the exception it failed with.
    fn batch_get<'py>(
        &self,
        py: Python<'py>,
        items: Vec<(String, String, Option<u64>, Option<u64>)>,
        ordered: bool,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let items: Vec<GetItem> = items
            .into_iter()
            .map(|(bucket, key, start, end)| GetItem {
                bucket,
                key,
                range: range_of(start, end),
            })
            .collect();
        let results = self.run(py, |client| client.batch_get(&items, ordered))?;
        results
            .into_iter()
            .map(|result| match result {
                Ok((info, data)) => PyTuple::new(
                    py,
                    [
                        info_of(&info).into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &data).into_any(),
                        py.None().into_bound(py),
                    ],
                ),
                Err(error) => PyTuple::new(
                    py,
                    [
                        py.None().into_bound(py),
                        py.None().into_bound(py),
                        python_error(py, error)
                            .into_value(py)
                            .into_bound(py)
                            .into_any(),
                    ],
                ),
            })
            .collect()
    }

    /// (objects, bytes) read through from the origin under `prefix`.
    fn prefetch(&self, py: Python<'_>, bucket: &str, prefix: &str) -> PyResult<(u64, u64)> {
        self.run(py, |client| client.prefetch(bucket, prefix))
    }

    /// Keys of `bucket` that will be read in this order: the nodes read ahead of the reader.
    #[pyo3(signature = (bucket, plan_id, keys, window_bytes, idle))]
    fn plan(
        &self,
        py: Python<'_>,
        bucket: &str,
        plan_id: u64,
        keys: Vec<String>,
        window_bytes: u64,
        idle: f64,
    ) -> PyResult<u64> {
        let idle = Duration::try_from_secs_f64(idle).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err("idle must be a number of seconds >= 0")
        })?;
        self.run(py, |client| {
            client.plan(bucket, plan_id, &keys, window_bytes, idle)
        })
    }

    #[pyo3(signature = (bucket, prefix, timeout))]
    fn flush(
        &self,
        py: Python<'_>,
        bucket: Option<&str>,
        prefix: &str,
        timeout: f64,
    ) -> PyResult<()> {
        let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err("timeout must be a number of seconds >= 0")
        })?;
        self.run(py, |client| client.flush(bucket, prefix, timeout))
    }

    /// Each server's metrics (Prometheus text), with its address.
    fn stats(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        self.run(py, |client| client.stats())
    }
}

/// CPython's flag for a writable memoryview (`PyBUF_WRITE` in memoryobject.h, part of the
/// stable ABI; not among pyo3's abi3 constants).
const PYBUF_WRITE: std::os::raw::c_int = 0x200;

/// A Python object with `readinto(buffer)` as a `std::io::Read`: each read takes the GIL.
struct PyReader {
    reader: Py<PyAny>,
}

impl std::io::Read for PyReader {
    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        Python::attach(|py| {
            // A memoryview over `into` for the call only; `readinto` fills it.
            let view = unsafe {
                // SAFETY: `into` outlives the memoryview, which is released before returning
                // (the Python layer's readers do not keep the buffer they are given).
                let pointer = pyo3::ffi::PyMemoryView_FromMemory(
                    into.as_mut_ptr().cast(),
                    into.len() as pyo3::ffi::Py_ssize_t,
                    PYBUF_WRITE,
                );
                Bound::from_owned_ptr_or_err(py, pointer)
            }
            .map_err(|error| std::io::Error::other(error.to_string()))?;
            let result = self.reader.bind(py).call_method1("readinto", (&view,));
            let _ = view.call_method0("release");
            let read = result
                .and_then(|read| read.extract::<Option<usize>>())
                .map_err(|error| std::io::Error::other(error.to_string()))?;
            match read {
                Some(read) if read <= into.len() => Ok(read),
                Some(read) => Err(std::io::Error::other(format!(
                    "readinto returned {read}, more than the {} bytes it was given",
                    into.len()
                ))),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "the reader has no bytes now (non-blocking)",
                )),
            }
        })
    }
}

/// (address, length) of each part of a write: a `bytes` (immutable, held by the caller's list
/// for the call) or an `(address, length)` of memory the caller keeps alive and unchanged until
/// the call returns.
fn part_slices(parts: &[Bound<'_, PyAny>]) -> PyResult<Vec<(usize, usize)>> {
    let mut slices: Vec<(usize, usize)> = Vec::with_capacity(parts.len());
    for part in parts {
        let slice = match part.cast::<PyBytes>() {
            Ok(bytes) => {
                let bytes = bytes.as_bytes();
                (bytes.as_ptr() as usize, bytes.len())
            }
            Err(_) => part.extract::<(usize, usize)>().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(
                    "a part is bytes or an (address, length) pair",
                )
            })?,
        };
        if slice.0 == 0 && slice.1 > 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("a null buffer"));
        }
        slices.push(slice);
    }
    Ok(slices)
}

/// The parts `part_slices` found, as slices.
///
/// # Safety
/// The memory behind each part is alive and unchanged while the slices are used (the caller
/// holds the parts' list, and the owners of addressed memory keep it so, as `put_address`).
unsafe fn slices_of(parts: &[(usize, usize)]) -> Vec<&[u8]> {
    parts
        .iter()
        .map(|&(address, length)| match length {
            0 => &[][..], // an empty buffer may have no address at all
            // SAFETY: as this function requires.
            _ => unsafe { std::slice::from_raw_parts(address as *const u8, length) },
        })
        .collect()
}

/// A same-host write's condition from Python's arguments.
fn condition_of(if_absent: bool, if_version: Option<u64>) -> PyResult<LocalCondition> {
    match (if_absent, if_version) {
        (false, None) => Ok(LocalCondition::None),
        (true, None) => Ok(LocalCondition::Absent),
        (false, Some(seq)) => Ok(LocalCondition::Version(seq)),
        (true, Some(_)) => Err(pyo3::exceptions::PyValueError::new_err(
            "a write is conditional on the key being absent or on its version, not both",
        )),
    }
}

/// A connection to a server's same-host socket (`hydrant_client::local::LocalClient`). Its
/// regions belong to it; it is not for use across `fork()` (a child makes its own).
#[pyclass(frozen, module = "hydrant._hydrant")]
struct NativeLocal {
    pid: u32,
    client: Mutex<LocalClient>,
}

/// A region shared with the server: the Python layer sees its bytes through a ctypes array at
/// `address` (which keeps this object alive), so NumPy and torch wrap them without a copy.
#[pyclass(frozen, module = "hydrant._hydrant")]
struct NativeRegion {
    address: usize,
    length: usize,
    huge_pages: bool,
    region: Mutex<Option<Region>>,
    /// Its server side was given back (`NativeLocal::free`): reads into it are refused.
    freed: std::sync::atomic::AtomicBool,
}

/// A same-host read as Python sends it: (offset, length, bucket, key, start, end).
type LocalItem = (u64, u64, String, String, Option<u64>, Option<u64>);

fn lock_error<T>(_: T) -> ClientError {
    ClientError::Usage("a lock of the same-host client is poisoned".into())
}

#[pymethods]
impl NativeLocal {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<NativeLocal> {
        let client = py
            .detach(|| LocalClient::connect(&path))
            .map_err(|error| python_error(py, error))?;
        Ok(NativeLocal {
            pid: std::process::id(),
            client: Mutex::new(client),
        })
    }

    fn allocate(&self, py: Python<'_>, bytes: u64) -> PyResult<NativeRegion> {
        self.same_process()?;
        let mut region = py
            .detach(|| self.locked_client()?.allocate(bytes))
            .map_err(|error| python_error(py, error))?;
        Ok(NativeRegion {
            address: region.as_mut_ptr() as usize,
            length: region.len(),
            huge_pages: region.huge_pages(),
            region: Mutex::new(Some(region)),
            freed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads into `region`: items (offset, length, bucket, key, start, end); each item's
    /// (size, range start, written) or the exception it failed with.
    fn read<'py>(
        &self,
        py: Python<'py>,
        region: &NativeRegion,
        items: Vec<LocalItem>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.same_process()?;
        let items: Vec<LocalGet> = items
            .into_iter()
            .map(|(offset, length, bucket, key, start, end)| LocalGet {
                offset,
                length,
                bucket,
                key,
                range: range_of(start, end),
            })
            .collect();
        let results = py
            .detach(|| {
                let mut client = self.locked_client()?;
                let mut held = region.held()?;
                client.read_batch(held.as_mut().expect("held"), &items)
            })
            .map_err(|error| python_error(py, error))?;
        results
            .into_iter()
            .map(|result| match result {
                Ok(info) => Ok((info.object_bytes, info.range_start, info.written)
                    .into_pyobject(py)?
                    .into_any()),
                Err(error) => Ok(python_error(py, error)
                    .into_value(py)
                    .into_bound(py)
                    .into_any()),
            })
            .collect()
    }

    /// Store bytes `offset..offset + length` of `region` as `bucket/key` (a WRITE: the bytes
    /// do not cross the socket); `if_absent` / `if_version` make it conditional. The caller
    /// leaves those bytes unchanged until this returns.
    #[pyo3(signature = (region, offset, length, bucket, key, if_absent=false, if_version=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn write(
        &self,
        py: Python<'_>,
        region: &NativeRegion,
        offset: u64,
        length: u64,
        bucket: &str,
        key: &str,
        if_absent: bool,
        if_version: Option<u64>,
    ) -> PyResult<Info> {
        self.same_process()?;
        let condition = condition_of(if_absent, if_version)?;
        let answer = py
            .detach(|| {
                let mut client = self.locked_client()?;
                let held = region.held()?;
                client.write_from(
                    held.as_ref().expect("held"),
                    offset,
                    length,
                    bucket,
                    key,
                    condition,
                )
            })
            .map_err(|error| python_error(py, error))?;
        Ok((answer.bytes, answer.seq, answer.dirty))
    }

    /// Store the concatenation of `parts` (as `NativeClient::put_parts` takes them) as
    /// `bucket/key` with no region: the server reads them from this process's memory
    /// (WRITE_MEMORY), with the GIL released. An UNSUPPORTED status says the server may not
    /// read this process (write through a region then).
    #[pyo3(signature = (bucket, key, parts, if_absent=false, if_version=None))]
    fn write_memory(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        if_absent: bool,
        if_version: Option<u64>,
    ) -> PyResult<Info> {
        self.same_process()?;
        let condition = condition_of(if_absent, if_version)?;
        let slices = part_slices(&parts)?;
        let answer = py
            .detach(|| {
                // SAFETY: as `part_slices` requires: `parts` is held until this call returns.
                let slices = unsafe { slices_of(&slices) };
                self.locked_client()?
                    .write_memory(&slices, bucket, key, condition)
            })
            .map_err(|error| python_error(py, error))?;
        drop(parts);
        Ok((answer.bytes, answer.seq, answer.dirty))
    }

    /// Copy `parts` (as `NativeClient::put_parts` takes them) one after another into `region`
    /// from its start, then store them as `bucket/key` as `write` does, with the GIL released
    /// throughout. Parts larger than the region are refused before anything is copied.
    #[pyo3(signature = (region, bucket, key, parts, if_absent=false, if_version=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn write_parts(
        &self,
        py: Python<'_>,
        region: &NativeRegion,
        bucket: &str,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        if_absent: bool,
        if_version: Option<u64>,
    ) -> PyResult<Info> {
        self.same_process()?;
        let condition = condition_of(if_absent, if_version)?;
        let slices = part_slices(&parts)?;
        let total: usize = slices.iter().map(|&(_, length)| length).sum();
        if total > region.length {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{total} bytes do not fit the region's {}",
                region.length
            )));
        }
        let answer = py
            .detach(|| {
                let mut client = self.locked_client()?;
                let mut held = region.held()?;
                let target = held.as_mut().expect("held");
                // SAFETY: as `part_slices` requires: `parts` is held until this call returns.
                let mut at = 0;
                let memory = target.as_mut_slice();
                for part in unsafe { slices_of(&slices) } {
                    memory[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                client.write_from(target, 0, total as u64, bucket, key, condition)
            })
            .map_err(|error| python_error(py, error))?;
        drop(parts);
        Ok((answer.bytes, answer.seq, answer.dirty))
    }

    /// Give the server's side of `region` back now. The mapping stays until the region and
    /// every view of it are gone (views hold the `NativeRegion`); reads into it fail.
    fn free(&self, py: Python<'_>, region: &NativeRegion) -> PyResult<()> {
        self.same_process()?;
        py.detach(|| {
            let mut held = region.region.lock().map_err(lock_error)?;
            if region
                .freed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                return Ok(());
            }
            match held.as_mut() {
                Some(kept) => self.locked_client()?.release(kept),
                None => Ok(()),
            }
        })
        .map_err(|error| python_error(py, error))
    }
}

impl NativeLocal {
    /// The connection, locked (call with the GIL released, see `NativeClient::client_detached`).
    fn locked_client(&self) -> hydrant_client::Result<std::sync::MutexGuard<'_, LocalClient>> {
        self.client.lock().map_err(lock_error)
    }

    fn same_process(&self) -> PyResult<()> {
        same_process(self.pid, "a same-host client")
    }
}

impl NativeRegion {
    /// The region, locked, unless its server side was given back.
    fn held(&self) -> hydrant_client::Result<std::sync::MutexGuard<'_, Option<Region>>> {
        let held = self.region.lock().map_err(lock_error)?;
        if held.is_none() || self.freed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ClientError::Usage("the region was freed".into()));
        }
        Ok(held)
    }
}

#[pymethods]
impl NativeRegion {
    #[getter]
    fn address(&self) -> usize {
        self.address
    }

    #[getter]
    fn length(&self) -> usize {
        self.length
    }

    #[getter]
    fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// Register with CUDA (page-locked for DMA); (ok, why not) so that Python raises its typed
    /// error.
    fn register_cuda(&self, py: Python<'_>) -> (bool, String) {
        py.detach(|| {
            let Ok(mut held) = self.region.lock() else {
                return (false, "the region's lock is poisoned".into());
            };
            match held.as_mut().map(Region::register_cuda) {
                None => (false, "the region was freed".into()),
                Some(Ok(())) => (true, String::new()),
                Some(Err(error)) => (false, error.to_string()),
            }
        })
    }

    #[getter]
    fn cuda_registered(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            self.region
                .lock()
                .is_ok_and(|held| held.as_ref().is_some_and(Region::cuda_registered))
        })
    }
}

/// Several same-host reads in flight (`hydrant_client::local::ReadRing`): one connection, one
/// region of slots, and the server's read rings. The Python layer views each slot's bytes at
/// `slot_memory`.
#[pyclass(frozen, module = "hydrant._hydrant")]
struct NativeRing {
    pid: u32,
    slots: Vec<(usize, usize)>,
    ring: std::mem::ManuallyDrop<Mutex<ReadRing>>,
}

impl Drop for NativeRing {
    fn drop(&mut self) {
        // Its connection and rings belong to the process that made it: a forked child leaves
        // them alone (its copy of the connection must not tell the server anything).
        if std::process::id() == self.pid {
            // SAFETY: dropped once, here, and never used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.ring) };
        }
    }
}

#[pymethods]
impl NativeRing {
    #[new]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        slots: usize,
        slot_bytes: u64,
    ) -> PyResult<NativeRing> {
        let ring = py
            .detach(|| ReadRing::new(&path, slots, slot_bytes))
            .map_err(|error| python_error(py, error))?;
        let slots = (0..ring.slots())
            .filter_map(|index| ring.slot_memory(index))
            .map(|(address, length)| (address as usize, length))
            .collect();
        Ok(NativeRing {
            pid: std::process::id(),
            slots,
            ring: std::mem::ManuallyDrop::new(Mutex::new(ring)),
        })
    }

    /// (address, length) of each slot's region.
    fn slot_memory(&self) -> Vec<(usize, usize)> {
        self.slots.clone()
    }

    #[pyo3(signature = (bucket, key, start=None, end=None))]
    fn submit(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<()> {
        self.same_process()?;
        py.detach(|| {
            self.ring
                .lock()
                .map_err(lock_error)?
                .submit(bucket, key, range_of(start, end))
        })
        .map_err(|error| python_error(py, error))
    }

    /// The oldest read, once complete: (slot, (size, range start, written)) or the exception
    /// it failed with as (slot, exception); `None` when nothing is in flight.
    fn complete<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.same_process()?;
        let done = py.detach(|| {
            let mut ring = self.ring.lock().map_err(lock_error)?;
            Ok::<_, ClientError>(
                ring.complete()
                    .map(|result| result.map(|completed| (completed.slot, completed.info))),
            )
        });
        let done = done.map_err(|error| python_error(py, error))?;
        Ok(match done {
            None => None,
            Some(Ok((slot, info))) => Some(
                (slot, (info.object_bytes, info.range_start, info.written))
                    .into_pyobject(py)?
                    .into_any(),
            ),
            Some(Err(error)) => Some(
                python_error(py, error)
                    .into_value(py)
                    .into_bound(py)
                    .into_any(),
            ),
        })
    }
}

impl NativeRing {
    fn same_process(&self) -> PyResult<()> {
        same_process(self.pid, "a read ring")
    }
}

/// Refuse `what`, made in process `pid`, in another (a forked child): its connection and
/// regions are its parent's.
fn same_process(pid: u32, what: &str) -> PyResult<()> {
    if std::process::id() != pid {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{what} is not shared with a forked process: make one in the child"
        )));
    }
    Ok(())
}

#[pymodule]
fn _hydrant(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<NativeRing>()?;
    module.add_class::<NativeClient>()?;
    module.add_class::<NativeLocal>()?;
    module.add_class::<NativeRegion>()?;
    module.add("PROTOCOL_STATUSES", status_table())?;
    Ok(())
}

/// (code, name) of every status of the protocol, for `hydrant.errors`.
fn status_table() -> Vec<(u8, String)> {
    hydrant_proto::Status::ALL
        .iter()
        .map(|status| (*status as u8, format!("{status:?}")))
        .collect()
}
