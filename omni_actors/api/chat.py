"""POST /v1/chat/completions: OpenAI chat, streaming (SSE) or not, with text and audio out.

What goes into the pipeline:

    inputs  see chat_inputs.py: {"messages": [...], "audio"/"image"/...: arrays}
    params  {temperature, top_p, top_k, max_tokens, seed, stop (list), frequency_penalty,
             presence_penalty, repetition_penalty, voice, audio_format, modalities}
            (only the fields the client sent; `max_completion_tokens` wins over `max_tokens`)
    stages  planner's choice, else pipeline.stages_for_outputs(set(modalities))

What comes back: StageChunks with output_type "text" (data {"text": delta, optional
"finish_reason", "num_tokens" / "token_ids", "prompt_tokens"}) and "audio" (data
{"audio": float32 mono, "sample_rate", optional "transcript"}); other types are
not part of a chat answer and are skipped.

Streaming: `chat.completion.chunk` events, text in `delta.content`, audio in
`delta.audio` ({id, data: base64 in audio.format, transcript}) as it is made,
a last chunk with `finish_reason`, a usage chunk when
`stream_options.include_usage`, then `[DONE]`. Usage counts what the pipeline
reports, else one completion token per text delta.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import StreamEncoder, check_supported, encode_file, off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    require_model,
    require_outputs,
)
from omni_actors.api.chat_inputs import build_chat_inputs
from omni_actors.api.errors import bad_request, from_exception
from omni_actors.api.schemas import (
    ChatAudio,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    DeltaAudio,
    ResponseMessage,
    Usage,
    read_body,
)
from omni_actors.api.sse import SSEWriter
from omni_actors.errors import RequestError
from omni_actors.orchestrator.requests import StageChunk

ROUTE = "/v1/chat/completions"
AUDIO_TTL_S = 3600
"""`expires_at` of returned audio: now + this (the server keeps no audio; it is informational)."""


def chat_params(req: ChatCompletionRequest, modalities: list[str]) -> dict[str, Any]:
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    return drop_none({
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "max_tokens": req.max_completion_tokens or req.max_tokens, "seed": req.seed, "stop": stop,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "voice": req.audio.voice if req.audio else None,
        "audio_format": req.audio.format if req.audio and "audio" in modalities else None,
        "modalities": modalities,
    })


@dataclass
class Tally:
    """What a chat answer accumulated: text, audio, transcript, token counts."""

    text: list[str] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    transcript: list[str] = field(default_factory=list)
    sample_rate: int = 24000
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"

    def add_text(self, data: dict[str, Any]) -> str:
        delta = str(data.get("text", ""))
        self.text.append(delta)
        if "token_ids" in data:
            self.completion_tokens += len(data["token_ids"])
        else:
            self.completion_tokens += int(data.get("num_tokens", 1 if delta else 0))
        self.prompt_tokens = int(data.get("prompt_tokens", self.prompt_tokens))
        if data.get("finish_reason") == "length":
            self.finish_reason = "length"
        return delta

    def add_audio(self, data: dict[str, Any], keep: bool = True) -> tuple[np.ndarray, str | None]:
        """Count an audio chunk; `keep` it for the whole-clip answer (streaming sends it on instead)."""
        audio = np.asarray(data["audio"], dtype=np.float32).reshape(-1)
        self.sample_rate = int(data.get("sample_rate", self.sample_rate))
        if keep:
            self.audio.append(audio)
        transcript = data.get("transcript")
        if isinstance(transcript, str):
            self.transcript.append(transcript)
        return audio, transcript if isinstance(transcript, str) else None

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.prompt_tokens + self.completion_tokens)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    orch = orchestrator(request)
    req = await read_body(request, ChatCompletionRequest)
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format {req.response_format.type!r} is not supported: answers are plain "
                          "text (response_format 'text')", "response_format.type", "unsupported_value")
    model = require_model(orch, req.model)
    modalities = list(dict.fromkeys(req.modalities or ["text"]))
    require_outputs(orch, set(modalities), "modalities")
    want_audio = "audio" in modalities
    audio_format = req.audio.format if req.audio else "wav"
    if want_audio:
        check_supported("pcm" if audio_format == "pcm16" else audio_format)
    has_media = any(not isinstance(m.content, str | None) for m in req.messages)
    # Decoding media is real work (a thread); plain text is cheaper than the hop.
    inputs = await off_loop(build_chat_inputs, req.messages) if has_media else build_chat_inputs(req.messages)
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    call = PipelineCall(request, ROUTE, inputs, chat_params(req, modalities), set(modalities), cid)
    async with call:
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await _stream(request, call, cid, model, audio_format if want_audio else None,
                                 include_usage)
        return await _complete(call, cid, model, audio_format if want_audio else None)


async def _complete(call: PipelineCall, cid: str, model: str, audio_format: str | None) -> web.Response:
    tally = Tally()
    async for chunk in call:
        _accumulate(tally, chunk, audio_format)
    text = "".join(tally.text)
    audio = None
    if audio_format is not None:
        clip = np.concatenate(tally.audio) if tally.audio else np.zeros(0, np.float32)
        data = await off_loop(encode_file, clip, tally.sample_rate, audio_format)
        audio = ChatAudio(id=f"audio_{uuid.uuid4().hex[:24]}", data=base64.b64encode(data).decode(),
                          expires_at=int(time.time()) + AUDIO_TTL_S,
                          transcript="".join(tally.transcript) or text)
    message = ResponseMessage(role="assistant", content=text, audio=audio)
    body = ChatCompletion(id=cid, created=int(time.time()), model=model,
                          choices=[Choice(0, message, tally.finish_reason)], usage=tally.usage())
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _accumulate(tally: Tally, chunk: StageChunk, audio_format: str | None) -> None:
    if chunk.output_type == "text":
        tally.add_text(chunk.data)
    elif chunk.output_type == "audio" and audio_format is not None and "audio" in chunk.data:
        tally.add_audio(chunk.data)


async def _stream(request: web.Request, call: PipelineCall, cid: str, model: str,
                  audio_format: str | None, include_usage: bool) -> web.StreamResponse:
    created = int(time.time())
    tally = Tally()
    audio_id = f"audio_{uuid.uuid4().hex[:24]}"
    encoder: StreamEncoder | None = None

    def chunk_event(delta: Delta, finish: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=cid, created=created, model=model,
                                   choices=[ChunkChoice(0, delta, finish)])

    await call.started()  # an error before the first output keeps its HTTP status
    async with SSEWriter(request) as sse:
        await sse.send(chunk_event(Delta(role="assistant", content="")))
        try:
            async for chunk in call:
                if chunk.output_type == "text":
                    delta = tally.add_text(chunk.data)
                    if delta:
                        await sse.send(chunk_event(Delta(content=delta)))
                elif chunk.output_type == "audio" and audio_format is not None and "audio" in chunk.data:
                    audio, transcript = tally.add_audio(chunk.data, keep=False)
                    if encoder is None:
                        encoder = StreamEncoder(audio_format, tally.sample_rate)
                    data = await encoder.feed_async(audio)
                    await sse.send(chunk_event(Delta(audio=DeltaAudio(
                        id=audio_id, data=base64.b64encode(data).decode() if data else None,
                        transcript=transcript))))
        except RequestError as err:  # headers are out: report in-band
            return await sse.fail(from_exception(err))
        if audio_format is not None:
            tail = await off_loop(encoder.finish) if encoder is not None else b""
            await sse.send(chunk_event(Delta(audio=DeltaAudio(
                id=audio_id, data=base64.b64encode(tail).decode() if tail else None,
                expires_at=int(time.time()) + AUDIO_TTL_S))))
        await sse.send(chunk_event(Delta(), tally.finish_reason))
        if include_usage:
            await sse.send(ChatCompletionChunk(id=cid, created=created, model=model, choices=[],
                                               usage=tally.usage()))
        return await sse.done()

