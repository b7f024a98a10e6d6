"""GET /openapi.json: an OpenAPI 3.1 document generated from the msgspec structs in schemas.py."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api import schemas as s

REF = "#/components/schemas/{name}"

_JSON_ERRORS = {
    "400": "Invalid request (the `param` names the field)",
    "401": "Missing or wrong API key",
    "404": "Unknown model",
    "408": "Body not received in time",
    "413": "Body over the size limit",
    "415": "Unsupported Content-Type",
    "429": "A stage queue is full",
    "503": "A stage is unavailable",
    "504": "The request passed its deadline",
}

# (method, path, summary, request struct, {status: (description, content type, struct or None)})
_ROUTES: list[tuple[str, str, str, type | None, dict[str, tuple[str, str, type | None]]]] = [
    ("post", "/v1/chat/completions", "Chat completion (SSE when stream=true)", s.ChatCompletionRequest,
     {"200": ("A chat completion, or chat.completion.chunk events", "application/json", s.ChatCompletion)}),
    ("post", "/v1/audio/speech", "Text to speech", s.SpeechRequest,
     {"200": ("Audio in response_format (or speech.audio.* SSE events)", "application/octet-stream", None)}),
    ("post", "/v1/audio/transcriptions", "Speech to text (multipart/form-data upload)", s.TranscriptionForm,
     {"200": ("The transcript (or transcript.text.* SSE events)", "application/json", s.Transcription)}),
    ("post", "/v1/images/generations", "Text to image", s.ImageRequest,
     {"200": ("Generated images", "application/json", s.ImagesResponse)}),
    ("get", "/v1/models", "Served models", None, {"200": ("Model list", "application/json", s.ModelList)}),
    ("get", "/v1/models/{model}", "One served model", None, {"200": ("A model", "application/json", s.Model)}),
    ("get", "/health", "Readiness of every stage", None,
     {"200": ("Every stage ready", "application/json", s.Health),
      "503": ("Some stage not ready", "application/json", s.Health)}),
    ("get", "/metrics", "Prometheus metrics", None, {"200": ("Prometheus text", "text/plain", None)}),
]

_EXTRA = (s.ChatCompletionChunk, s.SpeechAudioDelta, s.SpeechAudioDone, s.TranscriptTextDelta,
          s.TranscriptTextDone, s.ErrorResponse)
_UPLOADS = {s.TranscriptionForm}
"""Request structs sent as multipart/form-data rather than JSON."""


def _ref(t: type) -> dict[str, str]:
    return {"$ref": REF.format(name=t.__name__)}


def build_openapi(title: str, version: str) -> dict[str, Any]:
    types = [t for *_, req, resp in _ROUTES for t in (req, *(x[2] for x in resp.values())) if t is not None]
    _, components = msgspec.json.schema_components([*dict.fromkeys([*types, *_EXTRA])], ref_template=REF)
    paths: dict[str, Any] = {}
    for method, path, summary, req, responses in _ROUTES:
        op: dict[str, Any] = {"summary": summary, "operationId": f"{method}_{path.strip('/').replace('/', '_')}"}
        if "{model}" in path:
            op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
        if req is not None:
            ctype = "multipart/form-data" if req in _UPLOADS else "application/json"
            op["requestBody"] = {"required": True, "content": {ctype: {"schema": _ref(req)}}}
        out: dict[str, Any] = {}
        for status, (desc, ctype, struct) in responses.items():
            schema = _ref(struct) if struct is not None else {"type": "string"}
            out[status] = {"description": desc, "content": {ctype: {"schema": schema}}}
        if req is not None or "{model}" in path:
            for status, desc in _JSON_ERRORS.items():
                out.setdefault(status, {"description": desc,
                                        "content": {"application/json": {"schema": _ref(s.ErrorResponse)}}})
        op["responses"] = out
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


OPENAPI_KEY = web.AppKey("openapi", bytes)


async def openapi_route(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_KEY], content_type="application/json")
