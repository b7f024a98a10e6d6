"""The worker loop: drain messages, step the engine, send outputs, block when idle.

One thread does everything. Each turn takes every waiting message without
blocking, runs one engine step if there is work, and sends all outputs of the
turn in one frame. With nothing to do it blocks on the socket (waking at the
heartbeat interval). Stage input processors run here, next to the engine.
At every heartbeat it also checks that its main process is still its parent
and that no SIGTERM set the stop flag: such a signal comes once, and one
swallowed (say, inside a finalizer) must not leave the worker running.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec, leases_of
from omni_actors.bus.sockets import WorkerSocket
from omni_actors.config.pipeline import StageSpec, resolve
from omni_actors.models.processors import concat_upstream, pass_chunk
from omni_actors.workers.engine import EngineOutput, StageEngine

log = logs.get(__name__)


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
        sock: WorkerSocket,
        codec: PayloadCodec,
        heartbeat_interval_s: float,
        parent_pid: int | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.stage = stage
        self.engine = engine
        self.sock = sock
        self.codec = codec
        self.heartbeat_interval_s = heartbeat_interval_s
        self.parent_pid = parent_pid
        self.stop = stop
        self.processor = resolve(stage.processor) if stage.processor else concat_upstream
        self.chunk_processor = resolve(stage.chunk_processor) if stage.chunk_processor else pass_chunk
        self.requests: dict[str, _Request] = {}
        self._out: list[m.Message] = []
        self._released: list[m.LeaseId] = []
        self.stopping = False

    # ---- the loop ----------------------------------------------------------

    def run(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_interval_s
        while not self.stopping:
            for msg in self.sock.recv_nowait():
                self._handle(msg)
            if self.stopping:
                break
            if self.engine.has_work():
                self._step()
            elif not self._out and not self._released:
                wait = max(0.0, next_beat - time.monotonic())
                self.sock.wait(wait)
            now = time.monotonic()
            if now >= next_beat:
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    log.warning("worker.orphaned", parent=self.parent_pid)  # the main process is gone
                    break
                if self.stop is not None and self.stop.is_set():
                    break  # asked to stop by a signal whose SystemExit was swallowed
                self._out.append(self._heartbeat())
                next_beat = now + self.heartbeat_interval_s
            self._flush()

    def _heartbeat(self) -> m.Heartbeat:
        return m.Heartbeat(busy=len(self.requests), leased=self.codec.leased)

    def _flush(self) -> None:
        if self._released:
            self._out.append(m.Release(leases=self._released))
            self._released = []
        if self._out:
            out, self._out = self._out, []
            self.sock.send(out)

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
                self._out.append(self._heartbeat())
            case m.FreeLeases(leases=leases):
                self.codec.free(leases)
            case m.Shutdown():
                self.stopping = True
            case _:
                log.warning("worker.unexpected_message", type=type(msg).__name__)

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
            self._out.append(m.StageOutput(
                rid, self.stage.stage_id, m.Payload(), True, _describe(err), isinstance(err, ValueError)
            ))

    def _add(self, msg: m.AddRequest) -> None:
        rid = msg.request_id
        request = self.codec.decode(msg.inputs)
        self._released.extend(leases_of(msg.inputs))
        if msg.streaming:
            self.requests[rid] = _Request(request, pending_sources=set(msg.sources))
            self.engine.add(rid, request, msg.params, streaming=True)
            return
        self.requests[rid] = _Request(request)
        if msg.upstream:
            upstream = {src: [self.codec.decode(p) for p in chunks] for src, chunks in msg.upstream.items()}
            inputs = self.processor(upstream, request)
            for chunks in msg.upstream.values():
                for p in chunks:
                    self._released.extend(leases_of(p))
        else:
            inputs = request
        self.engine.add(rid, inputs, msg.params, streaming=False)

    def _feed(self, msg: m.Feed) -> None:
        req = self.requests.get(msg.request_id)
        self._released.extend(leases_of(msg.payload))
        if req is None:
            return  # aborted or failed earlier
        if msg.last:
            req.pending_sources.discard(msg.source)
        done = not req.pending_sources
        chunk = self.codec.decode(msg.payload)
        inputs = self.chunk_processor(msg.source, chunk, msg.last, req.request, req.state)
        if inputs is not None or done:
            self.engine.feed(msg.request_id, inputs or {}, done)

    # ---- engine ------------------------------------------------------------

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as err:
            log.error("worker.step_failed", error=repr(err), trace=traceback.format_exc())
            outputs = [EngineOutput(rid, {}, True, _describe(err)) for rid in self.requests]
            for rid in list(self.requests):
                self.engine.abort(rid)
        for out in outputs:
            self._emit(out)

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
            out.rejected and bool(out.error),
        ))


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
