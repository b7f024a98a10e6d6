"""Shared-memory tensors: a producer's arena of reused segments, and a consumer's mapping cache.

A producer writes an array once into a segment of its arena and hands out an
ArrayRef naming (segment, offset, lease). Segments are files in /dev/shm
named `<prefix>-<n>`; they are reused by size class, because creating (and
first touching) a segment per message is ~20x slower than reusing one. The
producer is the only process that changes its free list: consumers give
leases back through the orchestrator (Release -> FreeLeases).

Pools do not keep their peak. A segment free for `idle_s` is unlinked by
its producer (`Arena.trim`), and a consumer closes a mapping unused that long
(`SegmentCache.trim`), so memory and open files go back after a burst. A
producer has a byte budget: while its leased bytes are at the budget,
`over_budget` tells its owner to stop producing until consumers give leases
back (the worker loop stops stepping its engine). Names are never reused, so
a consumer's cached mapping can never stand for a newer segment.
"""

from __future__ import annotations

import mmap
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
MIN_SEGMENT_BYTES = 256 * 1024
"""Smallest segment; sizes are powers of two from here."""
SEGMENT_CACHE_MAX = 512
"""Mapped foreign segments a consumer keeps open."""
SHM_IDLE_S = 30.0
"""A segment free (producer) or unused (consumer) this long is unlinked or unmapped."""
ARENA_BUDGET_BYTES = 1 << 30
"""Default byte budget of one producer's leased segments (a stage's deploy `shm_budget_mb`)."""


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

    def __init__(self, prefix: str, budget_bytes: int = ARENA_BUDGET_BYTES, idle_s: float = SHM_IDLE_S) -> None:
        self.prefix = prefix
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self._free: dict[int, list[tuple[_Segment, float]]] = {}
        """Free segments by size class, each with when it was freed (oldest first)."""
        self._leased: dict[int, _Segment] = {}
        self._next_lease = 1
        self._next_name = 0
        self.created = 0
        self.bytes = 0
        """Bytes of every segment this arena holds (leased or free)."""
        self.leased_bytes = 0

    def put(self, arr: np.ndarray) -> tuple[str, int, int]:
        """Copy `arr` into a free segment; returns (segment name, offset, lease).

        It never refuses: an owner that must bound its memory checks `over_budget` before it
        produces. Past the budget, free segments of other sizes are unlinked to make room."""
        nbytes = arr.nbytes
        size = _size_class(nbytes)
        pool = self._free.get(size)
        if pool:
            seg = pool.pop()[0]  # the most recently freed: warm, and the old ones age out
        else:
            self._make_room(size)
            seg = _Segment(f"{self.prefix}-{self._next_name}", size, create=True)
            self._next_name += 1
            self.created += 1
            self.bytes += size
        dst = np.frombuffer(seg.buf, dtype=np.uint8, count=nbytes)
        np.copyto(dst, arr.reshape(-1).view(np.uint8) if nbytes else dst)
        lease = self._next_lease
        self._next_lease += 1
        self._leased[lease] = seg
        self.leased_bytes += seg.size
        return seg.name, 0, lease

    def free(self, leases: list[int]) -> None:
        now = time.monotonic()
        for lease in leases:
            seg = self._leased.pop(lease, None)
            if seg is not None:
                self.leased_bytes -= seg.size
                self._free.setdefault(seg.size, []).append((seg, now))

    @property
    def over_budget(self) -> bool:
        """True while leased bytes are at the budget: produce nothing more until leases come back."""
        return self.leased_bytes >= self.budget_bytes

    def _make_room(self, size: int) -> None:
        while self.bytes + size > self.budget_bytes:
            pools = [(pool[0][1], sz) for sz, pool in self._free.items() if pool]
            if not pools:
                return
            self._drop(self._free[min(pools)[1]].pop(0)[0])

    def _drop(self, seg: _Segment) -> None:
        seg.close()
        unlink_segment(seg.name)
        self.bytes -= seg.size

    def trim(self, now: float | None = None) -> int:
        """Unlink segments free for `idle_s` or longer; returns how many."""
        now = time.monotonic() if now is None else now
        count = 0
        for pool in self._free.values():
            while pool and now - pool[0][1] >= self.idle_s:
                self._drop(pool.pop(0)[0])
                count += 1
        return count

    def next_trim_s(self, now: float | None = None) -> float | None:
        """Seconds until `trim` has something to do; None while no segment is free."""
        oldest = [pool[0][1] for pool in self._free.values() if pool]
        if not oldest:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(oldest) + self.idle_s - now)

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def segments(self) -> int:
        return len(self._leased) + sum(len(pool) for pool in self._free.values())

    def close(self) -> None:
        for seg in [*self._leased.values(), *(s for pool in self._free.values() for s, _ in pool)]:
            self._drop(seg)
        self._free.clear()
        self._leased.clear()


class SegmentCache:
    """A consumer's open mappings of other processes' segments, most recent kept."""

    def __init__(self, idle_s: float = SHM_IDLE_S) -> None:
        self.idle_s = idle_s
        self._open: OrderedDict[str, tuple[_Segment, float]] = OrderedDict()
        """Mappings by segment name, least recently used first, each with when it was last used."""

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        hit = self._open.pop(name, None)
        seg = hit[0] if hit is not None else _Segment(name, 0, create=False)
        self._open[name] = (seg, time.monotonic())
        if hit is None and len(self._open) > SEGMENT_CACHE_MAX:
            _, (old, _) = self._open.popitem(last=False)
            old.close()
        return memoryview(seg.buf)[offset : offset + nbytes]

    def trim(self, now: float | None = None) -> int:
        """Close mappings unused for `idle_s` or longer; returns how many."""
        now = time.monotonic() if now is None else now
        count = 0
        while self._open:
            name, (seg, used) = next(iter(self._open.items()))
            if now - used < self.idle_s:
                break
            del self._open[name]
            seg.close()
            count += 1
        return count

    def next_trim_s(self, now: float | None = None) -> float | None:
        """Seconds until `trim` has something to do; None while nothing is mapped."""
        if not self._open:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, next(iter(self._open.values()))[1] + self.idle_s - now)

    def __len__(self) -> int:
        return len(self._open)

    def forget(self, prefix: str) -> None:
        """Close mappings of a producer (segments named `<prefix>-...`) that went away."""
        prefix += "-"
        for name in [n for n in self._open if n.startswith(prefix)]:
            self._open.pop(name)[0].close()

    def close(self) -> None:
        for seg, _ in self._open.values():
            seg.close()
        self._open.clear()


def unlink_segment(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass


def unlink_driver_files(pid: int) -> int:
    """Remove the CUDA driver's files of an ended process: `cuda.shm.<n>.<pid, hex>.<k>`, made when it
    exported an interprocess event's handle (bus/cuda_ipc.py does for every CUDA handoff) and left
    behind by the driver when the process exits. Returns how many."""
    count = 0
    for path in SHM_DIR.glob(f"cuda.shm.*.{pid:x}.*"):
        unlink_segment(path.name)
        count += 1
    return count


def unlink_prefix(prefix: str) -> int:
    """Remove every segment named `<prefix>-...` (an arena's or a run's); returns how many.

    The dash matters: generation 1's prefix `...s1r0g1` must not match generation 10's segments.
    """
    count = 0
    for path in SHM_DIR.glob(f"{prefix}-*"):
        unlink_segment(path.name)
        count += 1
    return count
