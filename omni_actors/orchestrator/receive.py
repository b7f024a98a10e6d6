"""The orchestrator's receive path: what it does with each message a stage worker sends.

The ROUTER's readiness callback hands every decoded message to `_on_message`,
which dispatches it with `match`: a stage's output goes to the client's stream
(final stages) and to its consumers, chunk by chunk (streamed stages) or whole
at the end; releases free the shared-memory leases a payload held; a dead
worker's unfinished requests fail. `ReceivePath` is mixed into Orchestrator
(core.py), whose state it reads and writes; the submit path lives there.
"""

from __future__ import annotations

import asyncio
import time

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec, leases_of
from omni_actors.bus.router_pair import Bus
from omni_actors.bus.shm import Arena, SegmentCache
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.errors import (
    REJECT_CODES,
    RequestAborted,
    RequestError,
    RequestRejected,
    StageFailed,
    WorkerDied,
)
from omni_actors.orchestrator.first_output import FirstOutputPriority
from omni_actors.orchestrator.latency import StageLatency
from omni_actors.orchestrator.launcher import WorkerHandle
from omni_actors.orchestrator.outputs import to_final
from omni_actors.orchestrator.requests import StageChunk
from omni_actors.orchestrator.runs import AbortWaits, LeaseKey, LeaseTable, Run
from omni_actors.orchestrator.supervisor import Supervisor
from omni_actors.workers.spec import HEARTBEAT_SUFFIX

log = logs.get(__name__)

ORCH_PRODUCER = "orch"
"""The producer name of the orchestrator's own shared-memory leases (request inputs)."""


class ReceivePath:
    """Workers' messages handled (mixed into Orchestrator; see the module docstring)."""

    pipeline: PipelineConfig
    supervisor: Supervisor
    router: Bus | None
    runs: dict[str, Run]
    leases: LeaseTable
    abort_waits: AbortWaits
    arena: Arena
    segments: SegmentCache
    codec: PayloadCodec
    counters: dict[str, int]
    stream_max_bytes: int
    _stream_peak_bytes: int
    _streamed: frozenset[int]
    _undecodable_peers: set[bytes]
    _idle: asyncio.Event
    first_outputs: dict[int, StageLatency]
    first_output: FirstOutputPriority

    def _send(self, run: Run, stage_id: int, msg: m.Message) -> None:
        raise NotImplementedError

    def _end(self, run: Run, error: RequestError | None = None) -> None:
        raise NotImplementedError

    # ---- leases ---------------------------------------------------------------

    def _free_lease(self, key: LeaseKey) -> None:
        producer, lease = key
        if producer == ORCH_PRODUCER:
            self.arena.free([lease])
            return
        h = self.supervisor.by_producer.get(producer)
        if h is not None and not h.dead and self.router is not None:
            self.router.send_nowait(h.identity, m.FreeLeases([lease]))

    def _release(self, keys: list[LeaseKey]) -> None:
        for key in keys:
            rid = self.leases.release(key)
            if rid is not None:
                run = self.runs.get(rid)
                if run is not None:
                    run.leases.discard(key)
                self._free_lease(key)

    def _free_payload(self, payload: m.Payload) -> None:
        for ref in leases_of(payload):
            self._free_lease((ref.producer, ref.lease))

    # ---- messages from workers ------------------------------------------------

    def _handle(self, identity: bytes) -> WorkerHandle | None:
        """The worker a bus identity belongs to: its own, or its heartbeat socket's (workers/io.py)."""
        h = self.supervisor.by_identity.get(identity)
        if h is None and identity.endswith(HEARTBEAT_SUFFIX):
            h = self.supervisor.by_identity.get(identity[: -len(HEARTBEAT_SUFFIX)])
        return h

    def _on_message(self, identity: bytes, msg: m.Message) -> None:
        h = self._handle(identity)
        if h is None:
            return
        self.supervisor.on_seen(h)
        match msg:
            case m.StageOutput():
                self._on_output(h, msg)
            case m.Release(leases=refs):
                self._release([(r.producer, r.lease) for r in refs])
            case m.Aborted(request_ids=rids):
                for rid in rids:
                    for key in self.abort_waits.answered((h.identity, rid)):
                        self._free_lease(key)
            case m.Heartbeat():
                self.supervisor.on_heartbeat(h, msg)
            case m.FirstOutput(active=active):
                self.first_output.on_claim(h, active, self.supervisor.by_identity.values())
            case m.Ready(pid=pid, info=info, startup=startup):
                if info.get("arrays") == "frames" and self.router is not None:
                    self.router.frames_peers.add(identity)
                self.supervisor.on_ready(h, pid, startup, info.get("capacity"))
            case m.StartFailed(error=error):
                self.supervisor.on_start_failed(h, error)
            case _:
                log.warning("orchestrator.unexpected_message", type=type(msg).__name__)

    def _on_unsendable(self, identity: bytes, msg: m.Message, err: Exception) -> None:
        """A request's message holds a value the bus cannot carry: that request fails, no other."""
        h = self._handle(identity)
        rid = getattr(msg, "request_id", None)
        log.error("bus.unsendable", type=type(msg).__name__, request_id=rid, error=repr(err))
        run = self.runs.get(rid) if isinstance(rid, str) else None
        if run is not None:
            stage_id = h.stage_id if h is not None else -1
            self._end(run, RequestRejected(stage_id, f"a request value cannot be sent to the stage: {err}"))

    def _on_undecodable(self, identity: bytes, body: bytes, err: Exception) -> None:
        """A frame the bus cannot decode (a peer of another version, a value our types refuse):
        its valid messages are still handled, and a request whose output it garbled fails now."""
        h = self._handle(identity)
        if identity not in self._undecodable_peers:  # once per peer: a broken peer would flood the log
            self._undecodable_peers.add(identity)
            log.error("bus.undecodable", peer=identity.decode(errors="replace"), bytes=len(body),
                      error=repr(err))
        if h is None:
            return
        good, bad = m.salvage(body)
        for msg in good:
            self._on_message(identity, msg)
        for rid in bad:
            run = self.runs.get(rid)
            if run is not None and rid in h.requests:
                self._end(run, StageFailed(h.stage_id, f"its output could not be decoded: {err}"))

    def _on_output(self, h: WorkerHandle, out: m.StageOutput) -> None:
        run = self.runs.get(out.request_id)
        sid = out.stage_id
        if run is None or sid not in run.started or sid in run.finished:
            self._free_payload(out.payload)  # a late output of an ended request
            return
        if out.error is not None:
            self._free_payload(out.payload)
            self._end(run, RequestRejected(sid, out.error, out.code if out.code in REJECT_CODES else None)
                      if out.rejected else StageFailed(sid, out.error))
            return
        payload = out.payload
        consumers = run.consumers[sid]
        has_data = bool(payload.data or payload.arrays)
        if has_data and sid not in run.answered:
            run.answered.add(sid)
            now = time.perf_counter()
            self.first_outputs[sid].record(now - run.t_submit, now - run.t_start.get(sid, run.t_submit))
        if sid in run.finals and (has_data or out.finished):
            data = self.codec.decode(payload, copy=True) if has_data else {}
            kind = self.pipeline.stage(sid).final_output_type
            chunk = StageChunk(sid, kind, data, out.finished, to_final(kind, data))
            if not run.stream.put_nowait(chunk):  # its reader stopped taking outputs
                self._free_payload(payload)
                self.counters["stream_overflows"] += 1
                log.warning("request.stream_overflow", request_id=run.rid, max_bytes=self.stream_max_bytes)
                self._end(run, RequestAborted(
                    f"request {run.rid} aborted: its client left more than {self.stream_max_bytes} bytes of "
                    "output unread (server.stream_buffer_mb)"))
                return
            self._stream_peak_bytes = max(self._stream_peak_bytes, run.stream.queued_bytes)
        refs = leases_of(payload)
        if consumers and refs:
            self.leases.hold(run, refs, users=len(consumers))
        elif refs:
            self._free_payload(payload)
        buffered = False
        for d in consumers:
            if d in self._streamed:
                if has_data or out.finished:
                    self._start_streaming(run, d)
                    self._send(run, d, m.Feed(run.rid, sid, payload, out.finished))
            elif has_data and not buffered:
                run.buffers.setdefault(sid, []).append(payload)
                buffered = True
        if out.finished:
            run.finished.add(sid)
            h.in_flight -= 1
            if sid not in run.finals and "prompt_tokens" in payload.data:  # (an AR stage's usage, at its end)
                run.stream.stage_tokens[sid] = (
                    int(payload.data["prompt_tokens"]), int(payload.data.get("completion_tokens") or 0))
            for d in consumers:
                if d not in self._streamed and run.ready_for_full_payload(d):
                    upstream = {s: run.buffers.get(s, []) for s in run.sources[d]}
                    self._send(run, d, m.AddRequest(run.rid, d, run.request_plain, run.params_for(d), upstream))
                    run.start(d)
            if len(run.finished) == len(run.plan):
                self._end(run)

    def _start_streaming(self, run: Run, sid: int) -> None:
        if sid not in run.started:
            run.start(sid)
            self._send(run, sid, m.AddRequest(
                run.rid, sid, run.request_plain, run.params_for(sid), streaming=True, sources=run.sources[sid]
            ))

    def _on_worker_death(self, h: WorkerHandle, detail: str) -> None:
        """Fail every unfinished run the dead worker served (the supervisor restarts it)."""
        for rid in list(h.requests):
            run = self.runs.get(rid)
            if run is not None and h.stage_id not in run.finished:
                self._end(run, WorkerDied(h.stage_id, h.replica, detail))
        for key in self.abort_waits.gone(h.identity):
            self._free_lease(key)
        self.segments.forget(h.shm_prefix)
        if self.router is not None:
            self.router.forget(h.identity)
            self.router.forget(h.identity + HEARTBEAT_SUFFIX)
