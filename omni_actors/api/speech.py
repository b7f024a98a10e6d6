"""POST /v1/audio/speech: text to speech, as one file, as chunked encoded audio, or as SSE.

What goes into the pipeline (speech_inputs.py resolves voice, instructions, speed, seed):

    inputs  {"text": input, "voice": a built-in name, ["instructions"],
             ["reference_audio", "reference_text"] for a custom voice}
    params  {["speed"] where the stages honour it, ["seed"]}
    stages  planner's choice, else pipeline.stages_for_outputs({"audio"})

Audio chunks come back as StageChunk(output_type="audio", data={"audio": float32
mono, "sample_rate": int}); anything else the stages emit is skipped. Where the
stages have no speed knob, the API changes the speed itself (speech_audio.py).

Response modes (every `response_format`: mp3, opus, aac, flac, wav, pcm):
    default                  the whole file, with Content-Length
    stream: true or stream_format: "audio"
                             chunked transfer of encoded bytes as they are made
    stream_format: "sse"     `speech.audio.delta` events ({"audio": base64}) then
                             `speech.audio.done` with usage; no `[DONE]`
"""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from omni_actors.api.calls import PipelineCall, route_model
from omni_actors.api.errors import RESPONSE_STARTED, from_exception
from omni_actors.api.schemas import (
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    SpeechUsage,
    read_body,
)
from omni_actors.api.speech_audio import TYPES, SpeechEncoder
from omni_actors.api.speech_inputs import speech_call
from omni_actors.api.sse import SSEWriter
from omni_actors.errors import RequestError

ROUTE = "/v1/audio/speech"
DEFAULT_RATE = 24000


def audio_of(chunk) -> tuple[np.ndarray, int] | None:
    """(float32 mono, rate) of an audio StageChunk; None for anything else."""
    if chunk.output_type != "audio" or "audio" not in chunk.data:
        return None
    audio = np.asarray(chunk.data["audio"], dtype=np.float32).reshape(-1)
    return audio, int(chunk.data.get("sample_rate", DEFAULT_RATE))


class Encoding:
    """A response's encoder, made at the first chunk (its rate is the audio's)."""

    def __init__(self, fmt: str, speed: float, rate: int | None) -> None:
        self.fmt, self.speed, self.rate = fmt, speed, rate or DEFAULT_RATE
        self.encoder: SpeechEncoder | None = None

    async def feed(self, audio: np.ndarray, rate: int) -> bytes:
        if self.encoder is None:
            self.encoder = SpeechEncoder(self.fmt, rate, self.speed)
        return await self.encoder.feed(audio)

    async def finish(self) -> bytes:
        if self.encoder is None:
            self.encoder = SpeechEncoder(self.fmt, self.rate, self.speed)
        return await self.encoder.finish()


async def speech(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, SpeechRequest)
    orch, _ = route_model(request, req.model, {"audio"})
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
    return web.Response(body=b"".join(parts), content_type=TYPES[enc.fmt])


async def _chunked(request: web.Request, call: PipelineCall, enc: Encoding) -> web.StreamResponse:
    """Encoded bytes as they are made. A failure after the first byte cuts the connection
    (the status line is gone; a truncated chunked body is how HTTP says "incomplete")."""
    resp = web.StreamResponse(headers={"Content-Type": TYPES[enc.fmt], "Cache-Control": "no-cache"})
    resp.enable_chunked_encoding()
    await call.started()  # an error before the first output keeps its HTTP status
    await resp.prepare(request)
    request[RESPONSE_STARTED] = True
    async for chunk in call:
        got = audio_of(chunk)
        if got is not None and (data := await enc.feed(*got)):
            await resp.write(data)
    if tail := await enc.finish():
        await resp.write(tail)
    await resp.write_eof()
    return resp


async def _sse(request: web.Request, call: PipelineCall, req: SpeechRequest, enc: Encoding) -> web.StreamResponse:
    chunks = 0
    await call.started()  # an error before the first output keeps its HTTP status
    async with SSEWriter(request) as sse:
        try:
            async for chunk in call:
                got = audio_of(chunk)
                if got is None:
                    continue
                chunks += 1
                if data := await enc.feed(*got):
                    await sse.send(SpeechAudioDelta(audio=base64.b64encode(data).decode()))
        except RequestError as err:
            return await sse.fail(from_exception(err))
        if tail := await enc.finish():
            await sse.send(SpeechAudioDelta(audio=base64.b64encode(tail).decode()))
        words = len(req.input.split())
        await sse.send(SpeechAudioDone(usage=SpeechUsage(words, chunks, words + chunks)))
        return await sse.end()
