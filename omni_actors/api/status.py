"""GET /v1/status: the loaded pipeline as the playground draws it: stages, edges, replicas, load.

One JSON snapshot built from the orchestrator's `statistics()` and the pipeline's
topology; the playground polls nothing: it refetches when the user looks (and on a
slow timer while its pipeline view is open).
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from omni_actors.api.calls import orchestrator, served_model_names


class ReplicaStatus(msgspec.Struct, kw_only=True):
    replica: int
    ready: bool
    pid: int | None
    in_flight: int
    restarts: int


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
    worker_restarts: int
    stages: list[StageStatus]


async def status_route(request: web.Request) -> web.Response:
    orch = orchestrator(request)
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
            replicas=[ReplicaStatus(replica=r.replica, ready=r.ready, pid=r.pid, in_flight=r.in_flight,
                                    restarts=r.restarts) for r in st.replicas],
        ))
    body = PipelineStatus(
        pipeline=pipe.name, models=served_model_names(orch),
        healthy=all(s.healthy for s in stages) and not orch.draining, draining=orch.draining,
        uptime_s=round(stats.uptime_s, 3), requests_in_flight=stats.requests_in_flight,
        requests_total=stats.requests_total, requests_failed=stats.requests_failed,
        worker_restarts=stats.worker_restarts, stages=stages,
    )
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
