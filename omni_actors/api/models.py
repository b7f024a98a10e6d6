"""GET /v1/models and /v1/models/{model}: each served model name, the pipeline behind it, its outputs,
the optional API features it serves (`features`), and for a diffusion pipeline its `capabilities`
(tasks, accepted inputs, output kind).

A request's `model` may be any pipeline's `server.served_model_name` (or folder
name) or its pipeline's name (pipelines.py); anything else is a 404 (`code` "model_not_found").
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from omni_actors.api.diffusion_caps import served_caps
from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.api.realtime.duplex import session_limit
from omni_actors.api.schemas import Model, ModelList
from omni_actors.api.structured import guided
from omni_actors.api.tools import tool_parser
from omni_actors.orchestrator.core import Orchestrator

OWNER = "omni-actors"
STARTED_KEY = web.AppKey("started_at", float)
"""Unix time the app was built; reported as the models' `created`."""


def _model(request: web.Request, name: str, orch: Orchestrator) -> Model:
    pipe = orch.pipeline
    return Model(object="model", id=name, created=int(request.app[STARTED_KEY]), owned_by=OWNER, pipeline=pipe.name,
                 output_types=sorted(pipe.output_types()), capabilities=served_caps(orch),
                 voices=list(pipe.speech.voices) if pipe.speech else None,
                 custom_voices=pipe.speech.cloning if pipe.speech else None, features=_features(orch) or None,
                 session_limit=session_limit(orch) if pipe.duplex else None)


def _features(orch: Orchestrator) -> list[str]:
    pipe = orch.pipeline
    calls, json_out = tool_parser(pipe) is not None, guided(pipe)
    named = {"tools": calls, "json_output": json_out, "forced_tool_calls": calls and json_out,
             "word_timestamps": pipe.transcript_words, "full_duplex": pipe.duplex}
    return [name for name, served in named.items() if served]


async def list_models(request: web.Request) -> web.Response:
    pipelines = request.app[PIPELINES_KEY]
    body = ModelList(data=[_model(request, n, o) for n, o in pipelines.by_name.items()])
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    orch, name = request.app[PIPELINES_KEY].find(request.match_info["model"], set())
    return web.Response(body=msgspec.json.encode(_model(request, name, orch)), content_type="application/json")
