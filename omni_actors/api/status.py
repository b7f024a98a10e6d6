"""GET /v1/status: the loaded pipelines as the playground draws them: stages, edges, replicas, load,
step time and each stage's share of first output.

The top level is the server's first pipeline (as with one pipeline); `pipelines`
lists every pipeline of the server, each in the same shape, in deploy order.

One JSON snapshot built from the orchestrator's `statistics()` and the pipeline's
topology; the playground polls nothing: it refetches when the user looks (and on a
slow timer while its pipeline view is open).
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from omni_actors.api.pipelines import PIPELINES_KEY, Pipelines
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.latency import summary_ms


class ReplicaStatus(msgspec.Struct, kw_only=True):
    replica: int
    ready: bool
    pid: int | None
    in_flight: int
    restarts: int
    steps: int
    """Engine steps done (as of the worker's last heartbeat; a restarted worker counts from 0)."""
    step_ms: float | None
    """The mean engine step so far (None before the first)."""


class StageStatus(msgspec.Struct, kw_only=True):
    stage_id: int
    name: str
    execution_type: str
    inputs: list[int]
    final_output_type: str | None
    healthy: bool
    queue_limit: int
    in_flight: int
    engine_requests: int
    step_ms: float | None
    """The mean engine step over the stage's replicas (None before the first)."""
    first_output_ms: float | None
    """The stage's share of a request's time to first output, p50 of recent requests: from the
    stage being started on a request to its first output (orchestrator/latency.py)."""
    replicas: list[ReplicaStatus]


class PipelineStatus(msgspec.Struct, kw_only=True):
    object: str = "pipeline.status"
    pipeline: str
    models: list[str]
    healthy: bool
    draining: bool
    uptime_s: float
    requests_in_flight: int
    requests_total: int
    requests_failed: int
    requests_aborted: int
    """Runs aborted (client gone, stream overflow, shutdown); /metrics: omni_orchestrator_requests_aborted_total."""
    worker_restarts: int
    gpu_sharing: str
    """How its GPU workers share a GPU: "mps" (the run's own MPS daemon), "time_slice", "none"."""
    stages: list[StageStatus]


class ServerStatus(PipelineStatus, kw_only=True):
    pipelines: list[PipelineStatus]
    """Every pipeline of the server (the top level repeats the first)."""


def pipeline_status(pipelines: Pipelines, orch: Orchestrator) -> PipelineStatus:
    stats = orch.statistics()
    pipe = orch.pipeline
    stages = []
    for st in stats.stages:
        spec = pipe.stage(st.stage_id)
        stages.append(StageStatus(
            stage_id=st.stage_id, name=st.model_stage, execution_type=str(spec.execution_type),
            inputs=list(spec.input_sources),
            final_output_type=spec.final_output_type if spec.final_output else None,
            healthy=st.healthy, queue_limit=st.queue_limit, in_flight=st.in_flight,
            engine_requests=st.engine_requests,
            step_ms=_mean_ms(sum(r.busy_s for r in st.replicas), sum(r.steps for r in st.replicas)),
            first_output_ms=summary_ms(orch.first_outputs[st.stage_id])["own_p50_ms"],
            replicas=[ReplicaStatus(replica=r.replica, ready=r.ready, pid=r.pid, in_flight=r.in_flight,
                                    restarts=r.restarts, steps=r.steps, step_ms=_mean_ms(r.busy_s, r.steps))
                      for r in st.replicas],
        ))
    return PipelineStatus(
        pipeline=pipe.name, models=pipelines.names_of(orch),
        healthy=all(s.healthy for s in stages) and not orch.draining, draining=orch.draining,
        uptime_s=round(stats.uptime_s, 3), requests_in_flight=stats.requests_in_flight,
        requests_total=stats.requests_total, requests_failed=stats.requests_failed,
        requests_aborted=stats.requests_aborted, worker_restarts=stats.worker_restarts,
        gpu_sharing=orch.gpu_sharing, stages=stages,
    )


def _mean_ms(busy_s: float, steps: int) -> float | None:
    return round(1000 * busy_s / steps, 2) if steps else None


async def status_route(request: web.Request) -> web.Response:
    pipelines = request.app[PIPELINES_KEY]
    each = [pipeline_status(pipelines, o) for o in pipelines.all]
    body = ServerStatus(**msgspec.structs.asdict(each[0]), pipelines=each)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
