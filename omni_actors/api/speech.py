"""POST /v1/audio/speech: text to speech, as one file, as chunked raw audio, or as SSE.

What goes into the pipeline:

    inputs  {"text": input, "voice", "instructions", "speed"}   (only the fields sent)
    params  {}
    stages  planner's choice, else pipeline.stages_for_outputs({"audio"})

Audio chunks come back as StageChunk(output_type="audio", data={"audio": float32
mono, "sample_rate": int}); anything else the stages emit is skipped.

Response modes:
    default                  the whole file in `response_format`, with Content-Length
    stream: true             chunked transfer of `response_format` bytes as they are made
    stream_format: "sse"     `speech.audio.delta` events ({"audio": base64}) then
                             `speech.audio.done` with usage; no `[DONE]`
"""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import (
    CONTENT_TYPES,
    StreamEncoder,
    check_supported,
    encode_file,
    off_loop,
)
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    require_model,
    require_outputs,
)
from omni_actors.api.errors import RESPONSE_STARTED, from_exception
from omni_actors.api.schemas import (
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    SpeechUsage,
    read_body,
)
from omni_actors.api.sse import SSEWriter
from omni_actors.errors import RequestError

ROUTE = "/v1/audio/speech"


def _audio_of(chunk) -> tuple[np.ndarray, int] | None:
    if chunk.output_type != "audio" or "audio" not in chunk.data:
        return None
    audio = np.asarray(chunk.data["audio"], dtype=np.float32).reshape(-1)
    return audio, int(chunk.data.get("sample_rate", 24000))


async def speech(request: web.Request) -> web.StreamResponse:
    orch = orchestrator(request)
    req = await read_body(request, SpeechRequest)
    require_model(orch, req.model)
    require_outputs(orch, {"audio"}, "model")
    check_supported(req.response_format)
    inputs = drop_none({"text": req.input, "voice": req.voice, "instructions": req.instructions,
                        "speed": req.speed})
    async with PipelineCall(request, ROUTE, inputs, {}, {"audio"}) as call:
        if req.stream_format == "sse":
            return await _sse(request, call, req)
        if req.stream:
            return await _chunked(request, call, req.response_format)
        return await _whole(call, req.response_format)


async def _whole(call: PipelineCall, fmt: str) -> web.Response:
    clips: list[np.ndarray] = []
    rate = 24000
    async for chunk in call:
        got = _audio_of(chunk)
        if got is not None:
            clips.append(got[0])
            rate = got[1]
    clip = np.concatenate(clips) if clips else np.zeros(0, np.float32)
    body = await off_loop(encode_file, clip, rate, fmt)
    return web.Response(body=body, content_type=CONTENT_TYPES[fmt])


async def _chunked(request: web.Request, call: PipelineCall, fmt: str) -> web.StreamResponse:
    """Raw audio bytes as they are encoded. A failure after the first byte cuts the connection
    (the status line is gone; a truncated chunked body is how HTTP says "incomplete")."""
    resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[fmt], "Cache-Control": "no-cache"})
    resp.enable_chunked_encoding()
    encoder: StreamEncoder | None = None
    async for chunk in call:
        got = _audio_of(chunk)
        if got is None:
            continue
        if encoder is None:
            encoder = StreamEncoder(fmt, got[1])
        data = await encoder.feed_async(got[0])
        if not resp.prepared:
            await resp.prepare(request)
            request[RESPONSE_STARTED] = True
        if data:
            await resp.write(data)
    tail = await off_loop(encoder.finish) if encoder is not None else await off_loop(encode_file, np.zeros(0, np.float32), 24000, fmt)
    if not resp.prepared:
        await resp.prepare(request)
        request[RESPONSE_STARTED] = True
    if tail:
        await resp.write(tail)
    await resp.write_eof()
    return resp


async def _sse(request: web.Request, call: PipelineCall, req: SpeechRequest) -> web.StreamResponse:
    encoder: StreamEncoder | None = None
    chunks = 0
    await call.started()  # an error before the first output keeps its HTTP status
    async with SSEWriter(request) as sse:
        try:
            async for chunk in call:
                got = _audio_of(chunk)
                if got is None:
                    continue
                if encoder is None:
                    encoder = StreamEncoder(req.response_format, got[1])
                data = await encoder.feed_async(got[0])
                chunks += 1
                if data:
                    await sse.send(SpeechAudioDelta(audio=base64.b64encode(data).decode()))
        except RequestError as err:
            return await sse.fail(from_exception(err))
        tail = await off_loop(encoder.finish) if encoder is not None else b""
        if tail:
            await sse.send(SpeechAudioDelta(audio=base64.b64encode(tail).decode()))
        words = len(req.input.split())
        await sse.send(SpeechAudioDone(usage=SpeechUsage(words, chunks, words + chunks)))
        return await sse.end()
