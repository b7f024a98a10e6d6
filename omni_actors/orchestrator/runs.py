"""Per-request run records and the lease table.

A Run is the orchestrator's memory of one request: the stages it goes
through, the replica serving each, which stages started and finished, payloads
buffered for full-payload handoff, and the shared-memory leases it still holds.
The LeaseTable counts users of each lease; at zero the producer may reuse it.
AbortWaits keeps an aborted request's leases until each worker told of the abort
answers it: a message sent before the Abort may still be unread there.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from omni_actors.bus import messages as m
from omni_actors.orchestrator.launcher import WorkerHandle
from omni_actors.orchestrator.requests import RequestSpec, RequestStream

LeaseKey = tuple[str, int]


@dataclass(eq=False)
class Run:
    spec: RequestSpec
    stream: RequestStream
    plan: tuple[int, ...]
    sources: dict[int, tuple[int, ...]]
    consumers: dict[int, tuple[int, ...]]
    finals: frozenset[int]
    replicas: dict[int, WorkerHandle]
    request_plain: m.Payload
    """The request's plain values, given to every non-entry stage."""
    started: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    buffers: dict[int, list[m.Payload]] = field(default_factory=dict)
    leases: set[LeaseKey] = field(default_factory=set)
    deadline: asyncio.TimerHandle | None = None
    t_submit: float = field(default_factory=time.perf_counter)
    t_start: dict[int, float] = field(default_factory=dict)
    """When each started stage was sent its AddRequest (perf_counter; latency.py)."""
    answered: set[int] = field(default_factory=set)
    """Stages whose first output with data has come back."""

    @property
    def rid(self) -> str:
        return self.spec.request_id

    def start(self, stage_id: int) -> None:
        self.started.add(stage_id)
        self.t_start[stage_id] = time.perf_counter()

    def params_for(self, stage_id: int) -> dict:
        extra = self.spec.stage_params.get(stage_id)
        return {**self.spec.params, **extra} if extra else self.spec.params

    def ready_for_full_payload(self, stage_id: int) -> bool:
        return all(src in self.finished for src in self.sources[stage_id])


class LeaseTable:
    """How many consumers still use each lease, and which run holds it."""

    def __init__(self) -> None:
        self._count: dict[LeaseKey, int] = {}
        self._run: dict[LeaseKey, str] = {}

    def __len__(self) -> int:
        return len(self._count)

    def hold(self, run: Run, refs: list[m.LeaseId], users: int) -> None:
        for ref in refs:
            key = (ref.producer, ref.lease)
            self._count[key] = self._count.get(key, 0) + users
            self._run[key] = run.rid
            run.leases.add(key)

    def release(self, key: LeaseKey) -> str | None:
        """One user is done; returns the run id when the lease is now free, else None."""
        count = self._count.get(key)
        if count is None:
            return None
        if count > 1:
            self._count[key] = count - 1
            return None
        del self._count[key]
        return self._run.pop(key, "")

    def drop(self, key: LeaseKey) -> None:
        self._count.pop(key, None)
        self._run.pop(key, None)


Waiter = tuple[bytes, str]
"""(a worker's bus identity, a request id): one Abort not yet answered."""


class AbortWaits:
    """Leases of ended requests, kept until every worker sent their Abort answers it (Aborted).

    A worker reads its messages in order, so once it answers, every AddRequest or Feed sent to it
    before the Abort has been read or dropped: only then may the shared memory their inputs are in
    be reused or unlinked. A worker that dies answers nothing; its waits end with it (`gone`).
    """

    def __init__(self) -> None:
        self._parked: dict[int, tuple[set[Waiter], list[LeaseKey]]] = {}
        self._waits: dict[Waiter, deque[int]] = {}
        self._next = 0
        self._keys = 0

    def __len__(self) -> int:
        """Leases kept (still held: `Statistics.leases_held` counts them)."""
        return self._keys

    def park(self, waiters: set[Waiter], keys: list[LeaseKey]) -> None:
        n = self._next
        self._next += 1
        self._parked[n] = (set(waiters), keys)
        self._keys += len(keys)
        for w in waiters:
            self._waits.setdefault(w, deque()).append(n)

    def answered(self, waiter: Waiter) -> list[LeaseKey]:
        """A worker answered an Abort; returns the leases now free (none while others still wait)."""
        queue = self._waits.get(waiter)
        if not queue:
            return []
        n = queue.popleft()  # (a request id used again: the answers come in the order of the aborts)
        if not queue:
            del self._waits[waiter]
        return self._done(n, waiter)

    def gone(self, identity: bytes) -> list[LeaseKey]:
        """A worker died: nothing it was sent will be read; returns the leases now free."""
        out: list[LeaseKey] = []
        for waiter in [w for w in self._waits if w[0] == identity]:
            for n in self._waits.pop(waiter):
                out.extend(self._done(n, waiter))
        return out

    def _done(self, n: int, waiter: Waiter) -> list[LeaseKey]:
        waiters, keys = self._parked[n]
        waiters.discard(waiter)
        if waiters:
            return []
        del self._parked[n]
        self._keys -= len(keys)
        return keys
