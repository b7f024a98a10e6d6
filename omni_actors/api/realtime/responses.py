"""One Realtime response: the conversation in, the orchestrator's stream out as deltas.

    run = ResponseRun(host, options); host.responses[run.id] = run; task = run.start()
    run.cancel("turn_detected"); await run.task          # aborts every stage, ends with response.done

`host` is the connection's session (handler.py): it supplies `orch`, `cfg`,
`conversation`, `dialect` and `send(event)`. The request goes through the REST
routes' PipelineCall (deadline, metrics, abort on exit). Text and audio outputs
stream into the response's message item as deltas (response_item.py); a transcript output is the
pipeline's transcription of the user's audio and is stored on that user item. A response whose
user audio another response is transcribing (an out-of-band one beside the conversation's) waits for
that transcript and hears it as text: the recognizer runs once per item.
A response that offers tools sends at once only the text the stage's tool parser knows is no call
(`TextOutput.shown`) and each call as a `function_call` item as the parser reads it, its arguments
as they come (`TextOutput.tool_parts`); it holds the rest until the answer was read for calls, then
sends what is left of the text and closes the calls with the finished reading's word (function_calls.py).
The message item comes first in `output` where the answer opens with prose, the calls after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from omni_actors import logs
from omni_actors.api.calls import PipelineCall
from omni_actors.api.errors import ApiError
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import Resampler
from omni_actors.api.realtime.conversation import Conversation, Item, new_id, render_item
from omni_actors.api.realtime.function_calls import CallItems
from omni_actors.api.realtime.response_item import MessageItem
from omni_actors.api.realtime.response_request import Options, build_request
from omni_actors.api.realtime.response_status import (
    AUDIO_TOKENS_PER_S,
    Usage,
    failed,
    rate_limits,
    rest_failure,
)
from omni_actors.api.realtime.session import SessionConfig, render_format
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.api.time_stretch import TimeStretch
from omni_actors.api.tools import unshown
from omni_actors.errors import AdmissionError, RequestAborted, RequestError, StageUnavailable
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import (
    AudioOutput,
    TextOutput,
    ToolCallOutput,
    TranscriptOutput,
)
from omni_actors.orchestrator.requests import RequestStream, StageChunk

log = logs.get(__name__)

ROUTE = "/v1/realtime"
"""The route a response's latencies are recorded under (/metrics)."""


class Host(Protocol):
    app: web.Application
    orch: Orchestrator
    cfg: SessionConfig
    conversation: Conversation
    dialect: ev.Dialect
    response: ResponseRun | None  # the conversation's response in progress
    responses: dict[str, ResponseRun]  # every response in progress, out-of-band ones too (each removes itself)
    transcribing: dict[str, asyncio.Event]
    """User items a response in progress transcribes, each set once its transcript is attached (or the
    response ended without one); each response removes its own."""
    stats: RealtimeStats

    async def send(self, event: ev.ServerEvent) -> None: ...


@dataclass
class ResponseRun(MessageItem):
    host: Host
    opts: Options
    id: str = field(default_factory=lambda: new_id("resp"))
    status: str = "in_progress"
    details: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    item: Item | None = None
    """The message item, opened when the first text or audio is sent."""
    output: list[Item] = field(default_factory=list)
    """The response's items in output order: the message item, function_call items (function_calls.py)."""
    _calls: CallItems | None = None
    """While tools are offered: the function_call items, added as the parser reads them."""
    stream: RequestStream | None = None
    task: asyncio.Task | None = None
    cancel_reason: str | None = None
    _resampler: Resampler | None = None
    _stretch: TimeStretch | None = None
    """The session's `speed` (not 1.0): the wire-rate audio stretched in time, pitch kept."""
    _user_transcript: str = ""
    _transcribes: str | None = None
    """The user item whose transcript this response attaches (host.transcribing holds it meanwhile)."""
    _waiting: asyncio.Future | None = None
    """While another response transcribes this one's audio item: the wait for its transcript."""
    _transcript_sent: int = 0  # characters of the stripped transcript sent as deltas
    _submitted_at: float = 0.0
    _done_sent: bool = False
    _counted: bool = False
    """Counted in the endpoint's statistics (RealtimeStats.response_done): once, even if no response.done went."""
    _held: list[str] | None = None
    """While tools are offered: text deltas not sent yet (None: text is sent as it comes)."""
    _read: TextOutput | None = None
    """The answer's last text output when the tool parser read calls in it."""
    _shown: list[str] = field(default_factory=list)
    """While tools are offered: the text sent as it came (TextOutput.shown: surely no call)."""
    first_audio_ms: float | None = None
    """Submit to first audio chunk out of the orchestrator: the pipeline's share of first-audio latency."""

    # ---- control (called by the handler) ----

    def start(self) -> asyncio.Task:
        self.task = asyncio.ensure_future(self._run())
        return self.task

    def cancel(self, reason: str) -> None:
        """Stop at once: abort the request in every stage; the task then sends response.done."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self._waiting is not None:
            self._waiting.cancel()
        if self.stream is not None:
            self.stream.abort()

    @property
    def audio(self) -> bool:
        return "audio" in self.opts.modalities and "audio" in self.host.orch.pipeline.output_types()

    def render(self) -> dict[str, Any]:
        mods = "output_modalities" if self.host.dialect == "ga" else "modalities"
        out = [render_item(i, self.host.dialect) for i in self.output]
        return {"object": "realtime.response", "id": self.id, "status": self.status,
                "status_details": self.details, "output": out, "usage": self.usage.render(),
                "conversation_id": self.host.conversation.id if self.opts.in_conversation else None,
                mods: list(self.opts.modalities), **self._render_audio(),
                "max_output_tokens": "inf" if self.opts.max_output_tokens is None else self.opts.max_output_tokens,
                "metadata": self.opts.metadata}

    def _render_audio(self) -> dict[str, Any]:
        """The response's voice and output format, as its dialect writes them (GA: `audio.output`)."""
        if self.host.dialect == "ga":
            return {"audio": {"output": {"format": render_format(self.opts.output_audio_format),
                                         "voice": self.opts.voice}}}
        return {"voice": self.opts.voice, "output_audio_format": self.opts.output_audio_format}

    # ---- the run ----

    async def _run(self) -> None:
        h = self.host
        try:
            await self._respond()
        except ConnectionError:
            raise  # the client is gone: nobody to tell
        except Exception as err:  # this response's boundary: report it, keep the session
            log.exception("realtime.response_error", response_id=self.id, error=type(err).__name__)
            if not self._done_sent:
                await self._finish("failed", failed("internal_error", type(err).__name__))
        finally:
            if self.stream is not None and not self.stream.ended:
                self.stream.abort()  # the task was cancelled or a send failed: stop every stage
            if not self._counted:  # (cancelled with its session, or a send failed: the client is gone)
                self._count("cancelled", {"type": "cancelled", "reason": self.cancel_reason or "client_gone"})
            h.responses.pop(self.id, None)
            if self._transcribes is not None:
                h.transcribing.pop(self._transcribes).set()  # (a response waiting for it goes on)
            if h.response is self:
                h.response = None

    async def _respond(self) -> None:
        h = self.host  # (its response.created went out as it was made: handler._create_response)
        items = self.opts.context if self.opts.context is not None else list(h.conversation.items)
        turn = build_request(h.orch.pipeline, self.opts, items)
        while turn.audio_item is not None and (heard := h.transcribing.get(turn.audio_item.id)) is not None:
            # Another response (the conversation's, an out-of-band one beside it) is transcribing this item:
            # its transcript, not a second run of the recognizer on the same audio, is what this one hears
            # (the item is text once it is attached; if that response ended without one, this one transcribes).
            if heard.is_set():  # it heard nothing ("" attached): this one hears the audio, attaching nothing
                break
            if not await self._wait_for(heard):
                return await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})
            turn = build_request(h.orch.pipeline, self.opts, items)
        audio_item = turn.audio_item
        if audio_item is not None and audio_item.id in h.transcribing:
            audio_item = None
        elif audio_item is not None:
            self._transcribes = audio_item.id
            h.transcribing[audio_item.id] = asyncio.Event()
        self._count_input(turn.inputs)
        async with contextlib.AsyncExitStack() as stack:  # (on exit: the request is aborted unless it ended)
            try:  # the REST routes' request path: deadline, metrics, abort on exit
                call = await stack.enter_async_context(
                    PipelineCall(h.app, ROUTE, turn.inputs, turn.params, set(turn.wanted), orch=h.orch))
            except (AdmissionError, StageUnavailable, ApiError, ValueError) as err:
                return await self._finish("failed", rest_failure(err))
            assert call.stream is not None
            self.stream = call.stream
            self._submitted_at = time.perf_counter()
            if self.cancel_reason:
                self.stream.abort()
            pipe = h.orch.pipeline
            final = {pipe.stage(s).final_output_type for s in self.stream.plan if pipe.stage(s).final_output}
            if "tools" in turn.inputs:
                self._held = []
                self._calls = CallItems(h, self.id, self.opts.in_conversation, self.output)
            else:
                await self._open_item()
            error = await self._consume(call, audio_item, text_is_transcript="text" in final)
        await self._release("text" in final, complete=error is None and not self.cancel_reason)
        if self.cancel_reason:
            return await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})
        if error is not None:
            return await self._finish("failed", rest_failure(error))
        limit = self.opts.max_output_tokens
        if limit is not None and self.usage.output_text >= limit:
            return await self._finish("incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
        await self._finish("completed", None)

    async def _wait_for(self, heard: asyncio.Event) -> bool:
        """Wait until `heard` is set; False if this response was cancelled meanwhile."""
        if self.cancel_reason is not None:  # (cancelled before it got here)
            return False
        self._waiting = asyncio.ensure_future(heard.wait())
        try:
            await self._waiting
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # this task itself was cancelled, not only the wait
                raise
        finally:
            self._waiting.cancel()
            self._waiting = None
        return self.cancel_reason is None

    async def _consume(self, call: PipelineCall, audio_item: Item | None,
                       text_is_transcript: bool) -> RequestError | None:
        try:
            async for chunk in call:
                if self.cancel_reason:
                    break
                await self._on_chunk(chunk, audio_item, text_is_transcript)
        except RequestAborted as err:
            return None if self.cancel_reason else err
        except RequestError as err:
            return err
        return None

    async def _on_chunk(self, chunk: StageChunk, audio_item: Item | None, text_is_transcript: bool) -> None:
        match chunk.output:
            case TextOutput(text=delta) as out:
                if out.prompt_tokens is not None:
                    self.usage.prompt_tokens = out.prompt_tokens
                if out.tool_calls:
                    self._read = out
                if not delta:
                    return
                self.usage.output_text += 1
                if self._held is not None:
                    self._held.append(delta)
                    if out.shown and self.opts.forced is None:  # (a forced answer's text is its call's JSON)
                        if self.item is None:
                            await self._open_item()
                        self._shown.append(out.shown)
                        await self._send_text(out.shown, text_is_transcript)
                    if self._calls is not None:
                        await self._calls.read(out.tool_parts)
                else:
                    await self._send_text(delta, text_is_transcript)
            case AudioOutput() as out if self.audio:
                if self.item is None:  # (tools offered: the text waits, the audio does not)
                    await self._open_item()
                await self._on_audio(self.item.content[0], out, text_is_transcript)  # type: ignore[union-attr]
            case TranscriptOutput(text=text):
                await self._on_user_transcript(audio_item, text, chunk.finished)

    async def _release(self, text_is_transcript: bool, complete: bool) -> None:
        """Tools were offered and the answer ended: send it as the calls the parser read in it (a
        complete answer only), with any text outside them not sent yet first, else as the text it
        held; the calls streamed are closed by that reading (function_calls.py)."""
        if self._held is None:
            return
        held, self._held = self._held, None
        calls: tuple[ToolCallOutput, ...] = self._read.tool_calls if complete and self._read else ()
        cut_in_call = not complete and self._calls is not None and bool(self._calls.streamed)
        # a forced answer's text is its call's JSON: cut before it was read, it is no text either
        no_text = cut_in_call or (self.opts.forced is not None and not calls)
        if calls:
            content = (self._read.content if self._read else None) or ""
            rest = unshown(content, self._shown)
            held = [rest] if rest.strip() or (rest and self._shown) else []
        elif no_text:
            held = []  # (what was held is the call's text: its item ends incomplete)
        else:
            held = [rest] if (rest := unshown("".join(held), self._shown)) else []
        if held or not (calls or no_text):
            if self.item is None:
                await self._open_item()
            for delta in held:
                await self._send_text(delta, text_is_transcript)
        if calls and self.item is not None:
            await self._close_item("completed")
        if self._calls is not None:
            await (self._calls.finish(calls) if complete else self._calls.close_open())

    async def _on_user_transcript(self, item: Item | None, text: str, finished: bool) -> None:
        """The user's audio as the pipeline heard it: deltas as they come, then the whole.

        The deltas add up to the completed transcript exactly: it is stripped, so trailing
        whitespace waits until more text follows it."""
        self._user_transcript += text
        if item is None:
            return
        index = next((i for i, p in enumerate(item.content) if p.type == "input_audio"), None)
        if index is None:
            return
        wanted = self.host.cfg.input_audio_transcription is not None
        transcript = self._user_transcript.strip()
        delta, self._transcript_sent = transcript[self._transcript_sent:], len(transcript)
        if wanted and delta:
            await self.host.send(ev.TranscriptionDelta(item_id=item.id, content_index=index, delta=delta))
        if finished:
            item.content[index].transcript = transcript
            if (heard := self.host.transcribing.get(item.id)) is not None:
                heard.set()  # (a response waiting to hear this item hears its text now)
            if wanted:
                await self.host.send(ev.TranscriptionCompleted(
                    item_id=item.id, content_index=index, transcript=transcript))

    def _count_input(self, inputs: dict[str, Any]) -> None:
        for m in inputs["messages"]:
            content = m["content"]
            texts = [content] if isinstance(content, str) else [p.get("text", "") for p in content]
            self.usage.input_text += sum(len(t.split()) for t in texts)
            if not isinstance(content, str):
                samples = sum(len(inputs[p["array"]]) for p in content if "array" in p)
                self.usage.input_audio += samples * AUDIO_TOKENS_PER_S // VAD_RATE

    async def _finish(self, status: str, details: dict[str, Any] | None) -> None:
        """Close the output items, then send response.done: always, once, even if closing failed."""
        h = self.host
        self.status, self.details = status, details
        try:
            if self.item is not None and self.item.status == "in_progress":
                await self._close_item(status)
            if self._calls is not None:
                await self._calls.close_open()  # (the answer was cut short by an error: they end incomplete)
        except ConnectionError:
            raise
        except Exception as err:
            log.exception("realtime.response_error", response_id=self.id, error=type(err).__name__)
            self.status, self.details = "failed", failed("internal_error", type(err).__name__)
            for item in self.output:
                item.status = "incomplete" if item.status == "in_progress" else item.status
        self._done_sent = True
        self._count(status, details)  # (first: counted even if the client is gone before its response.done)
        await h.send(ev.ResponseDone(response=self.render()))
        await h.send(ev.RateLimitsUpdated(rate_limits=rate_limits(h.orch)))

    def _count(self, status: str, details: dict[str, Any] | None) -> None:
        """Count the response in the endpoint's statistics and log its end: once, however it ended."""
        self._counted = True
        first = None if self.first_audio_ms is None else round(self.first_audio_ms, 2)
        self.host.stats.response_done(self.id, status, first)
        log.info("realtime.response_done", response_id=self.id, status=status,
                 reason=(details or {}).get("reason"), first_audio_ms=first,
                 audio_ms=self.item.content[0].audio_ms if self.item else 0)
