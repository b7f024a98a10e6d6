"""POST /v1/audio/speech: text to speech, as one file, as chunked encoded audio, or as SSE.

What goes into the pipeline (speech_inputs.py resolves voice, instructions, speed, seed):

    inputs  {"text": input, "voice": a built-in name, ["instructions"],
             ["reference_audio", "reference_text"] for a custom voice}
    params  {["speed"] where the stages honour it, ["seed"]}
    stages  planner's choice, else pipeline.stages_for_outputs({"audio"})

Audio comes back as typed AudioOutput chunks (float32 mono, its rate;
orchestrator/outputs.py); anything else the stages emit, and chunks without
samples, are skipped. Where the stages have no speed knob, the API changes the
speed itself (speech_audio.py).

Response modes (every `response_format`: mp3, opus, aac, flac, wav, pcm; pcm is
24 kHz 16-bit mono, the others carry the model's rate, see speech_audio.py):
    default                  the whole file, with Content-Length and X-Sample-Rate
    stream: true or stream_format: "audio"
                             chunked transfer of encoded bytes as they are made (flac: at
                             the end, audio_codec.py says why), X-Sample-Rate in the headers,
                             which go out with the first audio
    stream_format: "sse"     `speech.audio.delta` events ({"audio": base64}) then
                             `speech.audio.done` with usage; no `[DONE]`; X-Sample-Rate too
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
from aiohttp import web

from omni_actors import logs
from omni_actors.api.audio_codec import wav_sized
from omni_actors.api.calls import PipelineCall, route_model
from omni_actors.api.errors import IN_BAND_ERROR, RESPONSE_STARTED, bad_request, from_exception
from omni_actors.api.schemas import (
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    SpeechUsage,
    read_body,
)
from omni_actors.api.speech_audio import TYPES, SpeechEncoder
from omni_actors.api.speech_inputs import require_speech_model, speech_call
from omni_actors.api.sse import respond
from omni_actors.audio import DEFAULT_SAMPLE_RATE
from omni_actors.errors import RequestError
from omni_actors.orchestrator.outputs import AudioOutput
from omni_actors.orchestrator.requests import StageChunk

log = logs.get(__name__)

ROUTE = "/v1/audio/speech"
MAX_INPUT_CHARS = 4096
"""Longest `input` (OpenAI's documented limit; the schema's 16384 let 4x that through, which no family speaks
within its frame budget). Longer text goes through the text-in socket (speech_stream.py), clause by clause."""


def speech_usage(words: int, chunks: int, tokens: list[dict[int, tuple[int, int]]]) -> SpeechUsage:
    """`speech.audio.done`'s usage: the tokens the pipeline's first AR stage took and made (text in,
    audio frames out) for each request, summed; for a pipeline without one (a vocoder voice), the
    input's words and the audio chunks sent."""
    firsts = [t[min(t)] for t in tokens if t]
    if not firsts:
        return SpeechUsage(words, chunks, words + chunks)
    took, made = sum(p for p, _ in firsts), sum(c for _, c in firsts)
    return SpeechUsage(took, made, took + made)


def audio_of(chunk: StageChunk) -> tuple[np.ndarray, int] | None:
    """(float32 mono, rate) of a chunk carrying audio samples; None for anything else."""
    out = chunk.output
    if not isinstance(out, AudioOutput) or not len(out.audio):
        return None
    return out.audio, out.sample_rate


class Encoding:
    """A response's encoder, made at the first chunk (its rate is the audio's)."""

    def __init__(self, fmt: str, speed: float, rate: int | None) -> None:
        self.fmt, self.speed, self.rate = fmt, speed, rate or DEFAULT_SAMPLE_RATE
        self.encoder: SpeechEncoder | None = None

    async def feed(self, audio: np.ndarray, rate: int) -> bytes:
        if self.encoder is None:
            self.encoder = SpeechEncoder(self.fmt, rate, self.speed)
        return await self.encoder.feed(audio)

    async def finish(self) -> bytes:
        return await self._made().finish()

    def _made(self) -> SpeechEncoder:
        if self.encoder is None:  # no audio yet: the stated rate
            self.encoder = SpeechEncoder(self.fmt, self.rate, self.speed)
        return self.encoder

    def headers(self) -> dict[str, str]:
        """Content-Type and X-Sample-Rate (the rate of the bytes sent), once the first audio came."""
        return {"Content-Type": TYPES[self.fmt], "X-Sample-Rate": str(self._made().out_rate)}


async def speech(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, SpeechRequest)
    orch, name = route_model(request, req.model, {"audio"})
    require_speech_model(orch, name)
    if len(req.input) > MAX_INPUT_CHARS:
        raise bad_request(f"input is {len(req.input)} characters; at most {MAX_INPUT_CHARS} can be spoken in one "
                          "request (split the text, or stream it through /v1/audio/speech/stream)", "input",
                          "string_above_max_length")
    if not req.input.strip():
        raise bad_request("input: there is nothing to say (only whitespace)", "input")
    what = await speech_call(request, orch.pipeline, req.input, req.voice, req.instructions, req.speed, req.seed)
    enc = Encoding(req.response_format, what.api_speed, what.sample_rate)
    async with PipelineCall(request, ROUTE, what.inputs, what.params, {"audio"}) as call:
        if req.stream_format == "sse":
            return await _sse(request, call, req, enc)
        if req.stream or req.stream_format == "audio":
            return await _chunked(request, call, enc)
        return await _whole(call, enc)


async def _whole(call: PipelineCall, enc: Encoding) -> web.Response:
    parts: list[bytes] = []
    async for chunk in call:
        got = audio_of(chunk)
        if got is not None:
            parts.append(await enc.feed(*got))
    parts.append(await enc.finish())
    body = b"".join(parts)
    if enc.fmt == "wav":  # the whole file: its header states the sizes (streamed ones cannot)
        body = wav_sized(body)
    return web.Response(body=body, headers=enc.headers())


async def _chunked(request: web.Request, call: PipelineCall, enc: Encoding) -> web.StreamResponse:
    """Encoded bytes as they are made. The headers wait for the first audio (its rate is
    X-Sample-Rate's), so an error before it keeps its HTTP status; a failure after the first
    byte cuts the connection (a truncated chunked body is how HTTP says "incomplete"), logged as one
    `speech.stream_cut` line with the error's code (counted in the error metrics as an in-band one)."""
    first = b""
    async for chunk in call:
        if (got := audio_of(chunk)) is not None:
            first = await enc.feed(*got)
            break
    resp = web.StreamResponse(headers={**enc.headers(), "Cache-Control": "no-cache"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    request[RESPONSE_STARTED] = True
    if first:
        await resp.write(first)
    try:
        async for chunk in call:
            got = audio_of(chunk)
            if got is not None and (data := await enc.feed(*got)):
                await resp.write(data)
    except RequestError as err:
        code = from_exception(err).code or "none"
        log.warning("speech.stream_cut", path=request.path, code=code, error=str(err))
        request[IN_BAND_ERROR] = code
        if request.transport is not None:
            request.transport.close()  # (no last chunk: the client reads an incomplete body)
        return resp
    if tail := await enc.finish():
        await resp.write(tail)
    await resp.write_eof()
    return resp


async def _sse(request: web.Request, call: PipelineCall, req: SpeechRequest, enc: Encoding) -> web.StreamResponse:
    """`speech.audio.delta` events as the audio is encoded, then `speech.audio.done` (no `[DONE]`).
    The stream opens at the first audio (X-Sample-Rate is its rate), so an error before it keeps
    its HTTP status."""
    chunks, first = 0, b""
    async for chunk in call:
        if (got := audio_of(chunk)) is not None:
            chunks, first = 1, await enc.feed(*got)
            break

    async def events() -> AsyncGenerator[Any, None]:
        nonlocal chunks
        if first:
            yield SpeechAudioDelta(audio=base64.b64encode(first).decode())
        async for chunk in call:
            if (got := audio_of(chunk)) is None:
                continue
            chunks += 1
            if data := await enc.feed(*got):
                yield SpeechAudioDelta(audio=base64.b64encode(data).decode())
        if tail := await enc.finish():
            yield SpeechAudioDelta(audio=base64.b64encode(tail).decode())
        assert call.stream is not None
        yield SpeechAudioDone(usage=speech_usage(len(req.input.split()), chunks, [call.stream.stage_tokens]))

    return await respond(request, events(), done=False, headers={"X-Sample-Rate": enc.headers()["X-Sample-Rate"]})
