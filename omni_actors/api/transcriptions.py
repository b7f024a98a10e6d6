"""POST /v1/audio/transcriptions: speech to text, OpenAI's upload route (multipart/form-data).

Form fields:

    file             required: an audio file libsndfile reads (wav, flac, mp3, ogg) or, else,
                     FFmpeg does (m4a / mp4, webm, aac, ...), any rate, mixed to mono
    model            required: a served model name
    response_format  "json" (default: {"text", "usage"}) | "text" (text/plain) | "srt" | "vtt" |
                     "verbose_json" (segments with start/end; api/transcript_formats.py)
    timestamp_granularities[]
                     with verbose_json, repeatable: "segment" (default), "word" (adds `words`,
                     for pipelines whose recognizer times words: `PipelineConfig.transcript_words`;
                     "word" alone leaves `segments` out, as OpenAI does)
    stream           "true": SSE `transcript.text.delta` events, then `transcript.text.done`
                     (response_format json or text; its `usage` is null: OpenAI's is token usage, which
                     the SDK types as tokens only, and a duration there did not fit that type)
    language         ISO-639-1 ("en"; any case, a region subtag dropped) or Whisper's English name for it;
                     another value is a 400 naming `language` (transcript_formats.language_code), and the
                     recognizer is given the code. A stage that transcribes one language refuses others
                     (400). verbose_json reports the language the recognizer names (else this one) as
                     OpenAI does: its lower-case English name ("english"; transcript_formats.language_name)
    prompt, temperature
                     accepted for client compatibility, passed on as params
    chunking_strategy
                     "auto", or server_vad (`chunking_strategy[type]=server_vad` and its numbers, as the SDK
                     sends an object, or the object as JSON): checked, then left to the recognizer, which
                     windows long audio itself
    include[]        "logprobs": a 400 naming `include` (no recognizer here returns token logprobs)

What goes into the pipeline:

    inputs  {"audio": float32 mono, "sample_rate": int}
    params  {"modalities": ["transcript"], "language", "prompt", "temperature", "timestamps"}  (those sent;
            "timestamps": "segment" | "word" for the timed formats)

The pipeline must produce transcript outputs (typed TranscriptOutput, orchestrator/outputs.py). The body is read
here, not by the body middleware (a multipart upload is parsed as it streams):
with the same size limit (413) and time limit (408).

POST /v1/audio/translations (`translations`) reads and checks its form the same way and then says the
model cannot translate (a 400 naming `model`): no recognizer served here translates.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import decode_audio, off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    route_model,
)
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.multipart import BodyBudget, form_parts
from omni_actors.api.schemas import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_NAME_CHARS,
    Transcription,
    TranscriptionUsage,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from omni_actors.api.sse import respond
from omni_actors.api.transcript_formats import CONTENT_TYPES, TIMED_FORMATS, language_code, render
from omni_actors.orchestrator.outputs import TranscriptOutput

ROUTE = "/v1/audio/transcriptions"
FORMATS = ("json", "text", *TIMED_FORMATS)
GRANULARITIES = "timestamp_granularities"
CHUNKING = "chunking_strategy"
VAD_KEYS = ("type", "prefix_padding_ms", "silence_duration_ms", "threshold")
LIST_FIELDS = {GRANULARITIES + "[]": GRANULARITIES, GRANULARITIES: GRANULARITIES, "include[]": "include",
               "include": "include"}
"""Fields a form may repeat (the SDK sends a list as `name[]` parts, one per item); joined by ","."""
OBJECT_FIELDS = {f"{CHUNKING}[{key}]": f"{CHUNKING}.{key}" for key in VAD_KEYS}
"""An object's members as the SDK sends them (`name[key]` parts), kept as "name.key"."""
FIELDS = frozenset({"file", "model", "response_format", "stream", "language", "prompt", "temperature", CHUNKING,
                    *LIST_FIELDS, *OBJECT_FIELDS})
TRANSLATION_FIELDS = frozenset({"file", "model", "prompt", "response_format", "temperature"})
"""OpenAI's /v1/audio/translations form (the SDK's TranslationCreateParams)."""


async def _read_form(request: web.Request, allowed: frozenset[str] = FIELDS) -> tuple[dict[str, str], bytes]:
    """The text fields and the file's bytes, read under the server's body size (413) and time (408)
    limits; 400 naming a missing, unknown or repeated field, or saying why the body is not
    multipart/form-data this server can parse."""
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send the audio as "
                       "multipart/form-data with a `file` field", None, "unsupported_media_type")
    server = orchestrator(request).deploy.server
    try:
        async with asyncio.timeout(server.body_timeout_s):
            return await _parse_form(request, int(server.max_body_mb * 1024 * 1024), allowed)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {server.body_timeout_s:g} s", None,
                       "body_timeout", close=True) from None


async def _parse_form(request: web.Request, max_bytes: int, allowed: frozenset[str]) -> tuple[dict[str, str], bytes]:
    fields: dict[str, str] = {}
    upload: bytes | None = None
    budget = BodyBudget(max_bytes)
    async for part in form_parts(request):
        name = part.name or ""
        if name not in allowed:
            raise bad_request(f"unknown form field `{name}`; expected {sorted(allowed)}", name, "unknown_parameter")
        if name in LIST_FIELDS:
            name = LIST_FIELDS[name]
        elif (name := OBJECT_FIELDS.get(name, name)) in fields or (name == "file" and upload is not None):
            raise bad_request(f"form field `{part.name}` is given twice", part.name)
        data = await budget.read(part)
        if name == "file":
            upload = bytes(data)
        else:
            value = data.decode("utf-8", errors="replace").strip()
            fields[name] = f"{fields[name]},{value}" if name in fields else value
    if upload is None:
        raise bad_request("form field `file` is required (the audio to transcribe)", "file",
                          "missing_required_parameter")
    return fields, upload


def _options(fields: dict[str, str], words_ok: bool) -> tuple[str, bool, dict[str, Any]]:
    """(response_format, stream, params) from the text fields; 400 naming a bad one."""
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        raise bad_request(f"response_format {fmt!r} is not supported; expected one of {list(FORMATS)}",
                          "response_format", "unsupported_value")
    stream = fields.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise bad_request("stream must be true or false", "stream")
    if stream == "true" and fmt in TIMED_FORMATS:
        raise bad_request(f"stream=true sends transcript.text events; response_format {fmt!r} is not streamed "
                          "(use json or text, or leave stream out)", "stream")
    timestamps = _timestamps(fields, fmt, words_ok)
    _check_chunking(fields)
    if fields.get("include"):
        raise bad_request(f"include {fields['include'].split(',')} is not supported: no recognizer here returns "
                          "token logprobs", "include", "unsupported_value")
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
    language = language_code(fields["language"]) if fields.get("language") else None
    params = drop_none({"modalities": ["transcript"], "language": language,
                        "prompt": fields.get("prompt") or None, "temperature": temperature,
                        "timestamps": timestamps})
    return fmt, stream == "true", params


def _check_chunking(fields: dict[str, str]) -> None:
    """chunking_strategy: "auto" or a server_vad object (the SDK's `name[key]` parts, or JSON); 400 else."""
    vad: Any = {key.partition(".")[2]: value for key, value in fields.items() if key.startswith(CHUNKING + ".")}
    raw = fields.get(CHUNKING)
    if raw is not None and vad:
        raise bad_request(f"{CHUNKING} is given both as a value and as an object", CHUNKING)
    if raw == "auto" or (raw is None and not vad):
        return
    if raw is not None:
        try:
            vad = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            vad = None
    if not isinstance(vad, dict) or vad.get("type") != "server_vad" or set(vad) - set(VAD_KEYS):
        raise bad_request(f'{CHUNKING} takes "auto" or {{"type": "server_vad", "prefix_padding_ms", '
                          f'"silence_duration_ms", "threshold"}}, not {str(raw if raw is not None else vad)[:200]}',
                          CHUNKING, "invalid_value")
    for key, high in (("threshold", 1.0), ("prefix_padding_ms", math.inf), ("silence_duration_ms", math.inf)):
        try:
            value = float(vad.get(key, 0))
        except (TypeError, ValueError):
            value = math.nan
        if not 0 <= value <= high or value == math.inf:
            bound = "between 0 and 1" if high == 1.0 else "of milliseconds, at least 0"
            raise bad_request(f"{CHUNKING}.{key} must be a number {bound}", CHUNKING, "invalid_value")


def _timestamps(fields: dict[str, str], fmt: str, words_ok: bool) -> str | None:
    """What the stage is asked to time: None, "segment" or "word"."""
    asked = {g.strip() for g in fields.get(GRANULARITIES, "").split(",") if g.strip()}
    if asked - {"segment", "word"}:
        raise bad_request(f"timestamp_granularities takes segment and/or word, not {sorted(asked)}",
                          GRANULARITIES, "unsupported_value")
    if asked and fmt != "verbose_json":
        raise bad_request("timestamp_granularities needs response_format verbose_json", GRANULARITIES)
    if "word" in asked:
        if not words_ok:
            raise bad_request("this model's recognizer does not time words; ask for segment timestamps",
                              GRANULARITIES, "unsupported_value")
        return "word"
    return "segment" if fmt in TIMED_FORMATS else None


def _segments_asked(fields: dict[str, str]) -> bool:
    """Whether verbose_json has `segments`: unless timestamp_granularities names words alone (as OpenAI)."""
    asked = {g.strip() for g in fields.get(GRANULARITIES, "").split(",") if g.strip()}
    return not asked or "segment" in asked


async def transcriptions(request: web.Request) -> web.StreamResponse:
    fields, upload = await _read_form(request)
    if "model" not in fields:
        raise bad_request("form field `model` is required", "model", "missing_required_parameter")
    orch, _ = route_model(request, fields["model"], {"transcript"})
    fmt, stream, params = _options(fields, orch.pipeline.transcript_words)
    audio, rate = await off_loop(decode_audio, upload, None, "file")
    seconds = audio.size / rate
    async with PipelineCall(request, ROUTE, {"audio": audio, "sample_rate": rate}, params, {"transcript"}) as call:
        if stream:
            return await _stream(request, call)
        outputs = [out async for out in _outputs(call)]
    text = "".join(out.text for out in outputs).strip()
    if fmt in TIMED_FORMATS:
        body = render(fmt, text, outputs, seconds, params.get("language"), params.get("timestamps") == "word",
                      _segments_asked(fields))
        return web.Response(body=body, content_type=CONTENT_TYPES[fmt], charset="utf-8")
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain")
    body = Transcription(text, TranscriptionUsage("duration", int(np.ceil(seconds))))
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def translations(request: web.Request) -> web.Response:
    """POST /v1/audio/translations (speech to English text): no recognizer served here translates (each
    writes the language spoken; the assistant's Whisper is English-only). The form is read and checked as
    OpenAI's translation form (415, 413, 400 naming a field, 404 for an unknown model, 400 for a model
    without a recognizer), then the answer is a 400 naming `model` that says so, never "unknown route"."""
    fields, _ = await _read_form(request, TRANSLATION_FIELDS)
    if "model" not in fields:
        raise bad_request("form field `model` is required", "model", "missing_required_parameter")
    _, name = route_model(request, fields["model"], {"transcript"})
    raise bad_request(f"model {name!r} cannot translate: its recognizer writes the language spoken; "
                      f"POST {ROUTE} gives that transcript", "model", "unsupported_value")


async def _outputs(call: PipelineCall) -> AsyncIterator[TranscriptOutput]:
    async for chunk in call:
        if isinstance(chunk.output, TranscriptOutput):
            yield chunk.output


async def _pieces(call: PipelineCall) -> AsyncIterator[str]:
    """The transcript's non-empty deltas."""
    async for out in _outputs(call):
        if out.text:
            yield out.text


async def _stream(request: web.Request, call: PipelineCall) -> web.StreamResponse:
    """`transcript.text.delta` events as the text comes, then `transcript.text.done` (no `[DONE]`). The done
    event's `usage` is null: OpenAI's (and the SDK's `TranscriptionTextDoneEvent.usage`) is token usage only;
    before 2026-12-05 it carried the json answer's duration usage, which the SDK's type cannot hold
    (`usage.input_tokens` read None, and validating the event failed)."""
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
