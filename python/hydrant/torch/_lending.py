"""Sending a save's tensors from where they lie: a lender for :class:`hydrant.fs.HydrantFile`
that knows which memory belongs to the tensors being saved."""

import bisect
import threading
import weakref
from typing import Any, Optional

import torch

from .. import _address

#: Objects :func:`tensors_in` looks at, at most: a bound on the walk of an object to be saved.
WALK_OBJECTS_MAX = 1_000_000


class Lender:
    """The CPU tensors of one save, by the address range of their storage. A write whose bytes
    lie within one of them (``torch.save`` writes a tensor's storage straight from its memory)
    is sent from there, the tensor kept alive by the file until its object is stored, instead
    of being copied; any other write is copied as before. Given to a
    :class:`hydrant.fs.HydrantFile` as its lender. It holds the tensors weakly: one that a
    planner made for the save and dropped is not kept alive by it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts = []  # sorted storage start addresses
        self._storages = {}  # start -> (end, weak reference to the tensor)

    def lend(self, data: Any) -> None:
        if not isinstance(data, torch.Tensor) or data.device.type != "cpu":
            return
        if data.layout != torch.strided:
            return  # sparse and other layouts: saved as torch.save does, by copy
        try:
            storage = data.untyped_storage()
            start, length = storage.data_ptr(), storage.nbytes()
            reference = weakref.ref(data)
        except (RuntimeError, NotImplementedError, TypeError):
            return  # a tensor without storage of its own (a subclass, a meta tensor)
        if start == 0 or length == 0:
            return
        with self._lock:
            if start not in self._storages:
                bisect.insort(self._starts, start)
            self._storages[start] = (start + length, reference)

    def __call__(self, view: memoryview) -> Optional[torch.Tensor]:
        try:
            address = _address(view)
        except (BufferError, TypeError):
            return None
        with self._lock:
            at = bisect.bisect_right(self._starts, address) - 1
            if at < 0:
                return None
            start = self._starts[at]
            end, reference = self._storages[start]
        tensor = reference()
        if tensor is None or address + view.nbytes > end:
            return None
        # Its memory is still where it was lent (a tensor gone, its address reused, is not).
        if tensor.untyped_storage().data_ptr() != start:
            return None
        return tensor


def tensors_in(obj: Any) -> "list[torch.Tensor]":
    """The tensors in ``obj``: itself, or the values of its dicts, lists and tuples, and a
    module's parameters and buffers (as far as ``WALK_OBJECTS_MAX`` objects; tensors elsewhere,
    such as in the attributes of other objects, are simply copied when saved)."""
    found = []
    seen = set()
    stack = [obj]
    while stack and len(seen) < WALK_OBJECTS_MAX:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, torch.nn.Module):
            # Not its state_dict(): that runs the module's hooks (collectives, for FSDP).
            stack.extend(item.parameters())
            stack.extend(item.buffers())
    return found
