"""Payload codec: flat dicts of plain values and arrays <-> `Payload` with ArrayRefs.

Arrays at or under INLINE_MAX_BYTES travel inside the message; larger ones
are written once into the producer's arena and travel as a lease. Torch
tensors keep their type across the boundary ("torch:" dtype prefix; bfloat16
travels as its raw 16-bit pattern). torch is imported only when one is seen.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from omni_actors.bus.messages import ArrayRef, LeaseId, Payload
from omni_actors.bus.shm import Arena, SegmentCache

INLINE_MAX_BYTES = 64 * 1024
"""Arrays up to this size are sent inside the message instead of shared memory."""

_TORCH = "torch:"
NESTED_KEY = "__omni_array__"
"""Placeholder key for an array that was nested inside a list or dict."""


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _torch_to_numpy(value: Any) -> tuple[np.ndarray, str]:
    torch = sys.modules["torch"]
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), _TORCH + "bfloat16"
    arr = t.numpy()
    return arr, _TORCH + arr.dtype.str


def _numpy_to_torch(arr: np.ndarray, dtype: str) -> Any:
    import torch

    if dtype == _TORCH + "bfloat16":
        return torch.from_numpy(arr).view(torch.bfloat16)
    return torch.from_numpy(arr)


class PayloadCodec:
    """Encodes with one producer's arena; decodes through one segment cache."""

    def __init__(self, producer: str, arena: Arena | None, segments: SegmentCache) -> None:
        self.producer = producer
        self.arena = arena
        self.segments = segments

    def encode(self, values: dict[str, Any]) -> Payload:
        """Split values into plain data and arrays; arrays nested in lists/dicts are hoisted."""
        data: dict[str, Any] = {}
        arrays: dict[str, ArrayRef] = {}
        for key, value in values.items():
            if isinstance(value, np.ndarray) or _is_torch(value):
                arrays[key] = self._encode_any_array(value)
            elif isinstance(value, (list, dict)):
                data[key] = self._hoist(value, arrays, "/" + key)
            elif isinstance(value, np.generic):
                data[key] = value.item()
            else:
                data[key] = value
        return Payload(data=data, arrays=arrays)

    def _encode_any_array(self, value: Any) -> ArrayRef:
        if isinstance(value, np.ndarray):
            return self._encode_array(np.ascontiguousarray(value), value.dtype.str)
        arr, dtype = _torch_to_numpy(value)
        return self._encode_array(arr, dtype)

    def _hoist(self, value: Any, arrays: dict[str, ArrayRef], path: str) -> Any:
        """Replace arrays inside nested lists/dicts by {NESTED_KEY: path}, storing them under path."""
        if isinstance(value, np.ndarray) or _is_torch(value):
            arrays[path] = self._encode_any_array(value)
            return {NESTED_KEY: path}
        if isinstance(value, dict):
            return {k: self._hoist(v, arrays, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self._hoist(v, arrays, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, np.generic):
            return value.item()
        return value

    def _encode_array(self, arr: np.ndarray, dtype: str) -> ArrayRef:
        shape = tuple(arr.shape)
        if arr.nbytes <= INLINE_MAX_BYTES or self.arena is None:
            return ArrayRef(dtype=dtype, shape=shape, inline=arr.tobytes())
        segment, offset, lease = self.arena.put(arr)
        return ArrayRef(
            dtype=dtype, shape=shape, segment=segment, offset=offset,
            nbytes=arr.nbytes, lease=lease, producer=self.producer,
        )

    def decode(self, payload: Payload, copy: bool = False) -> dict[str, Any]:
        """Plain values plus arrays; with `copy=False` shared-memory arrays are read-only views."""
        out = dict(payload.data)
        nested: dict[str, Any] = {}
        for key, ref in payload.arrays.items():
            if key.startswith("/"):  # hoisted from inside a list or dict
                nested[key] = self.decode_array(ref, copy)
            else:
                out[key] = self.decode_array(ref, copy)
        if nested:
            for key, value in out.items():
                if isinstance(value, (list, dict)):
                    out[key] = _restore(value, nested)
        return out

    def decode_array(self, ref: ArrayRef, copy: bool = False) -> Any:
        if ref.dtype == _TORCH + "bfloat16":
            np_dtype = np.dtype(np.int16)
        else:
            np_dtype = np.dtype(ref.dtype.removeprefix(_TORCH))
        if ref.inline is not None:
            arr = np.frombuffer(ref.inline, dtype=np_dtype).reshape(ref.shape)
            if copy or ref.dtype.startswith(_TORCH):
                arr = arr.copy()
        else:
            view = self.segments.view(ref.segment, ref.offset, ref.nbytes)
            arr = np.frombuffer(view, dtype=np_dtype).reshape(ref.shape)
            if copy:
                arr = arr.copy()
            else:
                arr.flags.writeable = False
        if ref.dtype.startswith(_TORCH):
            if not arr.flags.writeable:
                arr = arr.copy()  # torch needs writable memory; hand it its own copy
            return _numpy_to_torch(arr, ref.dtype)
        return arr


def _restore(value: Any, nested: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and NESTED_KEY in value:
            return nested[value[NESTED_KEY]]
        return {k: _restore(v, nested) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, nested) for v in value]
    return value


def leases_of(payload: Payload) -> list[LeaseId]:
    return [LeaseId(r.producer, r.lease) for r in payload.arrays.values() if r.lease]
