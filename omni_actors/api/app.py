"""The aiohttp application, on the orchestrator's event loop: routes and middleware wired together.

    build_app(orchestrator) -> web.Application
    build_app([orch_a, orch_b]) -> web.Application    several pipelines, routed by `model` (pipelines.py)

    GET  /health                    200 when every stage of every pipeline has a ready worker, else 503 naming them
    GET  /metrics                   Prometheus text (metrics.py)
    GET  /openapi.json              OpenAPI 3.1 from the msgspec structs (openapi.py)
    GET  /                          the browser playground (playground.py, static files)
    GET  /v1/status                 each pipeline's stages, replicas and load (status.py)
    GET  /v1/models[/{model}]       models.py
    POST /v1/chat/completions       chat.py
    /v1/chat/completions...         chat_stored.py (stored completions: list, retrieve, update, delete, messages)
    POST /v1/completions            completions.py (legacy text completions of a raw prompt)
    POST /v1/audio/speech           speech.py
    POST /v1/images/generations     images.py
    POST /v1/images/edits           image_edits.py
    GET  /v1/files/images/{name}    image_files.py   (response_format "url")
    /v1/files...                    files.py (uploads: create, list, retrieve, content, delete)
    /v1/batches...                  batches.py (JSONL request files run in the background: create, list,
                                    retrieve, cancel; resumed after a restart)
    /v1/videos...                   videos.py (jobs: create, list, retrieve, delete, content, sync, remix),
                                    video_derive.py (extensions; edits, refused)
    POST /v1/audio/generations      audio_generation.py (alias /v1/audio/generate)
    GET  /v1/realtime               the realtime package (WebSocket)

Middleware, outermost first: metrics (counts every answer), errors (OpenAI-style
bodies), auth (API keys), body limit (413 before reading). The app cancels a
handler when its client disconnects (`handler_cancellation`), which is how a
dropped connection aborts its request in every stage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec
from aiohttp import web

from omni_actors import __version__
from omni_actors.api import (
    audio_generation,
    batches,
    chat,
    completions,
    files,
    image_files,
    not_served,
    playground,
    realtime,
    responses,
    videos,
)
from omni_actors.api.calls import ORCH_KEY
from omni_actors.api.errors import error_middleware
from omni_actors.api.image_edits import image_edits
from omni_actors.api.images import generations
from omni_actors.api.loading import LOADING_KEY, RETRY_AFTER_S, Loading, loading_middleware
from omni_actors.api.metrics import METRICS_KEY, ApiMetrics, metrics_middleware, metrics_route
from omni_actors.api.middleware import auth_middleware, body_limit_middleware
from omni_actors.api.models import STARTED_KEY, get_model, list_models
from omni_actors.api.openapi import OPENAPI_KEY, build_openapi, openapi_route, served_outputs
from omni_actors.api.pipelines import PIPELINES_KEY, Pipelines, model_id
from omni_actors.api.schemas import Health, UnhealthyStage
from omni_actors.api.speech import speech
from omni_actors.api.speech_stream import speech_stream
from omni_actors.api.status import status_route
from omni_actors.api.transcriptions import transcriptions, translations
from omni_actors.api.voices import add_routes as add_voice_routes
from omni_actors.orchestrator.core import Orchestrator

__all__ = ["ORCH_KEY", "build_app"]


async def health(request: web.Request) -> web.Response:
    pipelines = request.app[PIPELINES_KEY]
    if request.app[LOADING_KEY].active:
        waiting = [UnhealthyStage(s.stage_id, s.model_stage, model_id(o) if len(pipelines.all) > 1 else None)
                   for o in pipelines.all for s in o.pipeline.stages if not o.health().get(s.stage_id)]
        body = Health(status="loading", unhealthy_stages=waiting)
        return web.Response(body=msgspec.json.encode(body), status=503, content_type="application/json",
                            headers={"Retry-After": str(RETRY_AFTER_S)})
    bad, draining = [], False
    for orch in pipelines.all:
        draining = draining or orch.draining
        names = {s.stage_id: s.model_stage for s in orch.pipeline.stages}
        name = model_id(orch) if len(pipelines.all) > 1 else None
        bad += [UnhealthyStage(s, names[s], name) for s, ok in orch.health().items() if not ok]
    if bad or draining:
        body = Health(status="unavailable", draining=draining, unhealthy_stages=bad)
        return web.Response(body=msgspec.json.encode(body), status=503, content_type="application/json")
    return web.Response(body=msgspec.json.encode(Health(status="ok")), content_type="application/json")


def build_app(orch: Orchestrator | Sequence[Orchestrator]) -> web.Application:
    """The app for one pipeline, or for several (each its own orchestrator; the first is the default)."""
    pipelines = Pipelines([orch] if isinstance(orch, Orchestrator) else orch)
    orch = pipelines.default
    server = orch.deploy.server
    max_bytes = int(server.max_body_mb * 1024 * 1024)
    app = web.Application(
        client_max_size=max_bytes,
        handler_args={"handler_cancellation": True},
        middlewares=[
            metrics_middleware,
            error_middleware,
            auth_middleware(list(server.api_keys)),
            loading_middleware(lambda request: request.app[PIPELINES_KEY].all),
            body_limit_middleware(max_bytes, server.body_timeout_s),
        ],
    )
    app[LOADING_KEY] = Loading()
    app[ORCH_KEY] = orch
    app[PIPELINES_KEY] = pipelines
    app[METRICS_KEY] = ApiMetrics(pipelines)
    app[STARTED_KEY] = time.time()
    outputs = served_outputs(o.pipeline for o in pipelines.all)
    app[OPENAPI_KEY] = msgspec.json.encode(build_openapi("omni-actors", __version__, outputs,
                                                         auth=bool(server.api_keys)))
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_route)
    app.router.add_get("/openapi.json", openapi_route)
    app.router.add_get("/v1/status", status_route)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)  # (an id may hold a slash)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/speech/stream", speech_stream)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", image_edits)
    chat.add_routes(app)
    image_files.add_routes(app)
    files.add_routes(app)
    realtime.add_routes(app)
    playground.add_routes(app)
    videos.add_routes(app)
    audio_generation.add_routes(app)
    responses.add_routes(app)
    completions.add_routes(app)
    batches.add_routes(app)
    not_served.add_routes(app)
    add_voice_routes(app)
    return app
