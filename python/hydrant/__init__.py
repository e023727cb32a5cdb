"""hydrant's Python client: the native protocol of a hydrant node, at native speed.

Objects are named ``"BUCKET/KEY"`` (``"hydrant://BUCKET/KEY"`` is taken too)::

    import hydrant
    client = hydrant.Client("127.0.0.1:7700")          # or HYDRANT_SERVER, HYDRANT_TOKEN
    client.put("datasets/train/0001.tar", open("0001.tar", "rb"))
    data = client.get("datasets/train/0001.tar", range=(0, 4096))
    array = numpy.empty(1 << 20, dtype=numpy.uint8)
    read = client.get_into("datasets/train/0001.tar", array)   # no copy on the way

Every call releases the GIL while it waits; one client may be shared by threads, and a client
used after ``fork()`` (DataLoader workers) connects anew rather than sharing its parent's
sockets.
"""

import ctypes
import io
import os
import shutil
import tempfile
import threading
import time
import zlib
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import errors
from ._hydrant import NativeClient, NativeLocal, NativeRegion, NativeRing
from .errors import (
    BufferTooSmall,
    Busy,
    ChecksumMismatch,
    ConnectionFailed,
    CudaUnavailable,
    HydrantError,
    InvalidKey,
    InvalidRange,
    LocalError,
    NoSpace,
    NotFound,
    OriginRefused,
    PreconditionFailed,
    Unsupported,
    OriginUnavailable,
    ProtocolError,
    ReadOnly,
    Retriable,
    ServerTimeout,
    StatusError,
    TooLarge,
    Unauthenticated,
    UsageError,
)

__all__ = [
    "Client",
    "LocalClient",
    "Region",
    "ReadRing",
    "Completion",
    "ReadInfo",
    "ObjectInfo",
    "ListEntry",
    "errors",
    "HydrantError",
    "StatusError",
    "Retriable",
    "NotFound",
    "InvalidKey",
    "InvalidRange",
    "TooLarge",
    "Unauthenticated",
    "ReadOnly",
    "OriginRefused",
    "PreconditionFailed",
    "Unsupported",
    "ChecksumMismatch",
    "Busy",
    "OriginUnavailable",
    "NoSpace",
    "ServerTimeout",
    "ProtocolError",
    "ConnectionFailed",
    "UsageError",
    "BufferTooSmall",
    "CudaUnavailable",
    "BATCH_ITEMS_MAX",
    "BATCHES_IN_FLIGHT",
    "LocalError",
]

#: Where a client connects when neither its arguments nor HYDRANT_SERVER say.
DEFAULT_SERVER = "127.0.0.1:7700"
#: Keys of one LIST page at most (the protocol's bound).
LIST_PAGE_MAX = 1000
#: Items of one BATCH_GET request the client sends at most; longer batches are split.
BATCH_ITEMS_MAX = 256
#: BATCH_GET requests one ``batch_get`` keeps in flight at most.
BATCHES_IN_FLIGHT = 4
#: Bytes a PUT from a stream that cannot seek copies at a time into its temporary file.
PUT_SPOOL_BLOCK_BYTES = 1 << 20
#: How far a plan (:meth:`Client.plan`) reads ahead of its reader by default, in bytes.
PLAN_WINDOW_BYTES = 256 << 20
#: A plan none of whose keys is read for this long (seconds) ends, by default.
PLAN_IDLE_SECONDS = 30.0

#: Objects of at most this many bytes go through a region shared with the server, where a
#: client has a same-host socket (``local_socket``) but the server may not read the client's
#: memory, or the object comes from a file; larger ones go over TCP. It bounds each region (the
#: ``local_write_bytes_max`` argument). Writes the server reads from the client's memory need
#: no region, and have no bound but the server's.
LOCAL_WRITE_BYTES_MAX = 1 << 30
#: Objects smaller than this go over TCP even with a same-host socket: one TCP request is as
#: cheap as a same-host one for them.
LOCAL_WRITE_BYTES_MIN = 256 << 10
#: The smallest region a same-host writer allocates, and the step in which it grows.
LOCAL_WRITE_REGION_MIN = 64 << 20
#: Parts of one write the server reads from a client's memory at most (the protocol's bound);
#: a write of more goes through a region.
LOCAL_WRITE_PARTS_MAX = 65536
#: Same-host connections a client keeps between its writes.
LOCAL_WRITE_IDLE_CONNECTIONS_MAX = 16
#: Bytes of regions a client keeps for its same-host writes between them, by default (the
#: ``local_write_idle_bytes_max`` argument): beyond, a region is given back after its write.
LOCAL_WRITE_IDLE_BYTES_MAX = 4 << 30

Range = Tuple[int, Optional[int]]


class ObjectInfo(NamedTuple):
    """An object's size in bytes, its version on the node, and whether it is not yet at the
    origin (``dirty``)."""

    size: int
    version: int
    dirty: bool


class ListEntry(NamedTuple):
    """One key of a listing, with its size, version and dirty flag."""

    path: str
    size: int
    version: int
    dirty: bool


def _split(path: str) -> Tuple[str, str]:
    """(bucket, key) of ``BUCKET/KEY`` or ``hydrant://BUCKET/KEY``."""
    if not isinstance(path, str):
        raise UsageError(f"an object is named by a str BUCKET/KEY, not {type(path).__name__}")
    if path.startswith("hydrant://"):
        path = path[len("hydrant://"):]
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise UsageError(f"{path!r} is not BUCKET/KEY")
    return bucket, key


def _split_prefix(prefix: str) -> Tuple[str, str]:
    """(bucket, key prefix) of ``BUCKET`` or ``BUCKET/PREFIX``."""
    if prefix.startswith("hydrant://"):
        prefix = prefix[len("hydrant://"):]
    bucket, _, rest = prefix.partition("/")
    if not bucket:
        raise UsageError(f"{prefix!r} does not name a bucket")
    return bucket, rest


def _range(range: Optional[Range]) -> Tuple[Optional[int], Optional[int]]:
    if range is None:
        return None, None
    try:
        start, end = range
    except (TypeError, ValueError):
        raise UsageError(f"a range is (start, end), end exclusive or None, not {range!r}") from None
    if start < 0 or (end is not None and end < start):
        raise UsageError(f"the range {range!r} is empty or negative")
    return start, end


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the same layout in every CPython 3)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class _Export:
    """A buffer's contiguous bytes exported for reading, by address, until this is released or
    collected. ctypes exports only writable buffers; this takes read-only ones too."""

    def __init__(self, buffer: Any):
        self._held = False
        self._buffer = _PyBuffer()
        _get_buffer(buffer, ctypes.byref(self._buffer), 0)  # PyBUF_SIMPLE: contiguous bytes
        self._held = True
        self.address = self._buffer.buf or 0
        self.size = self._buffer.len

    def release(self) -> None:
        if self._held:
            self._held = False
            _release_buffer(ctypes.byref(self._buffer))

    def __del__(self) -> None:
        self.release()


def _address(buffer: Any) -> int:
    """Where a buffer's bytes start in memory."""
    export = _Export(buffer)
    try:
        return export.address
    finally:
        export.release()


class _Memory:
    """The address and size of a buffer's bytes, held exported for as long as this lives."""

    def __init__(self, buffer: Any, writable: bool):
        self._keep: Tuple[Any, ...]
        if _is_tensor(buffer):
            if buffer.device.type != "cpu":
                raise UsageError(f"a tensor on {buffer.device} is not host memory; read into a CPU (or pinned) tensor")
            if not buffer.is_contiguous():
                raise UsageError("the tensor is not contiguous")
            self.address = buffer.data_ptr()
            self.size = buffer.numel() * buffer.element_size()
            self._keep = (buffer,)
            self.copy = None
            return
        try:
            view = memoryview(buffer)
        except TypeError:
            raise UsageError(f"{type(buffer).__name__} has no buffer to read into or from") from None
        if not view.c_contiguous:
            raise UsageError("the buffer is not contiguous")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.copy: Optional[bytes] = None
        if view.readonly:
            if writable:
                raise UsageError("the buffer is read-only")
            # ctypes exports only writable buffers: a read-only one through CPython's own call.
            try:
                export = _Export(view)
            except BufferError:
                self.copy = bytes(view)
                self.address, self.size, self._keep = 0, len(self.copy), ()
                return
            self.address, self.size = export.address, export.size
            self._keep = (view, export)
            return
        holder = (ctypes.c_char * view.nbytes).from_buffer(view)
        self.address = ctypes.addressof(holder)
        self.size = view.nbytes
        self._keep = (view, holder)


class _ReadInto(io.RawIOBase):
    """A reader with only ``read`` seen through ``readinto``."""

    def __init__(self, source: Any):
        self._source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        if data is None:
            return None  # type: ignore[return-value]
        buffer[: len(data)] = data
        return len(data)


def _is_loopback(server: str) -> bool:
    host = server.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _parts_of(data: Any) -> Tuple[List[Any], List[Any], int]:
    """(parts for the native calls, what keeps their memory exported, bytes in all) of ``data``:
    bytes as they are, other buffers by (address, length)."""
    items = list(data) if isinstance(data, (list, tuple)) else [data]
    held = [item if isinstance(item, bytes) else _Memory(item, writable=False) for item in items]
    parts = [
        part if isinstance(part, bytes) else part.copy if part.copy is not None
        else (part.address, part.size)
        for part in held
    ]
    size = sum(len(part) if isinstance(part, bytes) else part[1] for part in parts)
    return parts, held, size


def _length(writer: Tuple[Any, Optional[NativeRegion]]) -> int:
    return 0 if writer[1] is None else writer[1].length


class _LocalWrites:
    """A client's writes through its server's same-host socket: from the writer's memory
    (WRITE_MEMORY) while the server may read this process, else through a region. Each write
    takes a writer (a connection, and a region grown to the object's size up to ``bytes_max``
    where one is needed) from the idle ones or makes one, and gives it back after; up to
    ``idle_bytes_max`` of regions stay between writes, so that a process that saves again finds
    its memory ready (a new region's pages cost more to fault in than to fill)."""

    def __init__(self, socket_path: str, required: bool, bytes_max: int, idle_bytes_max: int,
                 retries: int, backoff: Tuple[float, float], deadline: float):
        self.socket_path = socket_path
        self._required = required
        self._bytes_max = bytes_max
        self._idle_bytes_max = idle_bytes_max
        self._retries = retries
        self._backoff = backoff
        self._deadline = deadline
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: List[Tuple[NativeLocal, Optional[NativeRegion]]] = []
        self._unreachable = False
        # Whether the server may read this process's memory (until it says it may not).
        self._memory = True

    def settings(self) -> tuple:
        return (self.socket_path, self._required, self._bytes_max, self._idle_bytes_max,
                self._retries, self._backoff, self._deadline)

    def _take(self, size: int) -> Optional[Tuple[NativeLocal, Optional[NativeRegion]]]:
        """A writer with a region of at least ``size`` bytes (none needed for 0); None where
        the socket (from the environment) cannot be reached."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: its parent's connections and regions are not its own.
                self._pid, self._idle, self._unreachable = os.getpid(), [], False
            if self._unreachable:
                return None
            fitting = [writer for writer in self._idle if _length(writer) >= size]
            if fitting:
                writer = min(fitting, key=_length)
            elif self._idle:
                writer = max(self._idle, key=_length)
            else:
                writer = None
            if writer is not None:
                self._idle.remove(writer)
        if writer is None:
            try:
                writer = (NativeLocal(self.socket_path), None)
            except HydrantError:
                if self._required:
                    raise
                self._unreachable = True
                return None
        local, region = writer
        if size > 0 and (region is None or region.length < size):
            if region is not None:
                local.free(region)
            # In steps of LOCAL_WRITE_REGION_MIN: a region is as large as the writes need.
            steps = -(-size // LOCAL_WRITE_REGION_MIN)
            region = local.allocate(min(steps * LOCAL_WRITE_REGION_MIN, max(size, self._bytes_max)))
        return local, region

    def _give_back(self, writer: Tuple[NativeLocal, Optional[NativeRegion]]) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(writer)
                self._idle.sort(key=_length)
                while sum(map(_length, self._idle)) > self._idle_bytes_max:
                    # The largest go first; their connections close with them.
                    self._idle.pop()
                # Connections without regions: a few, for writes from several threads.
                while len(self._idle) > LOCAL_WRITE_IDLE_CONNECTIONS_MAX:
                    self._idle.pop(0)

    def _fits(self, size: int) -> bool:
        return LOCAL_WRITE_BYTES_MIN <= size <= self._bytes_max

    def _write(self, store) -> ObjectInfo:
        """``store()``, retried as the TCP client retries a retriable status."""
        started = time.monotonic()
        wait = self._backoff[0]
        for attempt in range(self._retries + 1):
            try:
                return ObjectInfo(*store())
            except errors.Retriable:
                if attempt == self._retries or time.monotonic() + wait - started > self._deadline:
                    raise
                time.sleep(wait)
                wait = min(wait * 2, self._backoff[1])
        raise AssertionError("unreachable")

    def put(self, bucket: str, key: str, data: Any) -> Optional[ObjectInfo]:
        """Store ``data`` (bytes, a buffer, or a list or tuple of them) through the region, or
        None when it is not for this path (its size, or no socket)."""
        parts, held, size = _parts_of(data)
        try:
            if size < LOCAL_WRITE_BYTES_MIN:
                return None
            if self._memory and len(parts) <= LOCAL_WRITE_PARTS_MAX:
                # Read by the server from where the parts lie: no region, no copy here.
                writer = self._take(0)
                if writer is None:
                    return None
                local, region = writer
                try:
                    return self._write(lambda: local.write_memory(bucket, key, parts))
                except errors.Unsupported:
                    self._memory = False  # the server may not read this process: use regions
                except errors.InvalidRange:
                    pass  # memory the kernel lends to no other process (a device's): copy it
                finally:
                    self._give_back(writer)
            if not self._fits(size):
                return None
            writer = self._take(size)
            if writer is None:
                return None
            local, region = writer
            try:
                return self._write(lambda: local.write_parts(region, bucket, key, parts))
            finally:
                self._give_back(writer)
        finally:
            held.clear()  # the exports end here, even when the write failed

    def put_file(self, bucket: str, key: str, reader: Any, size: int) -> Optional[ObjectInfo]:
        """Store ``size`` bytes read from ``reader`` (with ``readinto``) through the region, or
        None as ``put``."""
        if not self._fits(size):
            return None
        writer = self._take(size)
        if writer is None:
            return None
        local, region = writer
        try:
            view = memoryview((ctypes.c_char * region.length).from_address(region.address))
            view = view.cast("B")
            try:
                filled = 0
                while filled < size:
                    read = reader.readinto(view[filled:size])
                    if not read:
                        raise UsageError(f"the file ended after {filled} of its {size} bytes")
                    filled += read
            finally:
                view.release()
            return self._write(lambda: local.write(region, 0, size, bucket, key))
        finally:
            self._give_back(writer)


class Client:
    """A client of one or several hydrant nodes (keys are placed on them by rendezvous
    hashing, as every hydrant client places them).

    ``servers``: ``"host:port"``, a comma-separated list, or a sequence of them (default:
    ``HYDRANT_SERVER``, else 127.0.0.1:7700). ``token``: the shared token of servers that ask
    for one (default: ``HYDRANT_TOKEN``). ``timeout`` sets both ``connect_timeout`` and
    ``request_timeout`` (seconds). ``retries``: retries of a request that got a retriable
    status or lost its connection, waiting ``backoff`` = (first, longest) seconds between
    them, none starting later than ``retry_deadline`` seconds after the call began.

    ``local_socket``: the same-host socket of the server (``hydrant-server --local-socket
    PATH``; default: ``HYDRANT_LOCAL_SOCKET`` where the one server is on a loopback address).
    With it, ``put`` of bytes, buffers and lists of them from ``LOCAL_WRITE_BYTES_MIN`` bytes
    lets the server read them from where they lie in this process (:meth:`LocalClient.write`);
    where the kernel does not let it, and for files, those up to ``local_write_bytes_max`` are
    copied once into a region shared with the server, which stores them from there. No bytes
    cross a socket. Regions of up to ``local_write_idle_bytes_max`` bytes in all are kept
    between writes for the next ones. It needs exactly one server, the one that socket belongs
    to. A socket given here that cannot be reached is an error; one from the environment that
    cannot be reached is passed over (TCP is used).
    """

    def __init__(
        self,
        servers: Union[str, Sequence[str], None] = None,
        token: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        *,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        retries: int = 4,
        backoff: Tuple[float, float] = (0.02, 2.0),
        retry_deadline: float = 60.0,
        max_connections_per_node: int = 8,
        shard_aware: bool = True,
        local_socket: Union[str, "os.PathLike[str]", None] = None,
        local_write_bytes_max: int = LOCAL_WRITE_BYTES_MAX,
        local_write_idle_bytes_max: int = LOCAL_WRITE_IDLE_BYTES_MAX,
    ):
        if servers is None:
            servers = os.environ.get("HYDRANT_SERVER", DEFAULT_SERVER)
        if isinstance(servers, str):
            servers = [server.strip() for server in servers.split(",") if server.strip()]
        servers = list(servers)
        local_required = local_socket is not None
        if local_socket is None and len(servers) == 1 and _is_loopback(servers[0]):
            local_socket = os.environ.get("HYDRANT_LOCAL_SOCKET") or None
        if local_socket is not None and len(servers) != 1:
            raise UsageError(
                f"a same-host socket belongs to one server; this client has {len(servers)}"
            )
        if local_write_bytes_max < 0 or local_write_idle_bytes_max < 0:
            raise UsageError("local_write_bytes_max and local_write_idle_bytes_max are at least 0")
        self._local = None if local_socket is None else _LocalWrites(
            os.fspath(local_socket), local_required, int(local_write_bytes_max),
            int(local_write_idle_bytes_max), int(retries), (float(backoff[0]), float(backoff[1])),
            float(retry_deadline))
        if token is None:
            token = os.environ.get("HYDRANT_TOKEN")
        if isinstance(token, str):
            token = token.encode()
        if timeout is not None:
            connect_timeout = request_timeout = timeout
        self._arguments = dict(
            servers=servers,
            token=token,
            connect_timeout=float(connect_timeout),
            request_timeout=float(request_timeout),
            retries=int(retries),
            backoff_initial=float(backoff[0]),
            backoff_max=float(backoff[1]),
            retry_deadline=float(retry_deadline),
            max_connections_per_node=int(max_connections_per_node),
            shard_aware=bool(shard_aware),
        )
        self._native = NativeClient(**self._arguments)

    # A client in a DataLoader's dataset is pickled to reach spawned workers: it connects anew.
    def __getstate__(self) -> dict:
        return {"arguments": dict(self._arguments),
                "local": None if self._local is None else self._local.settings()}

    def __setstate__(self, state: dict) -> None:
        self._arguments = state["arguments"]
        self._native = NativeClient(**self._arguments)
        self._local = None if state["local"] is None else _LocalWrites(*state["local"])

    @property
    def local_socket(self) -> Optional[str]:
        """The same-host socket that ``put`` writes through, if any."""
        return None if self._local is None else self._local.socket_path

    def __repr__(self) -> str:
        return f"hydrant.Client({self._arguments['servers']!r})"

    @property
    def servers(self) -> List[str]:
        return list(self._arguments["servers"])

    def get(self, path: str, range: Optional[Range] = None) -> bytes:
        """The object's bytes, or bytes ``start..end`` of it (``end`` exclusive; ``None``: to
        the end)."""
        bucket, key = _split(path)
        start, end = _range(range)
        _, data = self._native.get(bucket, key, start, end)
        return data

    def get_into(self, path: str, buffer: Any, offset: int = 0, range: Optional[Range] = None) -> int:
        """Read the object (or ``range`` of it) into ``buffer`` at byte ``offset``, with no
        copy on the way: any writable contiguous buffer (``bytearray``, a NumPy array, an
        ``mmap``, a CPU or pinned ``torch`` tensor). Returns the bytes read. A buffer too small
        for the answer raises :class:`BufferTooSmall` and is left untouched."""
        bucket, key = _split(path)
        start, end = _range(range)
        memory = _Memory(buffer, writable=True)
        if offset < 0 or offset > memory.size:
            raise UsageError(f"offset {offset} is outside the buffer's {memory.size} bytes")
        _, read = self._native.get_into_address(
            bucket, key, memory.address + offset, memory.size - offset, start, end
        )
        del memory
        return read

    def put(self, path: str, data: Any) -> ObjectInfo:
        """Store ``data`` as the object: ``bytes`` or any buffer (stored from where it lies), a
        list or tuple of them (stored one after another, each sent from where it lies, never
        joined), a file object opened for binary reading (streamed from its position to
        its end, never whole in memory; one that cannot seek, such as a pipe, is first copied
        to a temporary file, since a PUT names its size first), or a path (``str`` or
        ``os.PathLike``) of a file to stream."""
        bucket, key = _split(path)
        if self._local is not None and not isinstance(data, (str, os.PathLike)) \
                and not hasattr(data, "read"):
            stored = self._local.put(bucket, key, data)
            if stored is not None:
                return stored
        if isinstance(data, bytes):
            return ObjectInfo(*self._native.put(bucket, key, data))
        if isinstance(data, (list, tuple)):
            # Each part sent from where it lies: bytes as they are, other buffers (tensors,
            # arrays, memoryviews) by address, held exported until the PUT ends.
            parts, held, _ = _parts_of(data)
            try:
                return ObjectInfo(*self._native.put_parts(bucket, key, parts))
            finally:
                held.clear()  # the exports end here, even when the PUT failed
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as file:
                return self._put_file(bucket, key, file)
        if hasattr(data, "read"):
            return self._put_file(bucket, key, data)
        memory = _Memory(data, writable=False)
        if memory.copy is not None:
            return ObjectInfo(*self._native.put(bucket, key, memory.copy))
        info = self._native.put_address(bucket, key, memory.address, memory.size)
        del memory
        return ObjectInfo(*info)

    def _put_file(self, bucket: str, key: str, file: Any) -> ObjectInfo:
        # The bytes from the position to the end, measured by seeking (not by the file
        # descriptor's size, which is the compressed size of a gzip file, 0 for /proc files,
        # and would force a SpooledTemporaryFile to disk).
        size = None
        try:
            # Python 3.9 and 3.10's SpooledTemporaryFile seeks but has no seekable().
            seekable = getattr(file, "seekable", None)
            if seekable is None or seekable():
                position = file.tell()
                end = file.seek(0, io.SEEK_END)
                file.seek(position)
                if isinstance(position, int) and isinstance(end, int) and end >= position:
                    size = end - position
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            size = None
        if size is None:
            # Not seekable (a pipe, a socket, a decompressing stream): its size is known only at
            # its end, so it goes to a temporary file first, PUT_SPOOL_BLOCK_BYTES at a time.
            with tempfile.TemporaryFile() as spool:
                shutil.copyfileobj(file, spool, PUT_SPOOL_BLOCK_BYTES)
                size = spool.tell()
                spool.seek(0)
                return ObjectInfo(*self._native.put_reader(bucket, key, spool, size))
        reader = file if hasattr(file, "readinto") else _ReadInto(file)
        if self._local is not None:
            stored = self._local.put_file(bucket, key, reader, size)
            if stored is not None:
                return stored
        return ObjectInfo(*self._native.put_reader(bucket, key, reader, size))

    def stat(self, path: str) -> ObjectInfo:
        """Size, version and dirty flag; :class:`NotFound` if there is no such object."""
        bucket, key = _split(path)
        return ObjectInfo(*self._native.stat(bucket, key))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def delete(self, path: str) -> None:
        bucket, key = _split(path)
        self._native.delete(bucket, key)

    def list(self, prefix: str, page_size: int = LIST_PAGE_MAX) -> Iterator[ListEntry]:
        """The objects of ``BUCKET[/PREFIX]`` in key order, fetched a page at a time as the
        iteration goes."""
        bucket, key_prefix = _split_prefix(prefix)
        page_size = max(1, min(int(page_size), LIST_PAGE_MAX))
        after: Optional[str] = None
        while True:
            page = self._native.list(bucket, key_prefix, after, page_size)
            for key, size, version, dirty in page:
                yield ListEntry(f"{bucket}/{key}", size, version, dirty)
            if len(page) < page_size:
                return
            after = page[-1][0]

    def batch_get(
        self,
        items: Iterable[Union[str, Tuple[str, Optional[Range]]]],
        ordered: bool = False,
    ) -> Iterator[Tuple[str, Union[bytes, HydrantError]]]:
        """Read many objects (``path`` or ``(path, range)``) in few requests: yields
        ``(path, bytes)``, or ``(path, exception)`` for an item that failed on its own.

        Items go :data:`BATCH_ITEMS_MAX` to a request, :data:`BATCHES_IN_FLIGHT` requests at
        once; results come a request at a time as requests complete (with ``ordered``, in the
        order of ``items``). ``items`` is consumed as the iteration goes, so a long or endless
        iterable holds at most the requests in flight in memory."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        def send(batch):
            results = self._native.batch_get([item[1:] for item in batch], ordered)
            return [(path, error if error is not None else data)
                    for (path, *_), (_, data, error) in zip(batch, results)]

        def batches():
            batch = []
            for item in items:
                path, range = (item, None) if isinstance(item, str) else item
                bucket, key = _split(path)
                start, end = _range(range)
                batch.append((path, bucket, key, start, end))
                if len(batch) == BATCH_ITEMS_MAX:
                    yield batch
                    batch = []
            if batch:
                yield batch

        with ThreadPoolExecutor(max_workers=BATCHES_IN_FLIGHT) as pool:
            pending = []  # in submission order
            source = batches()
            exhausted = False
            while True:
                while not exhausted and len(pending) < BATCHES_IN_FLIGHT:
                    batch = next(source, None)
                    if batch is None:
                        exhausted = True
                    else:
                        pending.append(pool.submit(send, batch))
                if not pending:
                    return
                if ordered:
                    done = pending.pop(0)
                else:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    done = next(future for future in pending if future in finished)
                    pending.remove(done)
                yield from done.result()

    def prefetch(self, prefix: str) -> Tuple[int, int]:
        """Read every object of ``BUCKET[/PREFIX]`` through from the origin into the node's
        cache; returns (objects, bytes) warmed."""
        bucket, key_prefix = _split_prefix(prefix)
        return self._native.prefetch(bucket, key_prefix)

    def plan(
        self,
        paths: Sequence[str],
        plan_id: int,
        window_bytes: int = PLAN_WINDOW_BYTES,
        idle: float = PLAN_IDLE_SECONDS,
    ) -> int:
        """Say that ``paths`` (``BUCKET/KEY``) will be read in this order, so that each node
        reads its own of them ahead from the origin, at most ``window_bytes`` beyond the
        furthest one read so far, until none is read for ``idle`` seconds. ``plan_id`` (an
        int of 64 bits, the reader's choice) names the plan: a new plan of the same id replaces
        it. A plan also ends once its reader has passed its last key. A node takes up to 65,536 keys of one plan; returns
        how many keys the nodes planned."""
        if not 0 <= plan_id < 1 << 64:
            raise UsageError("plan_id is an int of 64 bits")
        by_bucket: Dict[str, List[str]] = {}
        for path in paths:
            bucket, key = _split(path)
            by_bucket.setdefault(bucket, []).append(key)
        planned = 0
        for bucket, keys in by_bucket.items():
            # One plan per bucket, each of its own id: a plan replaces only its own bucket's.
            bucket_plan = plan_id ^ zlib.crc32(bucket.encode())
            planned += self._native.plan(bucket, bucket_plan, keys, int(window_bytes), float(idle))
        return planned

    def flush(self, prefix: Optional[str] = None, timeout: float = 3600.0) -> None:
        """Wait until what was written under ``BUCKET[/PREFIX]`` (everything, without one) is
        at the origin, at most ``timeout`` seconds (then :class:`ServerTimeout`)."""
        if prefix is None:
            self._native.flush(None, "", float(timeout))
        else:
            bucket, key_prefix = _split_prefix(prefix)
            self._native.flush(bucket, key_prefix, float(timeout))

    def stats(self) -> dict:
        """Each server's metrics in the Prometheus text format, by address."""
        return dict(self._native.stats())


class ReadInfo(NamedTuple):
    """What a same-host read did: the object's size, the offset in it of the first byte
    written, and the bytes written into the region."""

    size: int
    range_start: int
    written: int


class Region:
    """Memory shared with a server on this host, which same-host reads write into. Its bytes
    are :attr:`buffer` (a ctypes array: ``numpy.frombuffer(region.buffer, dtype)`` and
    ``torch.frombuffer(region.buffer, dtype=...)`` wrap them without a copy). The mapping lives
    as long as this object or any view of it; the server writes into it only during a read."""

    def __init__(self, native: NativeRegion):
        self._native = native
        array = (ctypes.c_char * native.length).from_address(native.address)
        # The array keeps the mapping alive for as long as any view of it exists.
        array._hydrant_region = native  # type: ignore[attr-defined]
        self.buffer = array

    def __len__(self) -> int:
        return self._native.length

    @property
    def huge_pages(self) -> bool:
        """Whether the server backed it with huge pages."""
        return self._native.huge_pages

    @property
    def cuda_registered(self) -> bool:
        return self._native.cuda_registered

    def memoryview(self) -> memoryview:
        return memoryview(self.buffer).cast("B")

    def register_cuda(self) -> None:
        """Page-lock the region for the GPU's DMA (cudaHostRegister, CUDA loaded at run time).
        Raises :class:`CudaUnavailable` without CUDA; the region then works as before."""
        ok, why = self._native.register_cuda()
        if not ok:
            raise CudaUnavailable(why)


class LocalClient:
    """A client of a server on this host, through its same-host socket
    (``hydrant-server --local-socket PATH``): reads land in a :class:`Region` shared with the
    server, and only a small completion crosses the socket. One connection; its calls are
    serialised. Not for use across ``fork()``: make one in each process."""

    def __init__(self, socket_path: Union[str, "os.PathLike[str]"]):
        self._native = NativeLocal(os.fspath(socket_path))

    def allocate(self, size: int) -> Region:
        """A region of ``size`` bytes (at most 16 GiB per connection in all)."""
        return Region(self._native.allocate(int(size)))

    def read_into(
        self,
        region: Region,
        path: str,
        offset: int = 0,
        length: Optional[int] = None,
        range: Optional[Range] = None,
    ) -> ReadInfo:
        """Read the object (or ``range``) into ``region`` at ``offset``, using at most ``length``
        bytes there (default: the rest of the region)."""
        (result,) = self.read_batch(region, [(path, offset, length, range)])
        if isinstance(result, BaseException):
            raise result
        return result

    def read_batch(
        self,
        region: Region,
        items: Sequence[Tuple[str, int, Optional[int], Optional[Range]]],
    ) -> List[Union[ReadInfo, HydrantError]]:
        """Several reads into one region in one request: items ``(path, offset, length,
        range)``; a :class:`ReadInfo` or the exception of each, in order."""
        native_items = []
        for path, offset, length, range in items:
            bucket, key = _split(path)
            start, end = _range(range)
            if offset < 0 or offset > len(region):
                raise UsageError(f"offset {offset} is outside the region's {len(region)} bytes")
            if length is None:
                length = len(region) - offset
            native_items.append((offset, length, bucket, key, start, end))
        results = self._native.read(region._native, native_items)
        return [result if isinstance(result, BaseException) else ReadInfo(*result) for result in results]

    def write_from(
        self,
        region: Region,
        path: str,
        offset: int = 0,
        length: Optional[int] = None,
        *,
        if_absent: bool = False,
        if_version: Optional[int] = None,
    ) -> ObjectInfo:
        """Store ``length`` bytes of ``region`` from ``offset`` (default: the rest of the
        region) as the object ``path``, by its bucket's write mode; the bytes do not cross the
        socket. ``if_absent``: only if no object has the key (else
        :class:`PreconditionFailed`, and nothing is written); ``if_version``: only if the
        version stored is this one. Returns once the object is durable (on NVMe, or at the
        origin for a write-through bucket). Leave those bytes unchanged until then: with
        bytes changed meanwhile this object (and no other) may fail its checksums when read,
        and be dropped by a restart after a crash."""
        bucket, key = _split(path)
        if offset < 0 or offset > len(region):
            raise UsageError(f"offset {offset} is outside the region's {len(region)} bytes")
        if length is None:
            length = len(region) - offset
        return ObjectInfo(*self._native.write(region._native, int(offset), int(length), bucket, key,
                                              bool(if_absent), if_version))

    def write(self, path: str, data: Any, *, if_absent: bool = False,
              if_version: Optional[int] = None) -> ObjectInfo:
        """Store ``data`` (bytes, any buffer, or a list or tuple of them, stored one after
        another) as the object ``path`` with no region: the server reads the bytes from this
        process's memory, where they lie, into its own buffers. Conditions and durability as
        :meth:`write_from`; leave the bytes unchanged until it returns. Raises
        :class:`Unsupported` where the kernel does not let the server read this process (a
        server of another user; Yama's ``ptrace_scope`` 2 or 3): use :meth:`write_from` then."""
        bucket, key = _split(path)
        parts, held, _ = _parts_of(data)
        try:
            return ObjectInfo(*self._native.write_memory(bucket, key, parts, bool(if_absent),
                                                         if_version))
        finally:
            held.clear()

    def free(self, region: Region) -> None:
        """Give the server's side of ``region`` back now (else when the connection closes)."""
        self._native.free(region._native)


class Completion(NamedTuple):
    """A read of a :class:`ReadRing`: what it did, the slot it is in, and its bytes (a ctypes
    array over the slot: ``numpy.frombuffer(done.data, dtype)`` wraps it without a copy). The
    bytes stay as they are until a later ``submit`` reuses the slot."""

    info: ReadInfo
    slot: int
    data: Any


class ReadRing:
    """Several same-host reads in flight: one connection, a shared region of ``slots`` slots of
    ``slot_bytes`` (at most 1,024 slots and 16 GiB), and the server's read rings in shared
    memory (no message on the socket per read); ``submit`` starts a read into a free slot,
    ``complete`` waits for the oldest. Keep up to ``slots`` reads submitted and the server works on the next while the
    caller uses the last::

        ring = hydrant.ReadRing("/run/hydrant.sock", slots=4, slot_bytes=64 << 20)
        for path in paths[:4]:
            ring.submit(path)
        while (done := ring.complete()) is not None:
            batch = torch.frombuffer(done.data, dtype=torch.uint8)   # no copy
            ...                                                       # use it before the slot is reused
            if more: ring.submit(next_path)
    """

    def __init__(self, socket_path: Union[str, "os.PathLike[str]"], slots: int = 4, slot_bytes: int = 64 << 20):
        self._native = NativeRing(os.fspath(socket_path), int(slots), int(slot_bytes))
        self._slots = self._native.slot_memory()

    @property
    def slots(self) -> int:
        return len(self._slots)

    def submit(self, path: str, range: Optional[Range] = None) -> None:
        """Start reading the object (or ``range``) into the next free slot; :class:`UsageError`
        when every slot holds a read not yet taken by ``complete``."""
        bucket, key = _split(path)
        start, end = _range(range)
        self._native.submit(bucket, key, start, end)

    def complete(self) -> Optional[Completion]:
        """The oldest submitted read, once done (waiting for it with the GIL released); ``None``
        when nothing is in flight. A read that failed raises its exception."""
        done = self._native.complete()
        if done is None:
            return None
        if isinstance(done, BaseException):
            raise done
        slot, info = done
        info = ReadInfo(*info)
        address, _ = self._slots[slot]
        data = (ctypes.c_char * info.written).from_address(address)
        data._hydrant_ring = self._native  # type: ignore[attr-defined]
        return Completion(info, slot, data)
