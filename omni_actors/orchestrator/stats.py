"""Immutable statistics snapshots of the orchestrator (what /metrics exports)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_actors.orchestrator.core import Orchestrator


@dataclass(frozen=True)
class ReplicaStats:
    replica: int
    ready: bool
    pid: int | None
    in_flight: int
    """Requests the orchestrator has routed here and not seen finish."""
    engine_requests: int
    """Requests the worker last reported holding (sent after each abort and heartbeat)."""
    leases_out: int
    """Shared-memory leases of the worker's arena not yet given back (last report)."""
    restarts: int
    steps: int = 0
    """Engine steps the worker reported done (its last heartbeat; a restarted worker counts from 0)."""
    step_s: float = 0.0
    """How long the running step has run (0: none), from the last heartbeat (at most one interval old)."""
    startup: dict[str, float] = field(default_factory=dict)
    """Seconds per start-up phase of this replica's worker ({} before its Ready): "ready" (spawn ->
    Ready, seen by the orchestrator), "boot", "imports", "engine", "total" and "engine.<name>"
    (launcher.WorkerHandle.startup_seconds)."""
    busy_s: float = 0.0
    """Seconds in completed engine steps (last heartbeat; a restarted worker counts from 0)."""
    step_counts: tuple[int, ...] = ()
    """Completed steps per duration bucket (bus.messages.STEP_BUCKETS_S, then one past the last)."""


@dataclass(frozen=True)
class StageStats:
    stage_id: int
    model_stage: str
    healthy: bool
    queue_limit: int
    in_flight: int
    engine_requests: int
    replicas: tuple[ReplicaStats, ...]
    first_output: tuple[tuple[str, int], ...] = ()
    """Cumulative histogram (upper bound in s, count) of stage start -> the stage's first output with
    data, over every request it answered (latency.py)."""
    first_output_sum_s: float = 0.0


@dataclass(frozen=True)
class Statistics:
    uptime_s: float
    requests_in_flight: int
    requests_total: int
    requests_failed: int
    requests_aborted: int
    messages_in: int
    messages_out: int
    frames_in: int
    frames_out: int
    loop_wakeups: int
    frames_undecodable: int
    """Frames from workers the bus could not decode."""
    leases_held: int
    arena_segments: int
    worker_restarts: int
    stream_bytes_queued: int
    """Final outputs the orchestrator holds that their readers have not taken yet."""
    stream_bytes_peak: int
    """The most any one request's stream has held unread (bounded by server.stream_buffer_mb)."""
    stream_overflows: int
    """Requests aborted because their reader left more than that unread."""
    first_output_holds: int
    """Holds sent to workers while a worker sharing their device made a first output
    (deploy first_output_priority)."""
    stages: tuple[StageStats, ...]

    def stage(self, stage_id: int) -> StageStats:
        return next(s for s in self.stages if s.stage_id == stage_id)


def snapshot(orch: Orchestrator, uptime_s: float, stream_peak_bytes: int) -> Statistics:
    """The orchestrator's counters, stages and replicas now, as one immutable snapshot."""
    stages = []
    now = time.monotonic()
    for spec in orch.pipeline.stages:
        lat = orch.first_outputs[spec.stage_id]
        reps = tuple(
            ReplicaStats(h.replica, orch.supervisor.serving(h), h.pid, h.in_flight, h.engine_requests,
                         h.leases_out, orch.supervisor.restarts.get((spec.stage_id, h.replica), 0),
                         h.steps, h.step_running_s(now), h.startup_seconds(), busy_s=h.busy_s,
                         step_counts=tuple(h.step_counts))
            for h in orch.workers[spec.stage_id]
        )
        stages.append(StageStats(
            stage_id=spec.stage_id, model_stage=spec.model_stage, healthy=any(r.ready for r in reps),
            queue_limit=orch.deploy.stage(spec.stage_id).queue_limit,
            in_flight=sum(r.in_flight for r in reps),
            engine_requests=sum(r.engine_requests for r in reps), replicas=reps,
            first_output=tuple(lat.buckets()), first_output_sum_s=lat.total_s,
        ))
    r = orch.router
    return Statistics(
        uptime_s=uptime_s,
        requests_in_flight=len(orch.runs), requests_total=orch.counters["total"],
        requests_failed=orch.counters["failed"], requests_aborted=orch.counters["aborted"],
        messages_in=r.messages_in if r else 0, messages_out=r.messages_out if r else 0,
        frames_in=r.frames_in if r else 0, frames_out=r.frames_out if r else 0,
        loop_wakeups=r.wakeups if r else 0, frames_undecodable=r.frames_undecodable if r else 0,
        leases_held=len(orch.leases) + len(orch.abort_waits),
        arena_segments=orch.arena.segments, worker_restarts=sum(orch.supervisor.restarts.values()),
        stream_bytes_queued=sum(run.stream.queued_bytes for run in orch.runs.values()),
        stream_bytes_peak=stream_peak_bytes, stream_overflows=orch.counters["stream_overflows"],
        first_output_holds=orch.first_output.holds, stages=tuple(stages),
    )
