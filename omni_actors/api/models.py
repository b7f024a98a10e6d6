"""GET /v1/models and /v1/models/{model}: the served model name(s), the pipeline behind them, its outputs,
and for a diffusion pipeline its `capabilities` (tasks, accepted inputs, output kind).

A request's `model` may be the deploy's `server.served_model_name` or the
pipeline's name; anything else is a 404 (`code` "model_not_found").
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from omni_actors.api.calls import orchestrator, require_model, served_model_names
from omni_actors.api.diffusion_caps import served_caps
from omni_actors.api.schemas import Model, ModelList

OWNER = "omni-actors"
STARTED_KEY = web.AppKey("started_at", float)
"""Unix time the app was built; reported as the models' `created`."""


def _model(request: web.Request, name: str) -> Model:
    pipe = orchestrator(request).pipeline
    return Model(id=name, created=int(request.app[STARTED_KEY]), owned_by=OWNER, pipeline=pipe.name,
                 output_types=sorted(pipe.output_types()), capabilities=served_caps(orchestrator(request)),
                 voices=list(pipe.speech.voices) if pipe.speech else None)


async def list_models(request: web.Request) -> web.Response:
    names = served_model_names(orchestrator(request))
    body = ModelList(data=[_model(request, n) for n in names])
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    name = require_model(orchestrator(request), request.match_info["model"])
    return web.Response(body=msgspec.json.encode(_model(request, name)), content_type="application/json")
