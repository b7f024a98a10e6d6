"""The orchestrator actor: routes requests through stage workers, on the event loop.

One receive path (the ROUTER's readiness callback; receive.py) dispatches each
message to a handler with `match`; handlers touch only this object's state and never block.
Nothing sleeps or polls: waits are on sockets, process exits, futures and
timers whose timeouts are named constants.

Public API (used by the HTTP layer and tests):
    orch = Orchestrator(deploy); await orch.start(); ...; await orch.stop()
    stream = orch.submit(RequestSpec(...))   # raises AdmissionError / StageUnavailable
    orch.feed(request_id, inputs, last)      # more input for a RequestSpec(streaming=True)
    async for chunk in stream: ...           # StageChunk; raises a RequestError once on failure
    orch.abort(request_id); orch.health(); orch.statistics(); await orch.wait_healthy()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

import zmq

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec, leases_of
from omni_actors.bus.router_pair import Bus, RouterPair
from omni_actors.bus.shm import Arena, SegmentCache, unlink_prefix
from omni_actors.bus.sockets import TCP_IO_THREADS, AsyncRouter, RuntimeDir
from omni_actors.config.deploy import DeployConfig
from omni_actors.config.deploy_checks import validate_against_pipeline
from omni_actors.config.pipeline import PipelineConfig, resolve
from omni_actors.errors import (
    AdmissionError,
    ConfigError,
    RequestAborted,
    RequestError,
    RequestTimeout,
    StageUnavailable,
)
from omni_actors.orchestrator import mps
from omni_actors.orchestrator.first_output import FirstOutputPriority
from omni_actors.orchestrator.latency import StageLatency
from omni_actors.orchestrator.launcher import Launcher, WorkerHandle, make_launcher
from omni_actors.orchestrator.mps import MpsDaemon
from omni_actors.orchestrator.receive import ORCH_PRODUCER, ReceivePath
from omni_actors.orchestrator.requests import RequestSpec, RequestStream
from omni_actors.orchestrator.runs import AbortWaits, LeaseTable, Run
from omni_actors.orchestrator.stats import Statistics, snapshot
from omni_actors.orchestrator.supervisor import (
    HEARTBEAT_TIMEOUT_S,
    RESTART_READY_TIMEOUT_S,
    Supervisor,
    sweep_stale_runtime_dirs,
    sweep_stale_segments,
)
from omni_actors.settings import detect_platform, settings

log = logs.get(__name__)

DRAIN_TIMEOUT_S = 30.0
"""Longest wait for in-flight requests at graceful shutdown."""


class Orchestrator(ReceivePath):
    def __init__(
        self,
        deploy: DeployConfig,
        pipeline: PipelineConfig | None = None,
        endpoint: str | None = None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        restart_timeout_s: float = RESTART_READY_TIMEOUT_S,
        **supervision: float,
    ) -> None:
        """`supervision`: the Supervisor's other thresholds (unresponsive_after_s, ...), for tests."""
        self.deploy = deploy
        self.pipeline = pipeline or validate_against_pipeline(deploy)
        self.platform = detect_platform()
        self._endpoint_override = endpoint
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # The main process's pid is in every segment name, so a later run can
        # remove what a killed one left behind (sweep_stale_segments).
        self.run_prefix = f"omni-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.runs: dict[str, Run] = {}
        self.supervisor = Supervisor(
            deploy, self.pipeline, self._on_worker_death, heartbeat_timeout_s, restart_timeout_s, **supervision
        )
        self.workers = self.supervisor.workers
        self.leases = LeaseTable()
        self.abort_waits = AbortWaits()
        self.segments = SegmentCache(settings().shm_idle_s)
        self.arena = Arena(f"{self.run_prefix}-{ORCH_PRODUCER}", idle_s=settings().shm_idle_s)
        self._trimmer: asyncio.TimerHandle | None = None
        self.codec = PayloadCodec(ORCH_PRODUCER, self.arena, self.segments)
        self._planner = resolve(self.pipeline.planner) if self.pipeline.planner else None
        # Stages fed chunk by chunk: async chunk is on and the stage has a chunk processor;
        # every other downstream stage gets its sources' full payload at the end.
        self._streamed = frozenset(
            s.stage_id for s in self.pipeline.stages
            if deploy.async_chunk and s.input_sources and s.chunk_processor
        )
        self._idle = asyncio.Event()
        self._idle.set()
        self._started_at = time.monotonic()
        self._closing = False
        self.counters = {"total": 0, "failed": 0, "aborted": 0, "stream_overflows": 0}
        self.stream_max_bytes = int(deploy.server.stream_buffer_mb * 1024 * 1024)
        self._stream_peak_bytes = 0
        self.first_outputs = {sid: StageLatency() for sid in self.pipeline.stage_ids}
        self.runtime: RuntimeDir | None = None
        self.router: Bus | None = None
        self.launcher: Launcher | None = None
        self._zmq: zmq.Context | None = None
        self._undecodable_peers: set[bytes] = set()
        self.first_output = FirstOutputPriority(deploy, self.platform, self._send_to)
        self.mps: MpsDaemon | None = None
        """The run's own MPS daemon, while its GPU workers share one (deploy `gpu_sharing`)."""

    # ---- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start every worker and wait until all are Ready (StartupError names the stage that failed)."""
        swept = sweep_stale_segments()
        if swept:
            log.info("shm.swept_stale", segments=swept)
        swept = sweep_stale_runtime_dirs(settings().runtime_parent)
        if swept:
            log.info("runtime.swept_stale", dirs=swept)
        self.runtime = RuntimeDir()
        try:  # whatever fails from here (a bus endpoint that cannot be bound, a stage), nothing is left
            self._zmq = zmq.Context(TCP_IO_THREADS if self.deploy.cluster.backend == "ray" else 1)
            self.launcher = launcher = make_launcher(self.deploy, self.pipeline, self.run_prefix, self.platform)
            await launcher.open(self._zmq)  # (ray: reach the cluster, check resources, make the bus keys)
            endpoint = self._endpoint_override or launcher.bus_endpoint(self.runtime)
            local = launcher.local_endpoint(self.runtime) if self._endpoint_override is None else None
            try:
                if local is not None:  # (ray: this node's workers on ipc, the others on tcp + CURVE)
                    assert launcher.auth is not None
                    self.router = RouterPair(
                        self._zmq, endpoint, local, self._on_message, self._on_unsendable, self._on_undecodable,
                        auth=launcher.auth, segments=self.segments,
                    )
                else:
                    self.router = AsyncRouter(
                        self._zmq, endpoint, self._on_message, self._on_unsendable, self._on_undecodable,
                        auth=launcher.auth, segments=self.segments,
                    )
            except zmq.ZMQError as err:
                if self._endpoint_override is None and self.deploy.cluster.bus_host is not None:
                    raise ConfigError(
                        f"{self.deploy.source}: cluster.bus_host: cannot listen on {endpoint}: {err}"
                    ) from None
                raise
            self.router.start()
            launcher.set_bound(self.router.endpoint, local)
            await self._start_mps(launcher)
            await self.supervisor.start_all(launcher)
            self._arm_trimmer()
        except BaseException:
            await self.stop(drain=False)
            raise

    async def _start_mps(self, launcher: Launcher) -> None:
        assert self.runtime is not None
        devices, why = mps.wanted(self.deploy, self.pipeline.stage_ids, self.platform)
        if not devices:
            log.debug("mps.not_started", reason=why)
            return
        daemon = MpsDaemon(self.runtime.path, devices)
        try:
            await daemon.start()
        except RuntimeError as err:
            if self.deploy.gpu_sharing == "mps":
                raise ConfigError(f"{self.deploy.source}: gpu_sharing: mps: {err}") from None
            log.warning("mps.unavailable", reason=str(err), fallback="time-sliced")
            return
        self.mps = daemon
        launcher.gpu_env = daemon.env

    @property
    def gpu_sharing(self) -> str:
        """How this run's GPU workers share their GPUs: "mps", "time_slice", or "none" (no GPU)."""
        if self.mps is not None:
            return "mps"
        return "time_slice" if mps.gpu_devices(self.deploy, self.pipeline.stage_ids, self.platform) else "none"

    @property
    def draining(self) -> bool:
        """True from the start of shutdown: no new requests, /health answers 503."""
        return self.supervisor.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.supervisor.draining = value
        self.supervisor.update_health()

    async def stop(self, drain: bool = True) -> None:
        """Drain (optionally), end every worker, remove sockets and shared memory."""
        if self._closing:
            return
        self.draining = True
        if drain and self.runs:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_TIMEOUT_S):
                    await self._idle.wait()
        self._closing = True
        if self._trimmer is not None:
            self._trimmer.cancel()
        self.abort_all()
        await self.supervisor.stop_all(self.router)
        if self.router is not None:
            self.router.close()
        if self.launcher is not None:
            await self.launcher.close()
        if self.mps is not None:
            await self.mps.stop()
        if self._zmq is not None:
            self._zmq.term()
        self.segments.close()
        self.arena.close()
        unlink_prefix(self.run_prefix)
        if self.runtime is not None:
            self.runtime.close()

    def abort_all(self) -> None:
        """End every in-flight request now; a `stop` waiting for them to drain goes on at once."""
        for rid in list(self.runs):
            self._end(self.runs[rid], RequestAborted("server shutting down"))

    def _arm_trimmer(self) -> None:
        self._trimmer = asyncio.get_running_loop().call_later(settings().shm_idle_s / 2, self._trim_shm)

    def _trim_shm(self) -> None:
        """Give back this process's shared-memory segments and mappings idle past settings().shm_idle_s."""
        self.arena.trim()
        self.segments.trim()
        if not self._closing:
            self._arm_trimmer()

    # ---- health and statistics ----------------------------------------------------

    def health(self) -> dict[int, bool]:
        return self.supervisor.health()

    async def wait_healthy(self, timeout_s: float) -> None:
        await self.supervisor.wait_healthy(timeout_s)

    def statistics(self) -> Statistics:
        return snapshot(self, uptime_s=time.monotonic() - self._started_at, stream_peak_bytes=self._stream_peak_bytes)

    # ---- requests ------------------------------------------------------------------

    def plan(self, spec: RequestSpec) -> tuple[int, ...]:
        if spec.stages is not None:
            plan = tuple(s for s in self.pipeline.stage_ids if s in set(spec.stages))
        elif self._planner is not None:
            plan = tuple(self._planner(self.pipeline, spec))
        else:
            plan = self.pipeline.stage_ids
        if not plan:
            raise ValueError("request selects no stage of the pipeline")
        return plan

    def submit(self, spec: RequestSpec) -> RequestStream:
        """Admit a request and start its entry stages; its outputs arrive on the returned stream."""
        if self.draining:
            raise StageUnavailable(self.pipeline.stage_ids[0])
        if spec.request_id in self.runs:
            raise ValueError(f"duplicate request id {spec.request_id}")
        plan = self.plan(spec)
        chosen: dict[int, WorkerHandle] = {}
        for sid in plan:
            ready = [h for h in self.workers[sid] if self.supervisor.serving(h)]
            if not ready:
                raise StageUnavailable(sid)
            best = min(ready, key=lambda h: h.in_flight)
            limit = self.deploy.stage(sid).queue_limit
            if best.in_flight >= limit:
                raise AdmissionError(sid, limit * len(ready))
            chosen[sid] = best
        in_plan = set(plan)
        sources = {s: tuple(x for x in self.pipeline.stage(s).input_sources if x in in_plan) for s in plan}
        consumers = {s: tuple(d for d in plan if s in sources[d]) for s in plan}
        finals = frozenset(s for s in plan if self.pipeline.stage(s).final_output)
        inputs = self.codec.encode(spec.inputs)
        run = Run(
            spec=spec, stream=RequestStream(spec.request_id, self.abort, self.stream_max_bytes), plan=plan,
            sources=sources,
            consumers=consumers, finals=finals or frozenset({plan[-1]}), replicas=chosen,
            request_plain=m.Payload(data=inputs.data),
        )
        run.stream.plan = plan
        self.runs[spec.request_id] = run
        self._idle.clear()
        self.counters["total"] += 1
        for h in chosen.values():
            h.in_flight += 1
            h.requests.add(spec.request_id)
        entries = [s for s in plan if not sources[s]]
        self.leases.hold(run, leases_of(inputs), users=len(entries))
        for sid in entries:
            if spec.streaming:
                add = m.AddRequest(spec.request_id, sid, inputs, run.params_for(sid), streaming=True,
                                   sources=(m.CLIENT_SOURCE,))
            else:
                add = m.AddRequest(spec.request_id, sid, inputs, run.params_for(sid))
            self._send(run, sid, add)
            run.start(sid)
        if spec.deadline_s is not None:
            run.deadline = asyncio.get_running_loop().call_later(
                spec.deadline_s, self._on_deadline, spec.request_id
            )
        return run.stream

    def feed(self, request_id: str, inputs: dict, last: bool = False) -> bool:
        """Send more input to a streaming request's entry stages; False if the request has ended."""
        run = self.runs.get(request_id)
        if run is None or not run.spec.streaming:
            return False
        payload = self.codec.encode(inputs)
        entries = [s for s in run.plan if not run.sources[s] and s not in run.finished]
        refs = leases_of(payload)
        if refs:
            self.leases.hold(run, refs, users=len(entries))
        for sid in entries:
            self._send(run, sid, m.Feed(request_id, m.CLIENT_SOURCE, payload, last))
        return True

    def abort(self, request_id: str) -> None:
        run = self.runs.get(request_id)
        if run is not None:
            self._end(run, RequestAborted(f"request {request_id} aborted"))

    def _on_deadline(self, request_id: str) -> None:
        run = self.runs.get(request_id)
        if run is not None:
            self._end(run, RequestTimeout(f"request {request_id} passed its deadline"))

    def _send_to(self, identity: bytes, msg: m.Message) -> None:
        if self.router is not None:
            self.router.send_nowait(identity, msg)

    def _send(self, run: Run, stage_id: int, msg: m.Message) -> None:
        assert self.router is not None
        self.router.send_nowait(run.replicas[stage_id].identity, msg)

    def _end(self, run: Run, error: RequestError | None = None) -> None:
        """The one way a run ends: abort what still runs, free leases and slots, end the stream."""
        if self.runs.pop(run.rid, None) is None:
            return
        if run.deadline:
            run.deadline.cancel()
        waiters: set[tuple[bytes, str]] = set()
        for sid in run.plan:
            h = run.replicas[sid]
            if sid not in run.finished:
                h.in_flight -= 1
                if sid in run.started and not h.dead and error is not None:
                    self._send(run, sid, m.Abort([run.rid]))
                    waiters.add((h.identity, run.rid))
            h.requests.discard(run.rid)
        keys = list(run.leases)
        for key in keys:
            self.leases.drop(key)
        if waiters and keys:  # an input sent before the Abort may be unread yet: freed on its answer
            self.abort_waits.park(waiters, keys)
        else:
            for key in keys:
                self._free_lease(key)
        run.leases.clear()
        run.buffers.clear()
        if error is not None:
            self.counters["aborted" if isinstance(error, RequestAborted) else "failed"] += 1
        run.stream.finish_nowait(error)
        if not self.runs:
            self._idle.set()
