"""POST /v1/audio/transcriptions: speech to text, OpenAI's upload route (multipart/form-data).

Form fields:

    file             required: an audio file libsndfile reads (wav, flac, mp3, ogg), any
                     rate, mixed to mono
    model            required: a served model name
    response_format  "json" (default: {"text", "usage"}) | "text" (text/plain)
    stream           "true": SSE `transcript.text.delta` events, then `transcript.text.done`
    language         ISO-639-1; a stage that transcribes one language refuses others (400)
    prompt, temperature
                     accepted for client compatibility, passed on as params

What goes into the pipeline:

    inputs  {"audio": float32 mono, "sample_rate": int}
    params  {"modalities": ["transcript"], "language", "prompt", "temperature"}  (those sent)

The pipeline must produce transcript outputs (typed TranscriptOutput, orchestrator/outputs.py). The body is read
here, not by the body middleware (a multipart upload is parsed as it streams):
with the same size limit (413) and time limit (408).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
import numpy as np
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from omni_actors.api.audio_codec import decode_audio, off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    route_model,
)
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.multipart import BodyBudget
from omni_actors.api.schemas import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_NAME_CHARS,
    Transcription,
    TranscriptionUsage,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from omni_actors.api.sse import respond
from omni_actors.orchestrator.outputs import TranscriptOutput

ROUTE = "/v1/audio/transcriptions"
FORMATS = ("json", "text")
FIELDS = frozenset({"file", "model", "response_format", "stream", "language", "prompt", "temperature"})


MULTIPART_ERRORS = (ValueError, AssertionError, LookupError, HttpProcessingError, web.RequestPayloadError)
"""What aiohttp's multipart reader raises on a body it cannot parse (no or an over-long boundary,
control characters or too many headers in a part, a body cut short, ...)."""


async def _read_form(request: web.Request, max_bytes: int) -> tuple[dict[str, str], bytes]:
    """The text fields and the file's bytes; 400 naming a missing, unknown or repeated field, or
    saying why the body is not multipart/form-data this server can parse."""
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send the audio as "
                       "multipart/form-data with a `file` field", None, "unsupported_media_type")
    try:
        return await _parse_form(request, max_bytes)
    except MULTIPART_ERRORS as err:
        detail = err.message if isinstance(err, HttpProcessingError) else str(err)
        raise ApiError(400, f"cannot parse the multipart/form-data body: {detail[:200]}", None,
                       "invalid_multipart", close=True) from None


async def _parse_form(request: web.Request, max_bytes: int) -> tuple[dict[str, str], bytes]:
    fields: dict[str, str] = {}
    upload: bytes | None = None
    budget = BodyBudget(max_bytes)
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise bad_request("nested multipart parts are not accepted; send each field as its own part",
                              None, "invalid_multipart")
        name = part.name or ""
        if not name:
            raise bad_request("a form part has no name (Content-Disposition: form-data; name=...)", None,
                              "invalid_multipart")
        if name not in FIELDS:
            raise bad_request(f"unknown form field `{name}`; expected {sorted(FIELDS)}", name, "unknown_parameter")
        if name in fields or (name == "file" and upload is not None):
            raise bad_request(f"form field `{name}` is given twice", name)
        data = await budget.read(part)
        if name == "file":
            upload = bytes(data)
        else:
            fields[name] = data.decode("utf-8", errors="replace").strip()
    if upload is None:
        raise bad_request("form field `file` is required (the audio to transcribe)", "file",
                          "missing_required_parameter")
    return fields, upload


def _options(fields: dict[str, str]) -> tuple[str, bool, dict[str, Any]]:
    """(response_format, stream, params) from the text fields; 400 naming a bad one."""
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        raise bad_request(f"response_format {fmt!r} is not supported; expected one of {list(FORMATS)}",
                          "response_format", "unsupported_value")
    stream = fields.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise bad_request("stream must be true or false", "stream")
    temperature = None
    if "temperature" in fields:
        try:
            temperature = float(fields["temperature"])
        except ValueError:
            temperature = -1.0
        if not 0.0 <= temperature <= 1.0:
            raise bad_request("temperature must be a number between 0 and 1", "temperature")
    for name, limit in (("language", MAX_NAME_CHARS), ("prompt", MAX_INSTRUCTIONS_CHARS)):
        if len(fields.get(name, "")) > limit:
            raise bad_request(f"{name} is longer than {limit} characters", name)
    params = drop_none({"modalities": ["transcript"], "language": fields.get("language") or None,
                        "prompt": fields.get("prompt") or None, "temperature": temperature})
    return fmt, stream == "true", params


async def transcriptions(request: web.Request) -> web.StreamResponse:
    orch = orchestrator(request)
    server = orch.deploy.server
    max_bytes = int(server.max_body_mb * 1024 * 1024)
    try:
        fields, upload = await asyncio.wait_for(_read_form(request, max_bytes), server.body_timeout_s)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {server.body_timeout_s:g} s", None,
                       "body_timeout", close=True) from None
    if "model" not in fields:
        raise bad_request("form field `model` is required", "model", "missing_required_parameter")
    route_model(request, fields["model"], {"transcript"})
    fmt, stream, params = _options(fields)
    audio, rate = await off_loop(decode_audio, upload, None, "file")
    seconds = audio.size / rate
    async with PipelineCall(request, ROUTE, {"audio": audio, "sample_rate": rate}, params, {"transcript"}) as call:
        if stream:
            return await _stream(request, call)
        text = "".join([piece async for piece in _pieces(call)])
    text = text.strip()
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain")
    body = Transcription(text, TranscriptionUsage("duration", int(np.ceil(seconds))))
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def _pieces(call: PipelineCall) -> AsyncIterator[str]:
    """The transcript's non-empty deltas."""
    async for chunk in call:
        if isinstance(chunk.output, TranscriptOutput) and chunk.output.text:
            yield chunk.output.text


async def _stream(request: web.Request, call: PipelineCall) -> web.StreamResponse:
    """`transcript.text.delta` events as the text comes, then `transcript.text.done` (no `[DONE]`)."""
    await call.started()  # an error before the first output keeps its HTTP status

    async def events() -> AsyncGenerator[Any, None]:
        parts: list[str] = []
        async for piece in _pieces(call):
            if not parts:
                piece = piece.lstrip()
            parts.append(piece)
            yield TranscriptTextDelta(delta=piece)
        yield TranscriptTextDone(text="".join(parts).strip())

    return await respond(request, events(), done=False)
