"""``torch.distributed.checkpoint`` (DCP) on hydrant: a checkpoint is a "directory" of objects,
one per rank and item as DCP plans them, and a ``.metadata`` object written last.

    import torch.distributed.checkpoint as dcp
    from hydrant.torch.dcp import StorageWriter, StorageReader, wait_uploaded

    dcp.save(state_dict, storage_writer=StorageWriter("hydrant://ckpt/run-7/step-1200"))
    dcp.load(state_dict, storage_reader=StorageReader("hydrant://ckpt/run-7/step-1200"))
    wait_uploaded("hydrant://ckpt/run-7/step-1200")      # at the origin (write-back buckets)

Built on DCP's fsspec writer and reader over :class:`hydrant.fs.HydrantFileSystem` (storage
options, e.g. ``servers=``, are passed through). ``dcp.save`` returns once every object is
durable on the node's NVMe. A CPU tensor's bytes are sent to the server from the tensor itself,
not copied first: the save reads them while it runs, so the state dict must not change until
``dcp.save`` returns (as with any synchronous save). The checkpoint is committed by its ``.metadata``: DCP writes it
after every rank's data, under a temporary name, and renames it, which on hydrant is one PUT of
the finished bytes; a checkpoint without it (a writer killed part-way) cannot be loaded, and the
ones before it are untouched.
"""

import contextlib
import os
from typing import Any, Dict, Optional, Union

from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter

from .. import Client
from ..fs import HydrantFile, HydrantFileSystem
from ._lending import Lender

#: Bytes of one checkpoint object the writer keeps in memory (beyond them it spills to a
#: temporary file): DCP writes an object of unknown size, and hydrant's PUT wants the size first.
WRITE_SPOOL_BYTES = 1 << 30


def _url(checkpoint_id: Union[str, "os.PathLike[str]"]) -> str:
    path = os.fspath(checkpoint_id)
    return path if path.startswith("hydrant://") else f"hydrant://{path}"


class _LendingPlanner:
    """DCP's save planner, telling the lender of every tensor it resolves for writing."""

    def __init__(self, planner: Any, lender: Lender):
        self._planner = planner
        self._lender = lender

    def resolve_data(self, write_item: Any) -> Any:
        data = self._planner.resolve_data(write_item)
        self._lender.lend(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


class _Options:
    """DCP's fsspec file system, keeping the storage options the writer or reader was made
    with when DCP points it at another checkpoint (``dcp.save(..., checkpoint_id=...)`` resets
    the writer, which makes a new file system of the URL alone)."""

    def __init__(self, fs: Any, options: Dict[str, Any]):
        self._fs = fs
        self._options = options

    def init_path(self, path: Any, **kwargs: Any) -> Any:
        return self._fs.init_path(_url(path), **{**self._options, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


class _LendingStreams(_Options):
    """DCP's file system, whose streams opened for writing take the current save's lender."""

    def __init__(self, fs: Any, options: Dict[str, Any]):
        super().__init__(fs, options)
        self.lender: Optional[Lender] = None

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str):
        with self._fs.create_stream(path, mode) as stream:
            if "w" in mode and isinstance(stream, HydrantFile):
                stream._lender = self.lender
            yield stream


class StorageWriter(FsspecWriter):
    """DCP's storage writer for a checkpoint at ``hydrant://BUCKET/PREFIX`` (``thread_count``
    objects written at once per rank; other keyword arguments are the client's settings). Each
    object goes to the server in one streamed PUT when DCP closes it: a CPU tensor's bytes from
    the tensor itself, the rest (headers, non-tensor items, tensors DCP had to copy) gathered in
    memory up to ``write_spool_bytes`` (1 GiB by default; beyond, in a temporary file)."""

    def __init__(self, checkpoint_id: Union[str, "os.PathLike[str]"], thread_count: int = 4,
                 single_file_per_rank: bool = True, **storage_options: Any):
        storage_options.setdefault("write_spool_bytes", WRITE_SPOOL_BYTES)
        super().__init__(_url(checkpoint_id), single_file_per_rank=single_file_per_rank,
                         sync_files=False, thread_count=thread_count, **storage_options)
        self.fs = _LendingStreams(self.fs, storage_options)

    def write_data(self, plan: Any, planner: Any) -> Any:
        lender = Lender()
        self.fs.lender = lender
        try:
            # Returns once every object of the plan is stored (the writer's threads joined).
            return super().write_data(plan, _LendingPlanner(planner, lender))
        finally:
            self.fs.lender = None


class StorageReader(FsspecReader):
    """DCP's storage reader for a checkpoint at ``hydrant://BUCKET/PREFIX``."""

    def __init__(self, checkpoint_id: Union[str, "os.PathLike[str]"], **storage_options: Any):
        super().__init__(_url(checkpoint_id), **storage_options)
        self.fs = _Options(self.fs, storage_options)


def wait_uploaded(checkpoint_id: Union[str, "os.PathLike[str]"], client: Optional[Client] = None,
                  timeout: float = 3600.0) -> None:
    """Return once every object of the checkpoint is at the origin (a write-back bucket's
    FLUSH), at most ``timeout`` seconds."""
    client = client if client is not None else Client()
    client.flush(HydrantFileSystem._strip_protocol(_url(checkpoint_id)), timeout=timeout)
