"""PyTorch datasets and checkpoints over hydrant.

- :class:`ShardDataset`: an ``IterableDataset`` of objects (shards), split across ranks and
  DataLoader workers so that every object is read exactly once per epoch across the job, in a
  deterministic per-epoch order (``set_epoch``), resumable mid-epoch with torchdata's
  ``StatefulDataLoader`` (``state_dict`` / ``load_state_dict``). Each worker tells the
  servers its order when its epoch starts (:meth:`hydrant.Client.plan`), so that they read
  ahead of it from the origin.
- :class:`MapDataset`: map-style access by index, whole objects or ranges.
- :func:`tar_samples`: WebDataset-style samples from a tar shard's bytes.
- :func:`save` / :func:`load`: ``torch.save`` / ``torch.load`` to and from an object.

Datasets hold a :class:`hydrant.Client` (made from ``HYDRANT_SERVER`` / ``HYDRANT_TOKEN`` when
none is given), which DataLoader workers may use after ``fork()`` or receive pickled.
"""

import io
import os
import random
import tarfile
import warnings
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.utils.data

from .. import PLAN_IDLE_SECONDS, PLAN_WINDOW_BYTES, Client, HydrantError, Range, UsageError

#: Bytes of the serialised object (beyond the tensors sent from where they lie) ``save`` keeps
#: in memory before spilling them to a temporary file.
SAVE_SPOOL_BYTES = 64 << 20

Item = Union[str, Tuple[str, Optional[Range]]]


def _rank_and_world() -> Tuple[int, int]:
    """This process's rank and the job's size: torch.distributed's when it is initialised, else
    ``RANK`` / ``WORLD_SIZE``, else 0 of 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _paths_of(source: Union[str, Sequence[str]], client: Client) -> List[str]:
    if isinstance(source, str):
        return [entry.path for entry in client.list(source)]
    return list(source)


class ShardDataset(torch.utils.data.IterableDataset):
    """Every object under ``source`` (a ``BUCKET/PREFIX`` listed once, here, or a sequence of
    paths), read once per epoch across all ranks and workers.

    The epoch's order is a permutation of the objects seeded by ``(seed, epoch)`` (the same on
    every rank; key order when ``shuffle`` is false); rank ``r`` of ``w`` takes every ``w``-th
    object of it from position ``r``, and its DataLoader worker ``k`` of ``n`` every ``n``-th of
    those from ``k``. Call :meth:`set_epoch` before each epoch, as with a
    ``DistributedSampler``. Items are the objects' bytes, or what ``transform(path, data)``
    returns.

    With ``plan`` (the default), each worker announces the rest of its order for the epoch
    when it starts iterating (:meth:`hydrant.Client.plan`): the servers read its objects ahead
    from the origin, at most ``plan_window_bytes`` beyond it, so that a cold epoch streams at
    the origin's bandwidth rather than one object's latency at a time. A server that cannot
    plan (an older one) is read from all the same, with a warning.
    """

    def __init__(
        self,
        source: Union[str, Sequence[str]],
        client: Optional[Client] = None,
        shuffle: bool = True,
        seed: int = 0,
        transform: Optional[Callable[[str, bytes], Any]] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        plan: bool = True,
        plan_window_bytes: int = PLAN_WINDOW_BYTES,
        plan_idle: float = PLAN_IDLE_SECONDS,
    ):
        super().__init__()
        self.client = client if client is not None else Client()
        self.paths = _paths_of(source, self.client)
        if not self.paths:
            raise UsageError(f"no objects in {source!r}")
        self.shuffle = shuffle
        self.seed = seed
        self.transform = transform
        self.rank = rank
        self.world_size = world_size
        self.plan = plan
        self.plan_window_bytes = plan_window_bytes
        self.plan_idle = plan_idle
        # Names this dataset's plans (one per rank and worker; the same across epochs, so that
        # an epoch's plan replaces the last one's), shared by the workers' copies.
        self._plan_nonce = random.getrandbits(32)
        self.epoch = 0
        # Objects of this epoch this worker has handed out (its share, in its order).
        self._consumed = 0
        self._resumed: Optional[Dict[str, int]] = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: Optional[int] = None) -> List[str]:
        """The job's order of the objects for ``epoch`` (this one by default)."""
        epoch = self.epoch if epoch is None else epoch
        order = list(self.paths)
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def _place(self) -> Tuple[int, int, int, int]:
        """(rank, world, worker, workers) of this copy of the dataset."""
        rank, world = _rank_and_world()
        rank = self.rank if self.rank is not None else rank
        world = self.world_size if self.world_size is not None else world
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank, world, worker, workers

    def _share(self) -> List[str]:
        rank, world, worker, workers = self._place()
        return self.order()[rank::world][worker::workers]

    def plan_id(self) -> int:
        """The id of this worker's plans (see :meth:`hydrant.Client.plan`)."""
        rank, _, worker, _ = self._place()
        return (self._plan_nonce << 32) | zlib.crc32(f"{rank}/{worker}".encode())

    def __iter__(self) -> Iterator[Any]:
        # The position is set now, not when the first item is asked for: a loader that
        # snapshots the state right after iter() must see this epoch's, not the last one's.
        share = self._share()
        start = 0
        if self._resumed is not None and self._resumed.get("epoch") == self.epoch:
            start = self._resumed["consumed"]
        self._resumed = None
        self._consumed = start
        if self.plan and share[start:]:
            try:
                self.client.plan(share[start:], self.plan_id(), self.plan_window_bytes,
                                 self.plan_idle)
            except HydrantError as error:
                warnings.warn(f"hydrant: the servers could not plan this epoch's reads: {error}")
        return self._items(share[start:])

    def _items(self, paths: List[str]) -> Iterator[Any]:
        for path in paths:
            data = self.client.get(path)
            self._consumed += 1
            yield self.transform(path, data) if self.transform is not None else data

    # torchdata's StatefulDataLoader snapshots each worker's copy of the dataset.
    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "consumed": self._consumed,
                "objects": len(self.paths)}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if state.get("seed") != self.seed or state.get("objects", len(self.paths)) != len(self.paths):
            raise UsageError(
                f"the state is of seed {state.get('seed')} over {state.get('objects')} objects; "
                f"this dataset's are {self.seed} and {len(self.paths)}: resuming would skip the wrong ones"
            )
        self.epoch = state["epoch"]
        self._resumed = dict(state)


class MapDataset(torch.utils.data.Dataset):
    """Objects by index: ``items`` are paths or ``(path, (start, end))`` ranges, or a
    ``BUCKET/PREFIX`` listed once. ``dataset[i]`` is the object's (or range's) bytes, or what
    ``transform(path, data)`` returns."""

    def __init__(
        self,
        items: Union[str, Sequence[Item]],
        client: Optional[Client] = None,
        transform: Optional[Callable[[str, bytes], Any]] = None,
    ):
        self.client = client if client is not None else Client()
        if isinstance(items, str):
            items = _paths_of(items, self.client)
        self.items: List[Tuple[str, Optional[Range]]] = [
            (item, None) if isinstance(item, str) else (item[0], item[1]) for item in items
        ]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        path, range = self.items[index]
        data = self.client.get(path, range=range)
        return self.transform(path, data) if self.transform is not None else data


def tar_samples(data: bytes) -> Iterator[Dict[str, Any]]:
    """The samples of a tar shard, WebDataset's way: files grouped by their name up to the first
    dot of the base name (``sample/0001.jpg`` and ``sample/0001.cls`` are one sample), each a
    dict of ``{"__key__": "sample/0001", "jpg": bytes, "cls": bytes}`` in the tar's order."""
    sample: Dict[str, Any] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive:
            if not member.isfile():
                continue
            directory, _, base = member.name.rpartition("/")
            stem, dot, extension = base.partition(".")
            if not dot:
                continue
            key = f"{directory}/{stem}" if directory else stem
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            sample["__key__"] = key
            file = archive.extractfile(member)
            sample[extension] = file.read() if file is not None else b""
    if sample:
        yield sample


def save(obj: Any, path: str, client: Optional[Client] = None, **torch_save_options: Any) -> None:
    """``torch.save(obj)`` into the object ``path``, in one PUT: the bytes of the CPU tensors
    in ``obj`` (its own, or in its dicts, lists and tuples, or a module's) sent from the tensors
    themselves, so ``obj`` must stay unchanged until this returns; the rest gathered in memory
    (``SAVE_SPOOL_BYTES``, then in a temporary file). Nothing is stored if it fails."""
    from ..fs import HydrantFileSystem
    from ._lending import Lender, tensors_in

    client = client if client is not None else Client()
    lender = Lender()
    for tensor in tensors_in(obj):
        lender.lend(tensor)
    fs = HydrantFileSystem(client=client, write_spool_bytes=SAVE_SPOOL_BYTES,
                           skip_instance_cache=True)
    with fs.open(path, "wb") as file:
        file._lender = lender
        torch.save(obj, file, **torch_save_options)


def load(path: str, client: Optional[Client] = None, **torch_load_options: Any) -> Any:
    """``torch.load`` of the object ``path``, read with ``get_into`` into one buffer of its
    size."""
    client = client if client is not None else Client()
    size = client.stat(path).size
    buffer = bytearray(size)
    read = client.get_into(path, buffer)
    if read != size:
        raise UsageError(f"{path} changed while it was read ({read} bytes of {size})")
    return torch.load(io.BytesIO(buffer), **torch_load_options)
