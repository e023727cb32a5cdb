"""An fsspec filesystem over hydrant's native protocol: ``hydrant://BUCKET/KEY``.

Registered for the ``hydrant`` protocol through the ``fsspec.specs`` entry point, so that
pandas, PyArrow, Hugging Face datasets, Zarr and anything else that opens fsspec URLs reads and
writes hydrant unchanged::

    import fsspec
    fs = fsspec.filesystem("hydrant", servers="127.0.0.1:7700")
    with fs.open("hydrant://datasets/train/part-0.parquet") as file: ...
    pandas.read_parquet("hydrant://datasets/train/part-0.parquet")

Storage options are those of :class:`hydrant.Client` (``servers``, ``token``, ``timeout``, ...;
``HYDRANT_SERVER`` and ``HYDRANT_TOKEN`` when not given). Directories are the prefixes before a
``/`` in keys, as in any object store: they exist while a key is under them, and making one
does nothing.
"""

import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from . import Client, NotFound, UsageError
from . import errors as hydrant_errors

#: Bytes a file opened for reading fetches at once (its read-ahead block).
READ_BLOCK_BYTES = 4 << 20
#: Bytes ``get_file`` reads at a time into its buffer.
COPY_BLOCK_BYTES = 8 << 20
#: Bytes a file opened for writing keeps in memory before spilling to a temporary file, by
#: default (the ``write_spool_bytes`` storage option).
WRITE_SPOOL_BYTES = 16 << 20


class HydrantFileSystem(AbstractFileSystem):
    """hydrant as an fsspec filesystem (see the module's documentation)."""

    protocol = "hydrant"
    root_marker = ""
    # One client per set of storage options, as fsspec caches instances.
    cachable = True

    def __init__(self, servers=None, token=None, timeout=None, client: Optional[Client] = None,
                 write_spool_bytes: int = WRITE_SPOOL_BYTES, **settings: Any):
        super().__init__(servers=servers, token=token, timeout=timeout,
                         write_spool_bytes=write_spool_bytes, **settings)
        self.client = client if client is not None else Client(servers, token, timeout, **settings)
        self.write_spool_bytes = write_spool_bytes

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(item) for item in path]
        path = str(path)
        if path.startswith("hydrant://"):
            path = path[len("hydrant://"):]
        return path.strip("/")

    # ----- listing -----

    def _entries(self, path: str) -> List[Dict[str, Any]]:
        """The files and directories right under ``path`` (a bucket or a prefix in one)."""
        bucket, _, prefix = path.partition("/")
        if not bucket:
            raise UsageError("hydrant lists within a bucket: name one (hydrant://BUCKET/...)")
        if prefix:
            prefix += "/"
        files: List[Dict[str, Any]] = []
        directories: Dict[str, Dict[str, Any]] = {}
        for entry in self.client.list(f"{bucket}/{prefix}" if prefix else bucket):
            rest = entry.path[len(bucket) + 1 + len(prefix):]
            head, slash, _ = rest.partition("/")
            if slash:
                name = f"{bucket}/{prefix}{head}"
                directories.setdefault(name, {"name": name, "size": 0, "type": "directory"})
            else:
                files.append(self._file_entry(entry.path, entry.size, entry.version, entry.dirty))
        return sorted(files + list(directories.values()), key=lambda entry: entry["name"])

    @staticmethod
    def _file_entry(name: str, size: int, version: int, dirty: bool) -> Dict[str, Any]:
        return {"name": name, "size": size, "type": "file", "version": version, "dirty": dirty}

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        entries = self._entries(path)
        if not entries:
            info = self.info(path)
            if info["type"] == "file":
                entries = [info]
        return entries if detail else [entry["name"] for entry in entries]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        bucket, _, key = path.partition("/")
        if key:
            try:
                stat = self.client.stat(path)
                return self._file_entry(path, stat.size, stat.version, stat.dirty)
            except NotFound:
                pass
        if bucket and next(iter(self.client.list(f"{path}/", page_size=1)), None) is not None:
            return {"name": path, "size": 0, "type": "directory"}
        if bucket and not key:
            # A bucket is always there (every valid name is one), empty or not.
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    # ----- reading -----

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.get(path)
        size = None
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.client.stat(path).size
        start = 0 if start is None else (max(0, size + start) if start < 0 else start)
        if end is not None and end < 0:
            end = max(0, size + end)
        if end is not None and end <= start:
            return b""
        if size is None:
            size = self.client.stat(path).size if start > 0 else None
        if size is not None and start >= size:
            return b""
        if size is not None and end is not None:
            end = min(end, size)
        return self.client.get(path, range=(start, end))

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        if not (len(paths) == len(starts) == len(ends)):
            raise ValueError("paths, starts and ends must have the same length")
        # Each item's outcome: resolved here (errors, empty or negative ranges) or by one
        # BATCH_GET of the rest, whose results come back in order.
        outcomes: List[Any] = []
        batched = []
        for path, start, end in zip(paths, starts, ends):
            try:
                path = self._strip_protocol(path)
                if (start is not None and start < 0) or (end is not None and end < 0):
                    outcomes.append(self.cat_file(path, start, end))
                elif end is not None and end <= (start or 0):
                    outcomes.append(b"")
                else:
                    outcomes.append(None)
                    batched.append((len(outcomes) - 1, path, (start or 0, end)))
            except Exception as error:
                outcomes.append(error)
        if batched:
            results = self.client.batch_get([(path, range) for _, path, range in batched], ordered=True)
            for (index, path, (start, _)), (_, value) in zip(batched, results):
                if isinstance(value, hydrant_errors.InvalidRange) and start >= self.info(path)["size"]:
                    value = b""  # as cat_file answers a range past the end
                outcomes[index] = value
        for outcome in outcomes:
            if isinstance(outcome, Exception) and on_error != "return":
                raise outcome
        return outcomes

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            return
        try:
            size = self.client.stat(rpath).size
        except NotFound:
            if self.isdir(rpath):
                # A directory of keys: its local counterpart is a folder.
                os.makedirs(lpath, exist_ok=True)
                return
            raise
        if outfile is None and os.path.dirname(lpath):
            os.makedirs(os.path.dirname(lpath), exist_ok=True)
        buffer = bytearray(min(COPY_BLOCK_BYTES, max(size, 1)))
        view = memoryview(buffer)
        target = outfile if outfile is not None else open(lpath, "wb")
        try:
            position = 0
            while position < size:
                end = min(size, position + len(buffer))
                read = self.client.get_into(rpath, buffer, range=(position, end))
                if read == 0:
                    raise IOError(f"{rpath} ended at {position} bytes of {size}: it changed while copied")
                target.write(view[:read])
                position += read
                if callback is not None:
                    callback.relative_update(read)
        finally:
            if outfile is None:
                target.close()

    # ----- writing -----

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if mode == "create" and self.exists(path):
            raise FileExistsError(path)
        if self._intrans:
            # Within a transaction the write waits for its commit, as an opened file does.
            with self.open(path, "wb") as file:
                file.write(value)
            return
        self.client.put(self._strip_protocol(path), value)
        self.invalidate_cache(path)

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        if os.path.isdir(lpath):
            return  # directories are prefixes: nothing to make
        if self._intrans:
            with open(lpath, "rb") as source, self.open(rpath, "wb") as file:
                shutil.copyfileobj(source, file, GATHER_BYTES)
            return
        self.client.put(self._strip_protocol(rpath), lpath)
        self.invalidate_cache(rpath)

    def touch(self, path, truncate=True, **kwargs):
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")

    def rm_file(self, path):
        self.client.delete(self._strip_protocol(path))
        self.invalidate_cache(path)

    def _rm(self, path):
        if self.isfile(path):
            self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for name in reversed(paths):
            if self.isfile(name):
                self.rm_file(name)

    def mkdir(self, path, create_parents=True, **kwargs):
        pass  # directories are prefixes of keys

    def makedirs(self, path, exist_ok=False):
        pass

    def rmdir(self, path):
        pass

    def cp_file(self, path1, path2, **kwargs):
        self.client.put(self._strip_protocol(path2), self.client.get(self._strip_protocol(path1)))
        self.invalidate_cache(path2)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if "a" in mode:
            raise NotImplementedError("hydrant objects are written whole: appending is not supported")
        if "x" in mode and self.exists(path):
            raise FileExistsError(path)
        return HydrantFile(self, path, mode=mode, block_size=block_size or READ_BLOCK_BYTES,
                           autocommit=autocommit, cache_options=cache_options, **kwargs)


#: Writes smaller than this are joined into blocks of this size before the PUT sends them.
GATHER_BYTES = 1 << 20


class HydrantFile(AbstractBufferedFile):
    """A file of :class:`HydrantFileSystem`: reads fetch ranges (a read-ahead block at a
    time); writes gather in memory as they come (a large ``bytes`` kept as it is, other large
    writes copied once, small ones joined into blocks of ``GATHER_BYTES``) up to the file
    system's ``write_spool_bytes``, beyond which they go on in a temporary file, and become one
    PUT on close: from where the gathered blocks lie, or streamed from the temporary file. A
    ``with`` block left by an exception stores nothing. Within the file system's
    ``transaction`` (``autocommit=False``) the PUT waits for the transaction's commit, and a
    transaction left by an exception stores none of its files."""

    def _fetch_range(self, start, end):
        if start >= end:
            return b""
        return self.fs.client.get(self.path, range=(start, end))

    def write(self, data):
        if not self.writable():
            raise ValueError("File not in write mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.forced:
            raise ValueError("This file has been force-flushed, can only close")
        if self.offset is None:
            self.offset = 0
            self._initiate_upload()
        if isinstance(data, bytes):
            whole, view = data, memoryview(data)
        else:
            view = memoryview(data)
            whole = None if view.c_contiguous else view.tobytes()
            if whole is not None:
                view = memoryview(whole)
        size = view.nbytes
        owner = None
        if self._lender is not None and self._spill is None and size >= GATHER_BYTES:
            owner = self._lender(view)
        if owner is not None:
            # Bytes that lie in memory whose owner keeps them unchanged until this file is
            # stored: sent from there, not copied, and not counted against the spool.
            if self._small:
                self._parts.append(bytes(self._small))
                self._small.clear()
            self._parts.append(view)
            self._kept.append(owner)
            self.loc += size
            return size
        if self._spill is None and self._held + size > self.fs.write_spool_bytes:
            self._spill_to_file()
        if self._spill is not None:
            self._spill.write(view)
        elif size < GATHER_BYTES:
            self._small += view.cast("B") if view.ndim != 1 or view.format != "B" else view
            if len(self._small) >= GATHER_BYTES:
                self._parts.append(bytes(self._small))
                self._small.clear()
        else:
            if self._small:
                self._parts.append(bytes(self._small))
                self._small.clear()
            self._parts.append(whole if whole is not None else view.tobytes())
        self._held += size
        self.loc += size
        return size

    def _spill_to_file(self):
        spill = tempfile.TemporaryFile()
        try:
            for part in self._parts:
                spill.write(part)
            spill.write(self._small)
        except BaseException:
            spill.close()
            raise
        self._spill = spill
        self._parts = []
        self._small = bytearray()

    #: Set by a writer that knows which memory stays unchanged until the file is stored (the
    #: DCP writer's tensors): called with a large write's buffer, it returns the object that
    #: owns those bytes, to keep alive until the PUT ends, or None when the bytes must be copied.
    _lender = None

    def _initiate_upload(self):
        self._parts = []
        self._small = bytearray()
        self._held = 0
        self._spill = None
        self._kept = []

    def _release(self):
        self._parts = []
        self._small = bytearray()
        self._kept = []
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def _upload_chunk(self, final=False):
        # Writes never reach fsspec's buffer (see write), so there is nothing to send before the
        # end; at the end, one PUT of everything, and the memory is let go whatever its outcome.
        if not final:
            return False
        if not self.autocommit:
            self._pending = True  # held until the transaction commits (or discards) the file
            return True
        self._store()
        return True

    def commit(self):
        """Store what was written: a closed file of a transaction, once, unless discarded."""
        if getattr(self, "_pending", False):
            self._pending = False
            self._store()

    def _store(self):
        try:
            if self._spill is not None:
                self._spill.seek(0)
                self.fs.client.put(self.path, self._spill)
            else:
                if self._small:
                    self._parts.append(bytes(self._small))
                    self._small = bytearray()
                self.fs.client.put(self.path, self._parts)
        finally:
            self._release()
        self.fs.invalidate_cache(self.path)

    def discard(self):
        """Drop what was written, storing nothing."""
        self._pending = False
        if self.writable() and self.offset is not None:
            self._release()
        self.forced = True
        self.closed = True

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is not None and self.writable() and not self.closed:
            self.discard()
        else:
            self.close()
