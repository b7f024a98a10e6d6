"""GET /openapi.json: an OpenAPI 3.1 document of what this server answers, from the msgspec structs.

The routes: openapi_routes.py (every route the app registers but the WebSockets and the
playground's page); the structs: those the handlers encode and decode.

Built once per app for the loaded pipeline, so it agrees with the server:

- only the routes whose outputs the pipeline produces are listed (no speech route
  for a text-only pipeline); the WebSockets are not OpenAPI operations;
- bearer auth is declared on an operation only when API keys are configured and
  the route is not public (`middleware.is_public`), and 401 is listed there;
- each response names the content types the route really sends: audio types by
  `response_format` for speech, `text/event-stream` for streamed answers, `text/plain`
  for a transcript with `response_format: "text"`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, get_args

import msgspec
from aiohttp import web

from omni_actors.api import schemas as s
from omni_actors.api.middleware import is_public
from omni_actors.api.openapi_routes import GENERATED_AUDIO, ROUTES, SSE, Form, Route
from omni_actors.config.pipeline import ExecutionType, PipelineConfig

REF = "#/components/schemas/{name}"

_JSON_ERRORS = {
    "400": "Invalid request (the `param` names the field)",
    "404": "Unknown model",
    "408": "Body not received in time",
    "413": "Body over the size limit",
    "415": "Unsupported Content-Type",
    "429": "A stage queue is full",
    "503": "A stage is unavailable",
    "504": "The request passed its deadline",
}

_EXTRA = (s.SpeechAudioDone, s.TranscriptTextDone, s.ErrorResponse)
_UPLOADS = {s.TranscriptionForm}
"""Request structs sent as multipart/form-data rather than JSON."""


def _ref(t: type) -> dict[str, str]:
    return {"$ref": REF.format(name=t.__name__)}


def _one_of(struct: Any) -> dict[str, Any]:
    """A struct's reference, or for a union of structs, any of theirs."""
    kinds = get_args(struct) or (struct,)
    return _ref(kinds[0]) if len(kinds) == 1 else {"anyOf": [_ref(k) for k in kinds]}


def _json_error(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": _ref(s.ErrorResponse)}}}


def _schema(ctype: str, struct: type | None) -> dict[str, Any]:
    if ctype == SSE and struct is not None:
        return _sse_event(struct)
    if struct is not None:
        return _one_of(struct)
    if ctype.split("/")[0] in ("audio", "image", "video"):
        return {"type": "string", "format": "binary"}
    return {"type": "object"} if ctype == "application/json" else {"type": "string"}


def _sse_event(struct: Any) -> dict[str, Any]:
    """One server-sent event: its `data` line is the JSON of `struct` (a union: any of its events),
    described as JSON Schema's encoded content."""
    content = _one_of(struct)
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": content},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }


def served_outputs(pipelines: Iterable[PipelineConfig]) -> frozenset[str]:
    """What the served pipelines make, for `served_routes`: their output types, and GENERATED_AUDIO
    where a pipeline with a DIFFUSION stage makes audio (/v1/audio/generations; a TTS pipeline's
    audio is speech, /v1/audio/speech)."""
    out: set[str] = set()
    for pipe in pipelines:
        types = pipe.output_types()
        out |= types
        if "audio" in types and any(st.execution_type is ExecutionType.DIFFUSION for st in pipe.stages):
            out.add(GENERATED_AUDIO)
    return frozenset(out)


def served_routes(outputs: Iterable[str]) -> list[Route]:
    have = set(outputs)
    return [r for r in ROUTES if r.needs <= have]


def _form_schema(form: Form) -> dict[str, Any]:
    props = {**{f: {"type": "string", "format": "binary"} for f in form.files},
             **{f: {"type": "string"} for f in form.fields}}
    return {"type": "object", "properties": props, "required": list(form.required)}


def _operation(route: Route, auth: bool) -> dict[str, Any]:
    name = re.sub(r"[{}]", "", route.path.strip("/").replace("/", "_")) or "root"
    op: dict[str, Any] = {"summary": route.summary, "operationId": f"{route.method}_{name}"}
    params: list[dict[str, Any]] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                    for p in re.findall(r"{(\w+)}", route.path)]
    for q in route.query:
        schema: dict[str, Any] = {"type": q.kind, **({"enum": list(q.choices)} if q.choices else {})}
        params.append({"name": q.name, "in": "query", "required": False, "description": q.description,
                       "schema": schema})
    if params:
        op["parameters"] = params
    if isinstance(route.request, Form):
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {
            "schema": _form_schema(route.request)}}}
    elif route.request is not None:
        ctype = "multipart/form-data" if route.request in _UPLOADS else "application/json"
        op["requestBody"] = {"required": True, "content": {ctype: {"schema": _ref(route.request)}}}
    out: dict[str, Any] = {"200": {"description": "OK", "content": {
        ctype: {"schema": _schema(ctype, struct)} for ctype, struct in route.ok.items()}}}
    for status, desc, struct in route.extra:
        out[status] = {"description": desc, "content": {"application/json": {"schema": _ref(struct)}}}
    if route.query:  # a query value it cannot use
        out.setdefault("400", _json_error(_JSON_ERRORS["400"]))
    if route.request is not None:
        for status, desc in _JSON_ERRORS.items():
            out.setdefault(status, _json_error(desc))
    if route.method == "post":
        out["500"] = _json_error("A stage engine failed for this request")
    if auth and not is_public(route.path):
        op["security"] = [{"bearer": []}, {"api-key": []}]
        out["401"] = _json_error("Missing or wrong API key")
    elif auth:
        op["security"] = []  # public: probes and scrapers carry no key
    op["responses"] = out
    return op


def build_openapi(title: str, version: str, outputs: Iterable[str], auth: bool) -> dict[str, Any]:
    """The document for a pipeline producing `outputs`, with API keys required when `auth`."""
    routes = served_routes(outputs)
    types = [k for r in routes for t in (r.request, *r.ok.values(), *(x[2] for x in r.extra))
             if t is not None and not isinstance(t, Form) for k in (get_args(t) or (t,))]
    _, components = msgspec.json.schema_components([*dict.fromkeys([*types, *_EXTRA])], ref_template=REF)
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method] = _operation(route, auth)
    doc: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
                           "components": {"schemas": components}}
    if auth:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "api-key": {"type": "apiKey", "in": "header", "name": "api-key"},
        }
    return doc


OPENAPI_KEY = web.AppKey("openapi", bytes)


async def openapi_route(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_KEY], content_type="application/json")
