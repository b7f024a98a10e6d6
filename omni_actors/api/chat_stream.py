"""A chat answer streamed: `chat.completion.chunk` events as SSE, each choice's deltas as they are made.

Text goes out in `delta.content` (its tokens' `logprobs` with it, where asked; held back while tools are offered, but the text the stage's parser
calls `shown`), audio in `delta.audio` ({id, data: base64 in audio.format, transcript}), a last chunk
per choice with its `finish_reason`, a usage chunk when asked for; `n` > 1 choices are interleaved as
their pipelines make them. Once every choice ended, `on_end` gets the answer put together as one
`ChatCompletion` (what a stored completion keeps: its audio's transcript, no audio bytes).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from aiohttp import web

from omni_actors.api import sse
from omni_actors.api.audio_codec import StreamEncoder, off_loop
from omni_actors.api.calls import PipelineCall
from omni_actors.api.chat_schemas import (
    ChatAudio,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    DeltaAudio,
)
from omni_actors.api.chat_tally import (
    AUDIO_TTL_S,
    Tally,
    answer_message,
    chat_logprobs,
    chunk_audio,
    new_audio_id,
    usage_of,
)
from omni_actors.api.tools import StreamedCalls, delta_tool_parts, unshown
from omni_actors.errors import RequestError
from omni_actors.orchestrator.outputs import TextOutput
from omni_actors.orchestrator.requests import StageChunk

MERGE_QUEUE_CHUNKS = 16
"""Outputs of `n` > 1 choices waiting to be sent, before their pumps wait."""


async def merged(calls: list[PipelineCall]) -> AsyncIterator[tuple[int, StageChunk | None]]:
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


class ChoiceStream:
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
        self.audio_id = new_audio_id()
        self.encoder: StreamEncoder | None = None

    async def on_chunk(self, chunk: StageChunk) -> ChatCompletionChunk | None:
        if isinstance(chunk.output, TextOutput):
            delta = self.tally.add_text(chunk.output)
            parts = None
            if self.hold_text:
                self.shown.append(delta := chunk.output.shown)
                self.calls.add(self.tally.parts)
                parts = delta_tool_parts(self.tally.parts) or None
            tokens = chat_logprobs(chunk.output.logprobs) if self.tally.logprobs is not None else None
            if not (delta or parts or (tokens and tokens.content)):
                return None
            return self.event(ChunkChoice(self.index, Delta(content=delta or None, tool_calls=parts),
                                          logprobs=tokens if tokens and tokens.content else None))
        if self.audio_format is not None and (audio := chunk_audio(chunk)) is not None:
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

    def choice(self) -> Choice:
        """The choice as a whole answer's: its audio by id and transcript (the bytes went out as deltas)."""
        audio = None
        if self.audio_format is not None:
            audio = ChatAudio(id=self.audio_id, data="", expires_at=int(time.time()) + AUDIO_TTL_S,
                              transcript="".join(self.tally.transcript) or "".join(self.tally.text))
        return Choice(self.index, answer_message(self.tally, audio), self.tally.finish_reason,
                      chat_logprobs(self.tally.logprobs))


async def stream_answer(request: web.Request, calls: list[PipelineCall], cid: str, model: str,
                        audio_format: str | None, include_usage: bool, hold_text: bool = False,
                        on_end: Callable[[ChatCompletion], None] | None = None) -> web.StreamResponse:
    """Stream the calls' answer; `on_end` (if given) gets it whole once every choice ended (not when one
    failed or the client left)."""
    created = int(time.time())

    def event(choice: ChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=cid, created=created, model=model, choices=[choice])

    choices = [ChoiceStream(i, audio_format, event, hold_text, Tally.of(call.params)) for i, call in enumerate(calls)]
    # An error before the first output keeps its HTTP status.
    await asyncio.gather(*(call.started() for call in calls))

    async def events() -> AsyncGenerator[ChatCompletionChunk, None]:
        for c in choices:
            yield event(ChunkChoice(c.index, Delta(role="assistant", content=None if c.tally.forced else "")))
        async for index, chunk in merged(calls):
            if chunk is None:
                for out in await choices[index].finish():
                    yield out
            elif (out := await choices[index].on_chunk(chunk)) is not None:
                yield out
        usage = usage_of([c.tally for c in choices])
        if include_usage:
            yield ChatCompletionChunk(id=cid, created=created, model=model, choices=[], usage=usage)
        if on_end is not None:
            on_end(ChatCompletion(id=cid, created=created, model=model, choices=[c.choice() for c in choices],
                                  usage=usage))

    return await sse.respond(request, events())
