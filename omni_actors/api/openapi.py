"""GET /openapi.json: an OpenAPI 3.1 document of what this server answers, from the msgspec structs.

The structs: schemas.py and chat_schemas.py.

Built once per app for the loaded pipeline, so it agrees with the server:

- only the routes whose outputs the pipeline produces are listed (no speech route
  for a text-only pipeline); the realtime WebSocket is not an OpenAPI operation;
- bearer auth is declared on an operation only when API keys are configured and
  the route is not public (`middleware.PUBLIC_PATHS`), and 401 is listed there;
- each response names the content types the route really sends: audio types by
  `response_format` for speech, `text/event-stream` for streamed answers, `text/plain`
  for a transcript with `response_format: "text"`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_args

import msgspec
from aiohttp import web

from omni_actors.api import chat_schemas as cs
from omni_actors.api import responses_schemas as rs
from omni_actors.api import schemas as s
from omni_actors.api.middleware import PUBLIC_PATHS
from omni_actors.api.speech_audio import TYPES as SPEECH_TYPES

REF = "#/components/schemas/{name}"
SSE = "text/event-stream"

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
_SPEECH_TYPES = sorted(set(SPEECH_TYPES.values()))
"""What /v1/audio/speech answers, one content type per response_format (api/speech_audio.py)."""


@dataclass(frozen=True)
class _Route:
    method: str
    path: str
    summary: str
    request: type | None
    ok: dict[str, Any]
    """Content type -> schema of the 200 answer (None: a string / binary body)."""
    needs: frozenset[str] = frozenset()
    """Output types the pipeline must produce for the route to be served."""
    extra: tuple[tuple[str, str, type], ...] = ()
    """Other answers: (status, description, schema), sent as JSON."""


_ROUTES = (
    _Route("post", "/v1/chat/completions", "Chat completion (chat.completion.chunk events when stream=true)",
           cs.ChatCompletionRequest, {"application/json": cs.ChatCompletion, SSE: cs.ChatCompletionChunk},
           frozenset({"text"})),
    _Route("post", "/v1/audio/speech", "Text to speech: audio in response_format (speech.audio.* events "
           "when stream_format=sse)", s.SpeechRequest,
           {**dict.fromkeys(_SPEECH_TYPES), SSE: s.SpeechAudioDelta | s.SpeechAudioDone}, frozenset({"audio"})),
    _Route("post", "/v1/audio/transcriptions", "Speech to text (multipart/form-data upload; "
           "transcript.text.* events when stream=true)", s.TranscriptionForm,
           {"application/json": s.Transcription | s.TranscriptionVerbose, "text/plain": None,
            "application/x-subrip": None, "text/vtt": None, SSE: s.TranscriptTextDelta | s.TranscriptTextDone},
           frozenset({"transcript"})),
    _Route("post", "/v1/responses", "Responses API (response.* events when stream=true)", rs.ResponseRequest,
           {"application/json": rs.Response, SSE: rs.StreamEvent}, frozenset({"text"})),
    _Route("post", "/v1/images/generations", "Text to image", s.ImageRequest,
           {"application/json": s.ImagesResponse, SSE: s.ImageStreamEvent}, frozenset({"image"})),
    _Route("get", "/v1/models", "Served models", None, {"application/json": s.ModelList}),
    _Route("get", "/v1/models/{model}", "One served model", None, {"application/json": s.Model},
           extra=(("404", "Unknown model", s.ErrorResponse),)),
    _Route("get", "/health", "Readiness of every stage", None, {"application/json": s.Health},
           extra=(("503", "Some stage not ready", s.Health),)),
    _Route("get", "/metrics", "Prometheus metrics", None, {"text/plain": None}),
    _Route("get", "/openapi.json", "This document", None, {"application/json": None}),
)

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
    if ctype.startswith("audio/"):
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


def served_routes(outputs: Iterable[str]) -> list[_Route]:
    have = set(outputs)
    return [r for r in _ROUTES if r.needs <= have]


def _operation(route: _Route, auth: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": route.summary,
                          "operationId": f"{route.method}_{route.path.strip('/').replace('/', '_')}"}
    if "{model}" in route.path:
        op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    if route.request is not None:
        ctype = "multipart/form-data" if route.request in _UPLOADS else "application/json"
        op["requestBody"] = {"required": True, "content": {ctype: {"schema": _ref(route.request)}}}
    out: dict[str, Any] = {"200": {"description": "OK", "content": {
        ctype: {"schema": _schema(ctype, struct)} for ctype, struct in route.ok.items()}}}
    for status, desc, struct in route.extra:
        out[status] = {"description": desc, "content": {"application/json": {"schema": _ref(struct)}}}
    if route.request is not None:
        for status, desc in _JSON_ERRORS.items():
            out.setdefault(status, _json_error(desc))
    if route.method == "post":
        out["500"] = _json_error("A stage engine failed for this request")
    if auth and route.path not in PUBLIC_PATHS:
        op["security"] = [{"bearer": []}, {"api-key": []}]
        out["401"] = _json_error("Missing or wrong API key")
    elif auth:
        op["security"] = []  # public: probes and scrapers carry no key
    op["responses"] = out
    return op


def build_openapi(title: str, version: str, outputs: Iterable[str], auth: bool) -> dict[str, Any]:
    """The document for a pipeline producing `outputs`, with API keys required when `auth`."""
    routes = served_routes(outputs)
    types = [k for r in routes for t in (r.request, *r.ok.values(), *(x[2] for x in r.extra)) if t is not None
             for k in (get_args(t) or (t,))]
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
