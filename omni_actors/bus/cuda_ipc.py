"""CUDA tensors between stages on one GPU: IPC handles as msgspec descriptors, no host copy.

Two paths, both under a lease that the producer holds (`CudaLeases`: the tensor
stays alive, so its memory is not reused) until the consumer gives it back.

Allocation handles (the fast path, `CudaExporter` / `CudaImporter`). The
producer sends the IPC handle of the allocation (caching-allocator segment)
that holds the tensor with the allocation's never-reused id, the tensor's byte offset in it, and an IPC event from a
small ring, recorded on its stream after the tensor was written. A handle
names an allocation for as long as it lives, and the caching allocator reuses
its blocks, so handles repeat: the consumer maps each allocation once
(`cuIpcOpenMemHandle`, the expensive call) and each event once, keeps them
(at most MAPPINGS_MAX unused mappings, none unused past MAPPING_IDLE_S), and per handoff only makes its stream
wait on the event and wraps the memory as a tensor. A tensor made this way
gives its lease back when it ends (not when the message is read): the consumer
synchronizes its stream, so its own reads are done, and the lease leaves with
the next Release (`cuda_released`). The orchestrator still frees every lease of a
request that ends, so a consumer that keeps such a tensor past its request must
clone it (torch's path pinned the block instead). A producer that frees an allocation which a
consumer still maps leaves that memory to the consumer's mapping until it is
unmapped (evicted, idle, or the consumer exits); a new allocation has a new
handle, so a stale mapping is never read.

torch's reduction (`share` / `open_tensor`, the fallback when the driver path
is unavailable: expandable segments, a cudaMallocAsync allocator; and for
empty tensors): torch's per-storage handle, event and ref counter; the
consumer opens and closes the mapping per handoff, and the lease goes back as
soon as the message is read (torch's ref counter keeps the block meanwhile).

Only for peers on the same device (the launcher decides; workers/spec.py
`cuda_ipc`); torch is imported only when a CUDA tensor is seen.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict, deque
from typing import Any

from omni_actors import logs
from omni_actors.bus.cuda_driver import CudaDriverError, driver
from omni_actors.bus.messages import CudaIpcRef, CudaSegmentRef, LeaseId

log = logs.get(__name__)

EVENT_RING = 32
"""IPC events a producer records in turn (one per handoff); a consumer opens each once."""
MAPPINGS_MAX = 16
"""Allocations a consumer keeps mapped while no tensor of its uses them (least recently used go first)."""
MAPPING_IDLE_S = 30.0
"""An allocation no tensor has used for this long is unmapped (its producer may have freed it)."""
EVENTS_MAX = 1024
"""Opened producer events a consumer keeps."""
HANDLES_MAX = 1024
"""Allocation handles a producer remembers (by allocation id)."""

_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8", 16: "<c16"}
"""A tensor is wrapped as integers of its element size, then viewed as its dtype (any dtype fits)."""


# ---- the fast path: allocation handles ---------------------------------------------


class CudaExporter:
    """The producer's side: a tensor's allocation handle and offset, and an event after its writes."""

    def __init__(self) -> None:
        self._ring: dict[int, list[tuple[Any, bytes]]] = {}
        self._recorded: dict[int, int] = {}
        self._handles: dict[int, bytes] = {}
        """IPC handles by allocation id (an id is never reused, so neither is a stale handle)."""
        self.unavailable: str | None = None
        """Why the fast path is off in this process (the first driver failure), or None."""

    def share(self, tensor: Any) -> CudaSegmentRef | None:
        """The descriptor of a CUDA tensor; None when this path cannot carry it (use `share`)."""
        dtype = str(tensor.dtype).removeprefix("torch.")
        if self.unavailable is not None or tensor.element_size() not in _TYPESTR or tensor.numel() == 0:
            return None
        torch = sys.modules["torch"]
        ptr = tensor.data_ptr()
        device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
        try:
            d = driver()
            with torch.cuda.device(device):
                base, size = d.allocation(ptr)
                buffer = d.buffer_id(ptr)
                handle = self._handles.get(buffer)
                if handle is None:
                    if len(self._handles) >= HANDLES_MAX:
                        self._handles.clear()
                    handle = self._handles[buffer] = d.ipc_handle(base)
        except CudaDriverError as err:
            self.unavailable = str(err)
            log.warning("cuda_ipc.segment_path_off", error=self.unavailable)
            return None
        stride = tuple(int(s) for s in tensor.stride())
        last = sum((n - 1) * st for n, st in zip(tensor.shape, stride, strict=True))
        end = ptr - base + (last + 1) * tensor.element_size()
        if end > size:  # (not one allocation: never seen from the caching allocator, but never send it)
            return None
        return CudaSegmentRef(device=device, handle=handle, buffer=buffer, offset=ptr - base, stride=stride,
                              dtype=dtype, event=self._record(device))

    def _record(self, device: int) -> bytes:
        """Record the ring's next event on the device's current stream; its IPC handle."""
        torch = sys.modules["torch"]
        ring = self._ring.setdefault(device, [])
        n = self._recorded.get(device, 0)
        self._recorded[device] = n + 1
        i = n % EVENT_RING
        if i == len(ring):
            ring.append((torch.cuda.Event(enable_timing=False, blocking=False, interprocess=True), b""))
        event, handle = ring[i]
        event.record(torch.cuda.current_stream(device))
        if not handle:  # (readable once the event has been recorded; the same ever after)
            handle = bytes(event.ipc_handle())
            ring[i] = (event, handle)
        return handle


class _Mapping:
    __slots__ = ("base", "device", "live", "used")

    def __init__(self, base: int, device: int) -> None:
        self.base, self.device, self.live = base, device, 0
        self.used = time.monotonic()


class _View:
    """What a consumer tensor wraps (__cuda_array_interface__); its end gives the lease back."""

    __slots__ = ("__cuda_array_interface__", "_importer", "_lease", "_mapping")

    def __init__(self, importer: CudaImporter, mapping: _Mapping, lease: LeaseId | None, cai: dict[str, Any]) -> None:
        self.__cuda_array_interface__ = cai
        self._importer, self._mapping, self._lease = importer, mapping, lease
        mapping.live += 1

    def __del__(self) -> None:
        self._mapping.live -= 1
        self._mapping.used = time.monotonic()
        if self._lease is not None:
            self._importer.done.append((self._lease, self._mapping.device))


class CudaImporter:
    """The consumer's side: allocations mapped once, events opened once; tensors on that memory."""

    def __init__(self) -> None:
        self._maps: OrderedDict[tuple[bytes, int], _Mapping] = OrderedDict()
        """By (handle, allocation id), least recently used first."""
        self._events: OrderedDict[bytes, Any] = OrderedDict()
        self.done: deque[tuple[LeaseId, int]] = deque()
        """Leases whose tensors have ended, with their device (appended by _View.__del__)."""
        self.opens = 0
        self.reuses = 0

    def open(self, ref: CudaSegmentRef, shape: tuple[int, ...], lease: LeaseId | None) -> Any:
        import torch

        key = (ref.handle, ref.buffer)
        mapping = self._maps.pop(key, None)
        if mapping is None:
            mapping = _Mapping(self._map(ref), ref.device)
            self.opens += 1
        else:
            self.reuses += 1
        mapping.used = time.monotonic()
        self._maps[key] = mapping  # most recently used last
        self._evict()
        stream = torch.cuda.current_stream(ref.device)
        stream.wait_event(self._event(ref))
        dtype = getattr(torch, ref.dtype)
        item = dtype.itemsize
        cai = {"shape": tuple(shape), "typestr": _TYPESTR[item], "data": (mapping.base + ref.offset, False),
               "strides": tuple(s * item for s in ref.stride), "version": 2}
        tensor = torch.as_tensor(_View(self, mapping, lease, cai), device=torch.device("cuda", ref.device))
        return tensor if tensor.dtype == dtype else tensor.view(dtype)

    def _map(self, ref: CudaSegmentRef) -> int:
        import torch

        torch.cuda.init()  # (the driver too: cuInit)
        d = driver()
        with torch.cuda.device(ref.device):
            if not d.has_context():
                torch.cuda.synchronize(ref.device)  # (makes the device's primary context current here)
            try:
                return d.open(ref.handle)
            except CudaDriverError:
                # The same handle bytes still mapped for a gone allocation (were they ever reused):
                # unmap that one if nothing uses it, and try once more.
                stale = [k for k, mp in self._maps.items() if k[0] == ref.handle and mp.live == 0]
                if not stale:
                    raise
                for k in stale:
                    self._close(self._maps.pop(k))
                return d.open(ref.handle)

    def _event(self, ref: CudaSegmentRef) -> Any:
        import torch

        event = self._events.pop(ref.event, None)
        if event is None:
            event = torch.cuda.Event.from_ipc_handle(ref.device, ref.event)
            while len(self._events) >= EVENTS_MAX:
                self._events.popitem(last=False)
        self._events[ref.event] = event
        return event

    def _evict(self) -> None:
        unused = [h for h, mp in self._maps.items() if mp.live == 0]
        for handle in unused[: max(0, len(unused) - MAPPINGS_MAX)]:
            self._close(self._maps.pop(handle))

    def trim(self, now: float | None = None) -> int:
        """Unmap allocations unused for MAPPING_IDLE_S; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [h for h, mp in self._maps.items() if mp.live == 0 and now - mp.used >= MAPPING_IDLE_S]
        for handle in idle:
            self._close(self._maps.pop(handle))
        return len(idle)

    def next_trim_s(self, now: float | None = None) -> float | None:
        """Seconds until `trim` has something to do; None while every mapping is in use (or none)."""
        unused = [mp.used for mp in self._maps.values() if mp.live == 0]
        if not unused:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(unused) + MAPPING_IDLE_S - now)

    def _close(self, mapping: _Mapping) -> None:
        import torch

        torch.cuda.current_stream(mapping.device).synchronize()  # no read of it may still be queued
        try:
            driver().close(mapping.base)
        except CudaDriverError as err:
            log.warning("cuda_ipc.close_failed", error=str(err))

    def released(self) -> list[LeaseId]:
        """Leases of tensors that have ended, once this process's work on them is done."""
        n = len(self.done)
        if not n:
            return []
        import torch

        items = [self.done.popleft() for _ in range(n)]
        for device in {dev for _, dev in items}:
            torch.cuda.current_stream(device).synchronize()  # its reads of the producer's memory are done
        return [lease for lease, _ in items]

    @property
    def mapped(self) -> int:
        return len(self._maps)

    def close(self) -> None:
        """Unmap every allocation no tensor uses any more (the rest go with the process)."""
        for handle in [h for h, mp in self._maps.items() if mp.live == 0]:
            self._close(self._maps.pop(handle))
        self._events.clear()


# ---- the fallback: torch's reduction -------------------------------------------------


def share(tensor: Any) -> CudaIpcRef:
    """The IPC descriptor of a CUDA tensor (its allocation stays the producer's)."""
    storage = tensor.untyped_storage()
    (device, handle, size, offset, rc_handle, rc_offset, event, sync) = storage._share_cuda_()
    return CudaIpcRef(
        device=int(device), handle=bytes(handle), storage_size=int(size), storage_offset=int(offset),
        ref_counter_handle=bytes(rc_handle), ref_counter_offset=int(rc_offset),
        event_handle=bytes(event) if event else None, event_sync=bool(sync),
        tensor_offset=int(tensor.storage_offset()), stride=tuple(int(s) for s in tensor.stride()),
        dtype=str(tensor.dtype).removeprefix("torch."),
    )


def open_tensor(ref: CudaIpcRef, shape: tuple[int, ...]) -> Any:
    """A tensor on the producer's CUDA memory (no copy)."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(shape), ref.stride, ref.tensor_offset, torch.UntypedStorage,
        getattr(torch, ref.dtype), ref.device, ref.handle, ref.storage_size, ref.storage_offset,
        False, ref.ref_counter_handle, ref.ref_counter_offset, ref.event_handle, ref.event_sync,
    )


class CudaLeases:
    """A producer's shared CUDA tensors, each held until its lease is freed.

    Leases are negative numbers, so they never meet the shared-memory arena's (positive) ones
    under the same producer name.
    """

    def __init__(self) -> None:
        self._held: dict[int, Any] = {}
        self._next = -1

    def hold(self, tensor: Any) -> int:
        lease = self._next
        self._next -= 1
        self._held[lease] = tensor
        return lease

    def free(self, leases: list[int]) -> None:
        for lease in leases:
            self._held.pop(lease, None)

    @property
    def leased(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._held.clear()
