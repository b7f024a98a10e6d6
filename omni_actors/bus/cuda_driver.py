"""The few CUDA driver calls behind same-GPU handoff by allocation handle (ctypes on libcuda.so.1).

Loaded on first use, only in a process that already runs CUDA through torch
(its primary context is the one these calls use). Every call checks its
result; a failure is a `CudaDriverError` naming the call and the driver's
error name.
"""

from __future__ import annotations

import ctypes
from typing import Any

IPC_HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
_POINTER_ATTRIBUTE_BUFFER_ID = 7  # CU_POINTER_ATTRIBUTE_BUFFER_ID


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed (or libcuda is not there)."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


class Driver:
    """cuMemGetAddressRange, cuPointerGetAttribute, cuIpc{Get,Open,Close}MemHandle."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise CudaDriverError(f"libcuda.so.1 not loadable: {err}") from err
        u64, ptr = ctypes.c_uint64, ctypes.POINTER
        self._range = _fn(lib, ("cuMemGetAddressRange_v2",), [ptr(u64), ptr(ctypes.c_size_t), u64])
        self._attr = _fn(lib, ("cuPointerGetAttribute",), [ctypes.c_void_p, ctypes.c_int, u64])
        self._get = _fn(lib, ("cuIpcGetMemHandle",), [ptr(_IpcHandle), u64])
        self._open = _fn(lib, ("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"), [ptr(u64), _IpcHandle, ctypes.c_uint])
        self._close = _fn(lib, ("cuIpcCloseMemHandle",), [u64])
        self._ctx_get = _fn(lib, ("cuCtxGetCurrent",), [ptr(ctypes.c_void_p)])
        self._name = lib.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ptr(ctypes.c_char_p)]
        self._name.restype = ctypes.c_int

    def _check(self, call: str, rc: int) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self._name(rc, ctypes.byref(name))
            raise CudaDriverError(f"{call}: {(name.value or b'?').decode()} ({rc})")

    def has_context(self) -> bool:
        ctx = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self._ctx_get(ctypes.byref(ctx)))
        return bool(ctx.value)

    def allocation(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the device allocation (a cudaMalloc, i.e. a caching-allocator segment) holding ptr."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check("cuMemGetAddressRange", self._range(ctypes.byref(base), ctypes.byref(size), ptr))
        return int(base.value), int(size.value)

    def buffer_id(self, ptr: int) -> int:
        """The process-wide unique id of the allocation holding ptr (never given to another allocation)."""
        value = ctypes.c_ulonglong()
        self._check("cuPointerGetAttribute(BUFFER_ID)",
                    self._attr(ctypes.byref(value), _POINTER_ATTRIBUTE_BUFFER_ID, ptr))
        return int(value.value)

    def ipc_handle(self, base: int) -> bytes:
        """The IPC handle of the allocation starting at base (the same bytes for as long as it lives)."""
        handle = _IpcHandle()
        self._check("cuIpcGetMemHandle", self._get(ctypes.byref(handle), base))
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    def open(self, handle: bytes) -> int:
        """Map another process's allocation here; its base address in this process."""
        if len(handle) != IPC_HANDLE_BYTES:
            raise CudaDriverError(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
        h = _IpcHandle()
        ctypes.memmove(ctypes.addressof(h), handle, IPC_HANDLE_BYTES)
        dptr = ctypes.c_uint64()
        self._check("cuIpcOpenMemHandle", self._open(ctypes.byref(dptr), h, _LAZY_ENABLE_PEER_ACCESS))
        return int(dptr.value)

    def close(self, base: int) -> None:
        self._check("cuIpcCloseMemHandle", self._close(base))


def _fn(lib: Any, names: tuple[str, ...], argtypes: list[Any]) -> Any:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            return fn
    raise CudaDriverError(f"libcuda has none of {names}")


_DRIVER: Driver | None = None


def driver() -> Driver:
    """The process's driver bindings (loaded once)."""
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver()
    return _DRIVER
