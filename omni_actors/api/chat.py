"""POST /v1/chat/completions: OpenAI chat, streaming (SSE) or not, with text and audio out.

What goes into the pipeline:

    inputs  see chat_inputs.py: {"messages": [...], "audio"/"image"/...: arrays}, plus "tools" where the
            pipeline can call them (api/tools.py says which, and the answer's `tool_calls` shapes)
    params  {temperature, top_p, top_k, max_tokens, seed, stop (list), frequency_penalty,
             presence_penalty, repetition_penalty, voice, audio_format, modalities}
            (only the fields the client sent; `max_completion_tokens` wins over `max_tokens`)
    stages  planner's choice, else pipeline.stages_for_outputs(set(modalities))

What comes back: StageChunks whose typed `output` is a TextOutput (delta, token
counts, finish_reason) or an AudioOutput (float32 mono, rate, transcript piece);
other outputs are not part of a chat answer and are skipped.

Streaming: `chat.completion.chunk` events, text in `delta.content`, audio in
`delta.audio` ({id, data: base64 in audio.format, transcript}) as it is made,
a last chunk with `finish_reason`, a usage chunk when
`stream_options.include_usage`, then `[DONE]`. Usage counts what the pipeline
reports, else one completion token per text delta.

`n` (1-8) choices: each is its own pipeline request (with a seed, choice i gets
seed + i); choices are indexed in the answer and interleaved as they come when
streamed, each with its own finish chunk; usage counts the prompt once. Any
choice's error ends the whole answer and aborts the others.

Fields client libraries send for features no model here has (chat_schemas.py lists them): accepted with
no effect where OpenAI's models without the feature take them (`prompt_cache_key`, `prompt_cache_options` but
`prewarm`, a part's `prompt_cache_breakpoint`, `safety_identifier`, `service_tier`, answered "default",
`prediction`), a 400 naming the field where ignoring it would mislead
(`check_unserved`: a reasoning effort, a verbosity but "medium", log-probabilities; `web_search_options`,
`logit_bias`, `moderation`, the deprecated `functions` and `function_call`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api import sse
from omni_actors.api.audio_codec import (
    DEFAULT_SAMPLE_RATE,
    StreamEncoder,
    check_supported,
    encode_file,
    off_loop,
)
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    route_model,
)
from omni_actors.api.chat_inputs import build_chat_inputs, chat_param, file_ids
from omni_actors.api.chat_schemas import (
    ChatAudio,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    DeltaAudio,
    PromptCacheOptions,
    ResponseMessage,
    Usage,
)
from omni_actors.api.errors import bad_request
from omni_actors.api.files import file_bytes
from omni_actors.api.schemas import read_body
from omni_actors.api.speech_inputs import listed_voice
from omni_actors.api.structured import guided_params
from omni_actors.api.tools import (
    StreamedCalls,
    check_tool_messages,
    check_tools,
    delta_tool_parts,
    message_tool_calls,
    stage_tools,
    tools_refusal,
    unshown,
)
from omni_actors.errors import RequestError
from omni_actors.orchestrator.outputs import AudioOutput, TextOutput, ToolCallOutput, ToolCallPart
from omni_actors.orchestrator.requests import StageChunk

ROUTE = "/v1/chat/completions"
AUDIO_TTL_S = 3600
"""`expires_at` of returned audio: now + this (the server keeps no audio; it is informational)."""
MERGE_QUEUE_CHUNKS = 16
"""Outputs of `n` > 1 choices waiting to be sent, before their pumps wait."""


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
    sample_rate: int = DEFAULT_SAMPLE_RATE
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCallOutput, ...] = ()
    tool_content: str | None = None
    forced: bool = False
    """A forced `tool_choice` guided the answer (params["tool_calls_forced"]): its text is the calls' JSON,
    never content, so `content` is null, as in OpenAI's answers that call. Cut by max_tokens before a
    call's name, it answers no call, content null and finish_reason "length": the model wrote no call
    (a made-up one, even of a named function, would have a client run it with arguments that are not
    JSON), and OpenAI shows nothing of what a budget went on before the answer (its reasoning) either."""
    one_call: bool = False
    """`parallel_tool_calls: false` (params["one_tool_call"]): the answer keeps its first call only,
    whole and streamed, however many the parser read (OpenAI makes at most one)."""
    most_calls: int | None = None
    """The Responses API's `max_tool_calls`: the answer keeps its first this many calls, whole and streamed
    (OpenAI ignores any call past it)."""
    parts: tuple[ToolCallPart, ...] = ()
    """The pieces of calls in the last delta added (the first call's only, with `one_call`)."""
    read: StreamedCalls = field(default_factory=StreamedCalls)
    """With tools offered: the calls as the parser read them while the answer was written."""
    shown: list[str] = field(default_factory=list)
    """With tools offered: the text the parser read as no call."""

    @classmethod
    def of(cls, params: dict[str, Any], most_calls: int | None = None) -> Tally:
        """A tally for an answer to a pipeline call with these params (and `max_tool_calls`)."""
        return cls(forced=bool(params.get("tool_calls_forced")), one_call=bool(params.get("one_tool_call")),
                   most_calls=most_calls)

    @property
    def cap(self) -> int | None:
        """Most calls the answer keeps (None: all)."""
        return 1 if self.one_call else self.most_calls

    def add_text(self, out: TextOutput) -> str:
        if not self.forced:
            self.text.append(out.text)
        cap = self.cap
        self.parts = out.tool_parts if cap is None else tuple(p for p in out.tool_parts if p.index < cap)
        self.read.add(self.parts)
        self.shown.append(out.shown)
        self.completion_tokens += out.tokens
        if out.prompt_tokens is not None:
            self.prompt_tokens = out.prompt_tokens
        if out.finish_reason == "length":
            self.finish_reason = "length"
        if out.tool_calls:  # (the answer's last delta; see api/tools.py)
            self.tool_calls = out.tool_calls if cap is None else out.tool_calls[:cap]
            self.tool_content = out.content
            self.finish_reason = "length" if out.finish_reason == "length" else "tool_calls"  # (a call cut short)
        elif out.finish_reason == "length" and self.read.calls:
            # Cut by max_tokens inside a call, which the finished reading cannot read: the calls as far as
            # the parser read them, as OpenAI answers a call cut short, and the text before them as content
            # (as streamed), never the call's markup as text.
            self.tool_calls, self.tool_content = self.read.so_far(), "".join(self.shown) or None
        return out.text

    def add_audio(self, out: AudioOutput, keep: bool = True) -> None:
        """Count an audio chunk; `keep` it for the whole-clip answer (streaming sends it on instead)."""
        self.sample_rate = out.sample_rate
        if keep:
            self.audio.append(out.audio)
        if out.transcript is not None:
            self.transcript.append(out.transcript)


def _audio(chunk: StageChunk) -> AudioOutput | None:
    """The chunk's audio, if it carries samples or a transcript piece."""
    out = chunk.output
    return out if isinstance(out, AudioOutput) and (len(out.audio) or out.transcript is not None) else None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, ChatCompletionRequest)
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    if req.logprobs:
        raise bad_request("logprobs are not returned by this server; leave `logprobs` out or false", "logprobs",
                          "unsupported_parameter")
    check_unserved(req.reasoning_effort, req.verbosity, req.top_logprobs)
    for name, value, why in (("logit_bias", req.logit_bias, "token biases are not applied; leave it out, null or {}"),
                             ("functions", req.functions, "send the functions in `tools`"),
                             ("function_call", req.function_call, "say it in `tool_choice`"),
                             ("moderation", req.moderation, "no moderation model runs here; leave it out or null")):
        if value:
            raise bad_request(f"this server does not support `{name}`: {why}", name, "unsupported_parameter")
    check_prewarm(req.prompt_cache_options)
    if req.web_search_options is not None:
        raise bad_request("web search is not served by this server; leave `web_search_options` out",
                          "web_search_options", "unsupported_parameter")
    modalities = list(dict.fromkeys(req.modalities or ["text"]))
    orch, model = route_model(request, req.model, set(modalities), outputs_param="modalities")
    if (refusal := tools_refusal(orch.pipeline, req.tools, req.tool_choice, can_force=True)) is not None:
        raise bad_request(*refusal, "unsupported_parameter")
    await check_tools(req.tools, req.tool_choice)
    check_tool_messages(req.messages)
    guided = guided_params(orch.pipeline, req.response_format, req.tools, req.tool_choice, req.parallel_tool_calls)
    if req.audio is not None and req.audio.voice:
        listed_voice(orch.pipeline, req.audio.voice, "audio.voice")  # /v1/audio/speech's 400 for an unknown one
    want_audio = "audio" in modalities
    audio_format = req.audio.format if req.audio else "wav"
    if want_audio:
        check_supported("pcm" if audio_format == "pcm16" else audio_format)
    has_media = any(not isinstance(m.content, str | None) for m in req.messages)
    # Decoding media is real work (a thread); plain text is cheaper than the hop.
    files = {fid: await file_bytes(request, fid, where) for fid, where in file_ids(req.messages)}
    inputs = await off_loop(build_chat_inputs, req.messages, chat_param, files) if has_media else build_chat_inputs(
        req.messages)
    if (tools := stage_tools(req.tools, req.tool_choice)) is not None:
        inputs["tools"] = tools
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    params, n = {**chat_params(req, modalities), **guided}, req.n or 1
    async with contextlib.AsyncExitStack() as calls_open:  # (on exit: every choice not ended is aborted)
        calls = [await calls_open.enter_async_context(PipelineCall(
            request, ROUTE, inputs, choice_params(params, i), set(modalities), cid if n == 1 else f"{cid}-{i}"
        )) for i in range(n)]
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await _stream(request, calls, cid, model, audio_format if want_audio else None,
                                 include_usage, hold_text=tools is not None)
        return await _complete(calls, cid, model, audio_format if want_audio else None)


def check_unserved(effort: str | None, verbosity: str | None, top_logprobs: int | None,
                   names: tuple[str, str, str] = ("reasoning_effort", "verbosity", "top_logprobs")) -> None:
    """A 400 naming a field (`names`: effort, verbosity, top_logprobs) that asks for what no model here does,
    where ignoring it would mislead: a reasoning effort (none of them reasons before it answers), a verbosity
    but "medium", log-probabilities. OpenAI refuses the same for its models without the feature."""
    if effort not in (None, "none"):
        raise bad_request(f"`{names[0]}` is not supported with this model: it does not reason before it answers; "
                          'leave it out, null or "none"', names[0], "unsupported_parameter")
    if verbosity not in (None, "medium"):
        raise bad_request(f"`{names[1]}` does not support {verbosity!r} with this model; supported values are: "
                          '"medium"', names[1], "unsupported_value")
    if top_logprobs:
        raise bad_request(f"logprobs are not returned by this server; leave `{names[2]}` out or 0", names[2],
                          "unsupported_parameter")


def check_prewarm(options: PromptCacheOptions | None) -> None:
    """`prompt_cache_options.prewarm` asks for a cache warmed and no answer: a 400 naming it (no prompt cache is
    kept per request here, and every request is answered)."""
    if options is not None and options.prewarm:
        raise bad_request("this server does not prewarm a prompt cache (every request is answered); leave "
                          "`prompt_cache_options.prewarm` out or false", "prompt_cache_options.prewarm",
                          "unsupported_value")


def choice_params(params: dict[str, Any], index: int) -> dict[str, Any]:
    """Choice `index`'s params: with a seed, each choice gets its own (seed + index), reproducibly."""
    seed = params.get("seed")
    if index == 0 or seed is None:
        return params
    return {**params, "seed": seed + index if seed + index < 2**63 else seed - index}


async def _collect(call: PipelineCall, audio_format: str | None) -> Tally:
    tally = Tally.of(call.params)
    async for chunk in call:
        if isinstance(chunk.output, TextOutput):
            tally.add_text(chunk.output)
        elif audio_format is not None and (audio := _audio(chunk)) is not None:
            tally.add_audio(audio)
    return tally


async def _message(tally: Tally, audio_format: str | None) -> ResponseMessage:
    text = "".join(tally.text)
    audio = None
    if audio_format is not None:
        clip = np.concatenate(tally.audio) if tally.audio else np.zeros(0, np.float32)
        data = await off_loop(encode_file, clip, tally.sample_rate, audio_format)
        audio = ChatAudio(id=f"audio_{uuid.uuid4().hex[:24]}", data=base64.b64encode(data).decode(),
                          expires_at=int(time.time()) + AUDIO_TTL_S,
                          transcript="".join(tally.transcript) or text)
    if tally.tool_calls:
        return ResponseMessage(role="assistant", content=tally.tool_content, audio=audio,
                               tool_calls=message_tool_calls(tally.tool_calls))
    return ResponseMessage(role="assistant", content=None if tally.forced else text, audio=audio)


def _usage(tallies: list[Tally]) -> Usage:
    """The prompt counted once, every choice's completion."""
    prompt = tallies[0].prompt_tokens
    completion = sum(t.completion_tokens for t in tallies)
    return Usage(prompt, completion, prompt + completion)


async def _complete(calls: list[PipelineCall], cid: str, model: str, audio_format: str | None) -> web.Response:
    tallies = await asyncio.gather(*(_collect(call, audio_format) for call in calls))
    choices = [Choice(i, await _message(t, audio_format), t.finish_reason) for i, t in enumerate(tallies)]
    body = ChatCompletion(id=cid, created=int(time.time()), model=model, choices=choices, usage=_usage(tallies))
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def _merged(calls: list[PipelineCall]) -> AsyncIterator[tuple[int, StageChunk | None]]:
    """(choice, chunk) as the choices' pipelines make them; (choice, None) when one ends.
    The first error of any choice is raised (the caller's exit aborts the others)."""
    if len(calls) == 1:
        async for chunk in calls[0]:
            yield 0, chunk
        yield 0, None
        return
    # Bounded: a reader that falls behind stops the pumps, and the choices' own streams fill up.
    queue: asyncio.Queue[tuple[int, StageChunk | RequestError | None]] = asyncio.Queue(MERGE_QUEUE_CHUNKS)

    async def pump(index: int, call: PipelineCall) -> None:
        try:
            async for chunk in call:
                await queue.put((index, chunk))
            await queue.put((index, None))
        except RequestError as err:
            await queue.put((index, err))

    pumps = [asyncio.ensure_future(pump(i, call)) for i, call in enumerate(calls)]
    try:
        live = len(calls)
        while live:
            index, item = await queue.get()
            if isinstance(item, RequestError):
                raise item
            live -= item is None
            yield index, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


class _ChoiceStream:
    """One choice of a streamed answer: its text and audio deltas as chat.completion.chunk events."""

    def __init__(self, index: int, audio_format: str | None, event: Any, hold_text: bool = False,
                 tally: Tally | None = None) -> None:
        self.index = index
        self.hold_text = hold_text
        """Tools were offered: only text the stage's parser calls `shown` goes out as it comes; the
        rest once the finished answer is read for calls (api/tools.py)."""
        self.shown: list[str] = []
        self.calls = StreamedCalls()
        self.audio_format = audio_format
        self.event = event  # (ChunkChoice) -> ChatCompletionChunk
        self.tally = tally or Tally()
        self.audio_id = f"audio_{uuid.uuid4().hex[:24]}"
        self.encoder: StreamEncoder | None = None

    async def on_chunk(self, chunk: StageChunk) -> ChatCompletionChunk | None:
        if isinstance(chunk.output, TextOutput):
            delta = self.tally.add_text(chunk.output)
            parts = None
            if self.hold_text:
                self.shown.append(delta := chunk.output.shown)
                self.calls.add(self.tally.parts)
                parts = delta_tool_parts(self.tally.parts) or None
            if not (delta or parts):
                return None
            return self.event(ChunkChoice(self.index, Delta(content=delta or None, tool_calls=parts)))
        if self.audio_format is not None and (audio := _audio(chunk)) is not None:
            self.tally.add_audio(audio, keep=False)
            if self.encoder is None:
                self.encoder = StreamEncoder(self.audio_format, self.tally.sample_rate)
            data = await self.encoder.feed_async(audio.audio)
            return self.event(ChunkChoice(self.index, Delta(audio=DeltaAudio(
                id=self.audio_id, data=base64.b64encode(data).decode() if data else None,
                transcript=audio.transcript))))
        return None

    async def finish(self) -> list[ChatCompletionChunk]:
        out = []
        t = self.tally
        if self.hold_text and t.tool_calls:
            rest, calls = unshown(t.tool_content or "", self.shown), self.calls.rest(t.tool_calls)
            if rest or calls:
                out.append(self.event(ChunkChoice(self.index, Delta(content=rest or None, tool_calls=calls or None))))
        elif self.hold_text and (rest := unshown("".join(t.text), self.shown)):
            out.append(self.event(ChunkChoice(self.index, Delta(content=rest))))
        if self.audio_format is not None:
            tail = await off_loop(self.encoder.finish) if self.encoder is not None else b""
            out.append(self.event(ChunkChoice(self.index, Delta(audio=DeltaAudio(
                id=self.audio_id, data=base64.b64encode(tail).decode() if tail else None,
                expires_at=int(time.time()) + AUDIO_TTL_S)))))
        out.append(self.event(ChunkChoice(self.index, Delta(), self.tally.finish_reason)))
        return out


async def _stream(request: web.Request, calls: list[PipelineCall], cid: str, model: str,
                  audio_format: str | None, include_usage: bool, hold_text: bool = False) -> web.StreamResponse:
    created = int(time.time())

    def event(choice: ChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=cid, created=created, model=model, choices=[choice])

    choices = [_ChoiceStream(i, audio_format, event, hold_text, Tally.of(call.params)) for i, call in enumerate(calls)]
    # An error before the first output keeps its HTTP status.
    await asyncio.gather(*(call.started() for call in calls))

    async def events() -> AsyncGenerator[ChatCompletionChunk, None]:
        for c in choices:
            yield event(ChunkChoice(c.index, Delta(role="assistant", content=None if c.tally.forced else "")))
        async for index, chunk in _merged(calls):
            if chunk is None:
                for out in await choices[index].finish():
                    yield out
            elif (out := await choices[index].on_chunk(chunk)) is not None:
                yield out
        if include_usage:
            yield ChatCompletionChunk(id=cid, created=created, model=model, choices=[],
                                      usage=_usage([c.tally for c in choices]))

    return await sse.respond(request, events())
