"""Shared-memory tensors: a producer's arena of reused segments, and a consumer's mapping cache.

A producer writes an array once into a segment of its arena and hands out an
ArrayRef naming (segment, offset, lease). Segments are files in /dev/shm
named `<prefix>-<n>`; they are reused by size class, because creating (and
first touching) a segment per message is ~20x slower than reusing one. The
producer is the only process that changes its free list: consumers give
leases back through the orchestrator (Release -> FreeLeases).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
MIN_SEGMENT_BYTES = 256 * 1024
"""Smallest segment; sizes are powers of two from here."""
SEGMENT_CACHE_MAX = 512
"""Mapped foreign segments a consumer keeps open."""


def _size_class(nbytes: int) -> int:
    size = MIN_SEGMENT_BYTES
    while size < nbytes:
        size <<= 1
    return size


class _Segment:
    __slots__ = ("buf", "fd", "name", "size")

    def __init__(self, name: str, size: int, create: bool) -> None:
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(self.fd, size)
            else:
                size = os.fstat(self.fd).st_size
            self.buf = mmap.mmap(self.fd, size)
        finally:
            os.close(self.fd)
        self.name = name
        self.size = size

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            # A numpy view still references the mapping; the OS frees it with the process.
            pass


class Arena:
    """A producer's shared-memory segments: one array per leased segment."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._free: dict[int, list[_Segment]] = {}
        self._leased: dict[int, _Segment] = {}
        self._all: list[_Segment] = []
        self._next_lease = 1
        self.created = 0

    def put(self, arr: np.ndarray) -> tuple[str, int, int]:
        """Copy `arr` into a free segment; returns (segment name, offset, lease)."""
        nbytes = arr.nbytes
        size = _size_class(nbytes)
        pool = self._free.get(size)
        if pool:
            seg = pool.pop()
        else:
            seg = _Segment(f"{self.prefix}-{len(self._all)}", size, create=True)
            self._all.append(seg)
            self.created += 1
        dst = np.frombuffer(seg.buf, dtype=np.uint8, count=nbytes)
        np.copyto(dst, arr.reshape(-1).view(np.uint8) if nbytes else dst)
        lease = self._next_lease
        self._next_lease += 1
        self._leased[lease] = seg
        return seg.name, 0, lease

    def free(self, leases: list[int]) -> None:
        for lease in leases:
            seg = self._leased.pop(lease, None)
            if seg is not None:
                self._free.setdefault(seg.size, []).append(seg)

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def segments(self) -> int:
        return len(self._all)

    def close(self) -> None:
        for seg in self._all:
            seg.close()
            unlink_segment(seg.name)
        self._all.clear()
        self._free.clear()
        self._leased.clear()


class SegmentCache:
    """A consumer's open mappings of other processes' segments, most recent kept."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, _Segment] = OrderedDict()

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        seg = self._open.get(name)
        if seg is None:
            seg = _Segment(name, 0, create=False)
            self._open[name] = seg
            if len(self._open) > SEGMENT_CACHE_MAX:
                _, old = self._open.popitem(last=False)
                old.close()
        else:
            self._open.move_to_end(name)
        return memoryview(seg.buf)[offset : offset + nbytes]

    def forget(self, prefix: str) -> None:
        """Close mappings of a producer (segments named `<prefix>-...`) that went away."""
        prefix += "-"
        for name in [n for n in self._open if n.startswith(prefix)]:
            self._open.pop(name).close()

    def close(self) -> None:
        for seg in self._open.values():
            seg.close()
        self._open.clear()


def unlink_segment(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass


def unlink_prefix(prefix: str) -> int:
    """Remove every segment named `<prefix>-...` (an arena's or a run's); returns how many.

    The dash matters: generation 1's prefix `...s1r0g1` must not match generation 10's segments.
    """
    count = 0
    for path in SHM_DIR.glob(f"{prefix}-*"):
        unlink_segment(path.name)
        count += 1
    return count
