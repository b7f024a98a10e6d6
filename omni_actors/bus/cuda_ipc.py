"""CUDA tensors between stages on one GPU: IPC handles as msgspec descriptors, no host copy.

A producer shares a tensor's CUDA allocation (`share`), keeps the tensor alive
under a lease, and sends a `CudaIpcRef` (the fields torch's own
multiprocessing reduction carries, without pickle). The consumer maps the
allocation (`open`) and gets a tensor on the same memory; when it is done it
releases the lease like any other (Release -> FreeLeases), and the producer
drops its reference (`CudaLeases.free`). torch also counts the consumer's
mapping itself (the ref-counter handle), so the caching allocator never reuses
a block another process still maps.

Only for peers on the same device (the launcher decides; workers/spec.py
`cuda_ipc`); torch is imported only when a CUDA tensor is seen.
"""

from __future__ import annotations

from typing import Any

from omni_actors.bus.messages import CudaIpcRef


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
