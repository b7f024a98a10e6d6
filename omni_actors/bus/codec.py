"""Payload codec: flat dicts of plain values and arrays <-> `Payload` with ArrayRefs.

Arrays at or under INLINE_MAX_BYTES travel inside the message; larger ones
are written once into the producer's arena and travel as a lease. Torch
tensors keep their type across the boundary ("torch:" dtype prefix; bfloat16
travels as its raw 16-bit pattern). torch is imported only when one is seen.

The array path is chosen per peer. A producer without an arena (a worker on
another node) keeps large arrays as views of their own memory; `to_wire`
moves every large array bound for a peer into a message frame of its own,
sent without a copy, and for a "frames" peer (one that cannot map this node's
shared memory) also reads leased arrays out of shared memory into frames.
`attach_frames` puts received frames back under their refs.

With `cuda_ipc` (stages that share one GPU) a CUDA tensor is not copied to the
host at all: it travels as an IPC handle under a lease (bus.cuda_ipc). A tensor
that came by its allocation's handle gives its lease back when it ends
(`cuda_released`), not when its message is read (`leases_released_on_receipt`).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from msgspec.structs import replace as msgspec_replace

from omni_actors.bus import messages as m
from omni_actors.bus.cuda_ipc import CudaExporter, CudaImporter, CudaLeases, open_tensor, share
from omni_actors.bus.messages import ArrayRef, LeaseId, Payload
from omni_actors.bus.shm import Arena, SegmentCache
from omni_actors.settings import settings

INLINE_MAX_BYTES = 64 * 1024
"""Arrays up to this size are sent inside the message instead of shared memory."""

FRAME_CHUNK_BYTES = 256 * 1024
"""An array sent as frames is cut into frames of at most this size. CURVE encrypts each frame
through two scratch buffers of its size on one I/O thread; at this size the frame, its buffers and
the result stay in a core's cache (one 64 MiB frame ran at half the speed, 1 MiB frames at ~2/3 of
this size's: docs/benchmarks.md, "Cluster bus")."""

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

    def __init__(self, producer: str, arena: Arena | None, segments: SegmentCache, cuda_ipc: bool = False) -> None:
        self.producer = producer
        self.arena = arena
        self.segments = segments
        self.cuda = CudaLeases() if cuda_ipc else None
        self.cuda_export = CudaExporter() if cuda_ipc and settings().cuda_ipc_path == "allocation" else None
        """None: CUDA tensors go by torch's reduction only (OMNI_CUDA_IPC=torch)."""
        self._cuda_import: CudaImporter | None = None

    @property
    def cuda_import(self) -> CudaImporter:
        if self._cuda_import is None:
            self._cuda_import = CudaImporter()
        return self._cuda_import

    def cuda_released(self) -> list[LeaseId]:
        """Leases of received CUDA tensors that have ended (to give back in a Release)."""
        return self._cuda_import.released() if self._cuda_import is not None else []

    def cuda_trim(self) -> None:
        if self._cuda_import is not None:
            self._cuda_import.trim()

    def cuda_next_trim_s(self, now: float) -> float | None:
        return self._cuda_import.next_trim_s(now) if self._cuda_import is not None else None

    @property
    def cuda_pending(self) -> bool:
        """Received CUDA tensors have ended whose leases have not gone back yet."""
        return self._cuda_import is not None and bool(self._cuda_import.done)

    def close(self) -> None:
        if self._cuda_import is not None:
            self._cuda_import.close()
        if self.cuda is not None:
            self.cuda.close()

    def free(self, leases: list[int]) -> None:
        """The producer side of FreeLeases: arena leases are positive, CUDA ones negative."""
        if self.cuda is not None:
            self.cuda.free([x for x in leases if x < 0])
        if self.arena is not None:
            self.arena.free([x for x in leases if x > 0])

    @property
    def leased(self) -> int:
        return (self.arena.leased if self.arena else 0) + (self.cuda.leased if self.cuda else 0)

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
        if self.cuda is not None and value.device.type == "cuda":
            t = value.detach()
            seg = self.cuda_export.share(t) if self.cuda_export is not None else None
            if seg is not None:
                return ArrayRef(dtype=_TORCH + "cuda", shape=tuple(t.shape), cuda_segment=seg,
                                lease=self.cuda.hold(t), producer=self.producer)
            return ArrayRef(dtype=_TORCH + "cuda", shape=tuple(t.shape), cuda=share(t),
                            lease=self.cuda.hold(t), producer=self.producer)
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
        if arr.nbytes <= INLINE_MAX_BYTES:
            return ArrayRef(dtype=dtype, shape=shape, inline=arr.tobytes())
        if self.arena is None:  # a view, no copy: the socket sends it as a frame of its own
            return ArrayRef(dtype=dtype, shape=shape, inline=arr.reshape(-1).view(np.uint8).data)
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
        if ref.cuda_segment is not None:
            lease = LeaseId(ref.producer, ref.lease) if ref.lease else None
            return self.cuda_import.open(ref.cuda_segment, ref.shape, lease)
        if ref.cuda is not None:
            return open_tensor(ref.cuda, ref.shape)
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


def leases_released_on_receipt(payload: Payload) -> list[LeaseId]:
    """The leases a consumer gives back once it has decoded the payload: all but those of CUDA
    tensors sent by allocation handle, which go back when the tensors end (`cuda_released`)."""
    return [LeaseId(r.producer, r.lease) for r in payload.arrays.values() if r.lease and r.cuda_segment is None]


# ---- the per-peer array path -------------------------------------------------------

_PAYLOAD_FIELDS = {m.AddRequest: ("inputs",), m.Feed: ("payload",), m.StageOutput: ("payload",)}


def _nbytes(buf: Any) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def to_wire(
    msgs: list[m.Message], frames_peer: bool = False, segments: SegmentCache | None = None
) -> tuple[list[m.Message], list[Any]]:
    """`msgs` as they leave for one peer, and the frames that follow the body.

    Inline arrays over INLINE_MAX_BYTES become frames (zero-copy views). For a
    `frames_peer`, leased shared-memory arrays do too (read through `segments`);
    they keep their lease, which the consumer gives back as usual. The messages
    given are not changed (the same payload may also go to another peer).
    """
    frames: list[Any] = []
    out = []
    for msg in msgs:
        fields = _PAYLOAD_FIELDS.get(type(msg))
        if fields is None:
            out.append(msg)
            continue
        changes: dict[str, Any] = {}
        for name in fields:
            p = getattr(msg, name)
            q = _wire_payload(p, frames, frames_peer, segments)
            if q is not p:
                changes[name] = q
        if isinstance(msg, m.AddRequest) and msg.upstream:
            upstream = {s: [_wire_payload(p, frames, frames_peer, segments) for p in ps]
                        for s, ps in msg.upstream.items()}
            if any(q is not p for s, ps in msg.upstream.items() for p, q in zip(ps, upstream[s], strict=True)):
                changes["upstream"] = upstream
        out.append(msgspec_replace(msg, **changes) if changes else msg)
    return out, frames


def _wire_payload(p: Payload, frames: list[Any], frames_peer: bool, segments: SegmentCache | None) -> Payload:
    arrays = None
    for key, ref in p.arrays.items():
        if ref.inline is not None:
            if _nbytes(ref.inline) <= INLINE_MAX_BYTES:
                continue
            data = ref.inline
        elif frames_peer and ref.segment and segments is not None:
            data = segments.view(ref.segment, ref.offset, ref.nbytes)
        else:
            continue
        first = len(frames) + 1
        chunks = _chunks(data)
        frames.extend(chunks)
        if arrays is None:
            arrays = dict(p.arrays)
        arrays[key] = ArrayRef(dtype=ref.dtype, shape=ref.shape, nbytes=_nbytes(data), lease=ref.lease,
                               producer=ref.producer, frame=first, frames=len(chunks) if len(chunks) > 1 else 0)
    return p if arrays is None else Payload(data=p.data, arrays=arrays)


def _chunks(data: Any) -> list[Any]:
    """`data` as views of at most FRAME_CHUNK_BYTES each (no copy)."""
    n = _nbytes(data)
    if n <= FRAME_CHUNK_BYTES:
        return [data]
    view = memoryview(data).cast("B")
    return [view[i : i + FRAME_CHUNK_BYTES] for i in range(0, n, FRAME_CHUNK_BYTES)]


def attach_frames(msgs: list[m.Message], frames: list[memoryview]) -> None:
    """Put received frames under the refs that name them (ValueError: a ref names no frame)."""
    for msg in msgs:
        fields = _PAYLOAD_FIELDS.get(type(msg))
        if fields is None:
            continue
        payloads = [getattr(msg, name) for name in fields]
        if isinstance(msg, m.AddRequest):
            payloads.extend(p for ps in msg.upstream.values() for p in ps)
        for p in payloads:
            for ref in p.arrays.values():
                if ref.frame:
                    ref.inline = _joined(frames, ref.frame, max(ref.frames, 1), ref.nbytes)
                    ref.frame = ref.frames = 0


def _joined(frames: list[memoryview], first: int, count: int, nbytes: int) -> Any:
    """The array in frames first..first+count-1 (1-based): the frame itself, or the chunks joined
    (one copy: an array is contiguous). ValueError: they are not there or their sizes differ."""
    parts = frames[first - 1 : first - 1 + count]
    if first < 1 or len(parts) != count or sum(_nbytes(f) for f in parts) != nbytes:
        raise ValueError(f"array names frames {first}..{first + count - 1} of {len(frames)} ({nbytes} bytes)")
    if count == 1:
        return parts[0]
    out = np.empty(nbytes, np.uint8)  # (numpy asks for huge pages: ~5x fewer page faults than bytes.join)
    pos = 0
    for part in parts:
        n = _nbytes(part)
        out[pos : pos + n] = np.frombuffer(part, np.uint8)
        pos += n
    return memoryview(out).toreadonly()  # read-only, like a received frame
