"""The worker loop (the stepping thread): drain messages, step the engine, send outputs, block when idle.

Each turn takes every waiting message without blocking, runs one engine step
if there is work, and sends all outputs of the turn in one frame. With nothing
to do it blocks until a message comes. Stage input processors run here, next
to the engine. It sends and receives on its own bus socket (`workers/io.py`);
heartbeats and the checks for a gone main process or a swallowed SIGTERM belong
to the heartbeat thread: this thread only records its progress (`steps`,
`step_started`), which the heartbeat thread reads into each heartbeat.

Aborts: an AddRequest or Feed whose Abort comes in the same drain is dropped unread (its leases
given back), and each Abort is answered (Aborted) once handled; the orchestrator keeps an aborted
request's shared memory until then, so no input is unlinked or reused under a read.

Shared memory: while this worker's arena is over its byte budget the loop
holds its engine back (for up to SHM_BUDGET_WAIT_S) until consumers give
leases back, and it returns segments and mappings idle for the arena's
`idle_s` (waking for that even when there is no other work).
"""

from __future__ import annotations

import bisect
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec, leases_of, leases_released_on_receipt, to_wire
from omni_actors.config.pipeline import StageSpec, resolve
from omni_actors.models.processors import concat_upstream, pass_chunk
from omni_actors.workers.engine import EngineOutput, StageEngine
from omni_actors.workers.io import WorkerIO
from omni_actors.workers.step_profile import StepProfiler

log = logs.get(__name__)

HOLD_MAX_S = 1.0
"""Longest one Hold keeps this worker's engine from stepping (a lost release ends there)."""
SHM_BUDGET_WAIT_S = 10.0
"""Longest the engine is held back while this worker's arena is over its byte budget. Past it,
the engine steps on (until the arena is under its budget again): a consumer that keeps its leases
until a request ends (a full-payload handoff buffers every chunk) would otherwise never free them."""


@dataclass
class _Request:
    request: dict[str, Any]
    pending_sources: set[int] = field(default_factory=set)
    state: dict[str, Any] = field(default_factory=dict)


class WorkerLoop:
    def __init__(
        self,
        stage: StageSpec,
        engine: StageEngine,
        sock: WorkerIO,
        codec: PayloadCodec,
        profiler: StepProfiler | None = None,
        first_claims: bool = False,
    ) -> None:
        self.stage = stage
        self.first_claims = first_claims
        """Say (FirstOutput) when a step makes some request's first output (deploy first_output_priority)."""
        self._yield_until: float | None = None
        """While set, no engine step before this time (a Hold: a stage sharing the device claims it)."""
        self.profiler = profiler
        """Opt-in torch profile of some steps (step_profile.py; OMNI_PROFILE_DIR)."""
        self.engine = engine
        self.sock = sock
        self.codec = codec
        self.processor = resolve(stage.processor) if stage.processor else concat_upstream
        self.chunk_processor = resolve(stage.chunk_processor) if stage.chunk_processor else pass_chunk
        self.requests: dict[str, _Request] = {}
        self._out: list[m.Message] = []
        self._released: list[m.LeaseId] = []
        self.stopping = False
        self.steps = 0
        """Engine steps completed (read by the heartbeat thread)."""
        self.busy_s = 0.0
        self.step_counts = [0] * (len(m.STEP_BUCKETS_S) + 1)
        """Completed steps per duration bucket (heartbeats carry a copy)."""
        """Seconds spent in completed engine steps (read by the heartbeat thread)."""
        self.step_started: float | None = None
        """time.monotonic() when the running step began; None between steps (read by the heartbeat thread)."""
        self._held_since: float | None = None
        """When the engine was first held back for the arena's budget (None: it is not)."""
        self._overrun = False
        """Held back for SHM_BUDGET_WAIT_S in vain: consumers keep their leases (say, buffered for a
        full-payload handoff), so the engine steps on until the arena is under its budget again."""

    # ---- the loop ----------------------------------------------------------

    def run(self) -> None:
        self.sock.heartbeat = self._heartbeat
        while not self.stopping:
            msgs = self.sock.recv_nowait()
            dropped = _aborted_later(msgs)
            for i, msg in enumerate(msgs):
                if i in dropped:
                    self._drop_unread(msg)
                else:
                    self._handle(msg)
            if self.stopping:
                break
            now = time.monotonic()
            hold_s = (max(self._hold_s(now), self.engine.gather_s(now), self._yield_s(now))
                      if self.engine.has_work() else None)
            if hold_s == 0.0:
                self._step()
            elif not self._out and not self._released and not self.codec.cuda_pending:
                self.sock.wait(_earliest(hold_s, self._trim_s(now)))
            self._trim()
            self._flush()
        self._flush()

    def _hold_s(self, now: float) -> float:
        """0 when the engine may step; else how long to wait for leases to come back first."""
        arena = self.codec.arena
        if arena is None or not arena.over_budget:
            self._held_since = None
            self._overrun = False  # back under the budget: holding back works again
            return 0.0
        if self._overrun:
            return 0.0  # holding back brought no lease back: step freely until the arena is under budget
        if self._held_since is None:
            self._held_since = now
            log.debug("shm.backpressure", leased_bytes=arena.leased_bytes, budget_bytes=arena.budget_bytes)
        left = self._held_since + SHM_BUDGET_WAIT_S - now
        if left > 0:
            return left
        log.warning("shm.budget_overrun", leased_bytes=arena.leased_bytes, budget_bytes=arena.budget_bytes)
        self._overrun = True
        return 0.0

    def _yield_s(self, now: float) -> float:
        """0 when no Hold is on; else how long it lasts yet (a release or its end, whichever first)."""
        if self._yield_until is None:
            return 0.0
        left = self._yield_until - now
        if left <= 0:
            self._yield_until = None
            return 0.0
        return left

    def _trim_s(self, now: float) -> float | None:
        arena = self.codec.arena
        return _earliest(_earliest(arena.next_trim_s(now) if arena else None, self.codec.segments.next_trim_s(now)),
                         self.codec.cuda_next_trim_s(now))

    def _trim(self) -> None:
        """Give back segments and mappings idle for longer than the pools keep them."""
        if self.codec.arena is not None:
            self.codec.arena.trim()
        self.codec.segments.trim()
        self.codec.cuda_trim()

    def _heartbeat(self) -> m.Heartbeat:
        """This worker's state now; called on the heartbeat thread too, so it only reads attributes."""
        started = self.step_started
        return m.Heartbeat(
            busy=len(self.requests), leased=self.codec.leased, steps=self.steps,
            step_s=0.0 if started is None else time.monotonic() - started, busy_s=self.busy_s,
            step_counts=list(self.step_counts),
        )

    def _flush(self) -> None:
        self._released.extend(self.codec.cuda_released())
        if self._released:
            self._out.append(m.Release(leases=self._released))
            self._released = []
        if self._out:
            out, self._out = self._out, []
            try:
                self.sock.send(out)
            except (TypeError, ValueError, OverflowError):  # a value msgpack cannot carry
                self.sock.send(self._sendable(out))

    def _sendable(self, out: list[m.Message]) -> list[m.Message]:
        """`out` with each message that cannot be encoded replaced: an output fails its request only."""
        good: list[m.Message] = []
        for msg in out:
            try:
                m.encode(to_wire([msg])[0][0])  # (large arrays leave as frames: not copied to check)
            except (TypeError, ValueError, OverflowError) as err:
                log.warning("worker.unsendable", type=type(msg).__name__, error=repr(err))
                if isinstance(msg, m.StageOutput):
                    rid = msg.request_id
                    if self.requests.pop(rid, None) is not None:
                        self.engine.abort(rid)
                    self.codec.free([ref.lease for ref in leases_of(msg.payload)])
                    good.append(m.StageOutput(rid, self.stage.stage_id, m.Payload(), True,
                                              f"its output could not be sent: {_describe(err)}"))
                continue
            good.append(msg)
        return good

    # ---- messages ----------------------------------------------------------

    def _handle(self, msg: m.Message) -> None:
        match msg:
            case m.AddRequest():
                self._guard(msg.request_id, self._add, msg)
            case m.Feed():
                self._guard(msg.request_id, self._feed, msg)
            case m.Abort(request_ids=rids):
                for rid in rids:
                    if self.requests.pop(rid, None) is not None:
                        self.engine.abort(rid)
                # Every earlier message of these requests has been read or dropped: their inputs'
                # shared memory may go (the orchestrator keeps it until this answer).
                self._out.append(m.Aborted(rids))
                self._out.append(self._heartbeat())
            case m.FreeLeases(leases=leases):
                self.codec.free(leases)
            case m.Shutdown():
                self.stopping = True
            case m.Hold(s=s):
                self._yield_until = time.monotonic() + min(s, HOLD_MAX_S) if s > 0 else None
            case _:
                log.warning("worker.unexpected_message", type=type(msg).__name__)

    def _drop_unread(self, msg: m.AddRequest | m.Feed) -> None:
        """A request's message whose Abort came in the same drain: its inputs are given back unread
        (a queued request aborted by its client is never decoded, started or failed)."""
        payloads = [msg.inputs, *(p for chunks in msg.upstream.values() for p in chunks)] \
            if isinstance(msg, m.AddRequest) else [msg.payload]
        for p in payloads:
            self._released.extend(leases_of(p))

    def _guard(self, rid: str, fn: Any, msg: Any) -> None:
        """Run a handler; an exception fails that request only.

        Engines validate a request's inputs and parameters as they take it and raise ValueError
        for what they refuse: that is the caller's fault (`rejected`), any other error is ours.
        """
        try:
            fn(msg)
        except Exception as err:
            log.warning("worker.request_failed", request_id=rid, error=repr(err))
            if self.requests.pop(rid, None) is not None:
                self.engine.abort(rid)
            rejected = isinstance(err, ValueError)
            self._out.append(m.StageOutput(
                rid, self.stage.stage_id, m.Payload(), True, _describe(err), rejected,
                getattr(err, "code", None) if rejected else None,
            ))

    def _add(self, msg: m.AddRequest) -> None:
        rid = msg.request_id
        # Copied out of shared memory: their leases go back now, while an engine may keep a request's
        # inputs queued (an image or video to edit) past the point the producer reuses that space.
        request = self.codec.decode(msg.inputs, copy=True)
        self._released.extend(leases_released_on_receipt(msg.inputs))
        if msg.streaming:
            self.requests[rid] = _Request(request, pending_sources=set(msg.sources))
            self.engine.add(rid, request, msg.params, streaming=True)
            return
        self.requests[rid] = _Request(request)
        if msg.upstream:
            upstream = {src: [self.codec.decode(p, copy=True) for p in chunks] for src, chunks in msg.upstream.items()}
            inputs = self.processor(upstream, request)
            for chunks in msg.upstream.values():
                for p in chunks:
                    self._released.extend(leases_released_on_receipt(p))
        else:
            inputs = request
        self.engine.add(rid, inputs, msg.params, streaming=False)

    def _feed(self, msg: m.Feed) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            self._released.extend(leases_of(msg.payload))
            return  # aborted or failed earlier
        self._released.extend(leases_released_on_receipt(msg.payload))
        if msg.last:
            req.pending_sources.discard(msg.source)
        done = not req.pending_sources
        chunk = self.codec.decode(msg.payload)
        inputs = self.chunk_processor(msg.source, chunk, msg.last, req.request, req.state)
        if inputs is not None or done:
            self.engine.feed(msg.request_id, inputs or {}, done)

    # ---- engine ------------------------------------------------------------

    def _step(self) -> None:
        claim = self.first_claims and self.engine.first_output_next()
        if claim:  # out before the step, so the stages sharing the device hold during it
            self.sock.send([m.FirstOutput(True)])
        self.step_started = started = time.monotonic()
        try:
            if self.profiler is None:
                outputs = self.engine.step()
            else:
                with self.profiler.step():
                    outputs = self.engine.step()
        except Exception as err:
            log.error("worker.step_failed", error=repr(err), trace=traceback.format_exc())
            outputs = [EngineOutput(rid, {}, True, _describe(err)) for rid in self.requests]
            for rid in list(self.requests):
                self.engine.abort(rid)
        finally:
            self.step_started = None
            took = time.monotonic() - started
            self.busy_s += took
            self.step_counts[bisect.bisect_left(m.STEP_BUCKETS_S, took)] += 1
            self.steps += 1
        for out in outputs:
            self._emit(out)
        if claim:
            self._out.append(m.FirstOutput(False))

    def _emit(self, out: EngineOutput) -> None:
        if out.request_id not in self.requests:
            return  # aborted while the step ran
        if out.finished or out.error:
            del self.requests[out.request_id]
        try:
            payload = self.codec.encode(out.payload)
        except Exception as err:
            payload, out.error, out.finished = m.Payload(), _describe(err), True
            self.requests.pop(out.request_id, None)
            self.engine.abort(out.request_id)
        self._out.append(m.StageOutput(
            out.request_id, self.stage.stage_id, payload, out.finished or bool(out.error), out.error,
            out.rejected and bool(out.error), out.code if out.rejected and out.error else None,
        ))


def _aborted_later(msgs: list[m.Message]) -> set[int]:
    """Positions of the AddRequests and Feeds in `msgs` whose request an Abort later in `msgs` ends."""
    aborted: set[str] = set()
    out: set[int] = set()
    for i in range(len(msgs) - 1, -1, -1):
        match msgs[i]:
            case m.Abort(request_ids=rids):
                aborted.update(rids)
            case m.AddRequest(request_id=rid) | m.Feed(request_id=rid) if rid in aborted:
                out.add(i)
    return out


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
