"""The aiohttp application, on the orchestrator's event loop.

    build_app(orchestrator) -> web.Application
"""

from __future__ import annotations

from aiohttp import web

from omni_actors.api import realtime
from omni_actors.orchestrator.core import Orchestrator

ORCH_KEY = web.AppKey("orchestrator", Orchestrator)


async def health(request: web.Request) -> web.Response:
    orch = request.app[ORCH_KEY]
    states = orch.health()
    bad = [sid for sid, ok in states.items() if not ok]
    if bad or orch.draining:
        names = {s.stage_id: s.model_stage for s in orch.pipeline.stages}
        return web.json_response(
            {"status": "unavailable", "draining": orch.draining,
             "unhealthy_stages": [{"stage_id": s, "model_stage": names[s]} for s in bad]},
            status=503,
        )
    return web.json_response({"status": "ok"})


def build_app(orch: Orchestrator) -> web.Application:
    app = web.Application(client_max_size=int(orch.deploy.server.max_body_mb * 1024 * 1024))
    app[ORCH_KEY] = orch
    app.router.add_get("/health", health)
    realtime.add_routes(app)
    return app
