"""A realtime session on a full-duplex model: the user's audio streams in while the model's streams out.

The whole session is one streaming request (RequestSpec(streaming=True)) to the
duplex stage, started by the first `input_audio_buffer.append` or
`response.create`; every later append is fed to it (Orchestrator.feed; of a long one only its last
MAX_FEED_S, as the engine keeps no more). The model hears nothing else: `conversation.item.create`, an
out-of-band `response.create` and `response.input` are `error`s, and so is a `response.create` asking for
anything the live stream is not (another format, no audio, tools, a temperature, a token limit). The
stage's frame clock, not the client, paces it: a client that stops sending is
fed silence. Each frame that comes back is sent at once as
`response.audio.delta` / `response.output_audio.delta` (and its text as the
transcript delta) of one long-lived response. No commit, no VAD: the model
decides when to speak; `input_audio_buffer.clear` drops the appended audio not yet heard (the engine
buffers up to 2 s ahead of its frame clock). `response.cancel` ends the response (status cancelled)
and mutes the model until the user speaks again (input louder than
SPEECH_RMS), when a new response opens. The session's voice, instructions and
temperature at the stream's start go to the model as request params (an adapter
that takes a voice or prompt reads them; Moshi takes neither); a later temperature
is fed to the live stream. session.update is checked as every
session's is (tools, `session.type: "transcription"`, ...: session_updates.py `_checked_update`), then for
duplex: input audio transcription is refused (unsupported_parameter): there are no committed turns to
transcribe, and `audio.output.speed` must be 1. Sessions past the duplex stage's slots
are refused by the route (route.py). A stream that ends without the client closing (aborted by the
orchestrator, a stage failure, an error sending a frame) ends the session: an `error` event, then the
socket closes (1011; 1013 at the stage's limit) and the session is released.
Each response's assistant item is a conversation item from the moment it is announced: it can be
retrieved (its transcript so far) and truncated, live or ended; a truncate cuts what the item holds
and the model goes on, its next frames the item's audio from the cut (duplex_items.py keeps each item
bounded, and the session its last ITEMS_KEPT items).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np
from aiohttp import web

from omni_actors import logs
from omni_actors.api.errors import from_exception
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import (
    AudioFormatError,
    Resampler,
    WireStream,
    encode_wire,
    wire_rate,
)
from omni_actors.api.realtime.conversation import Item, Part, new_id, render_item, render_part
from omni_actors.api.realtime.duplex_items import ITEMS_KEPT, AudioClock, hear
from omni_actors.api.realtime.duplex_stats import DuplexStats
from omni_actors.api.realtime.handler import ClientGone, RealtimeSession
from omni_actors.api.realtime.response_request import Options
from omni_actors.api.realtime.session import render_format, render_session
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.errors import AdmissionError, RequestError, StageUnavailable
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import AudioOutput, DuplexFrame
from omni_actors.orchestrator.requests import RequestSpec, RequestStream, new_request_id

log = logs.get(__name__)

MODEL_RATE = 24_000
"""Rate of the audio fed to and read from duplex stages (Moshi's Mimi)."""
SPEECH_RMS = 0.02
"""Input louder than this (RMS of one append, about -34 dBFS) counts as the user speaking: it unmutes."""
MAX_SEND_BACKLOG_FRAMES = 25
"""Frames (~2 s) a client may fall behind; past that, frames are skipped, not sent late (a slow reader
gets gaps, the server does not buffer its audio without bound)."""
MAX_FEED_S = 2.5
"""Most of one append fed to the engine (its newest audio): the engine buffers at most its MAX_INPUT_S (2 s)
ahead of the frame clock, dropping the oldest; the rest covers the resampler's delay."""
LIMIT_CLOSE_CODE = 1013
"""WebSocket close code after a session_limit_reached error ("try again later")."""


def session_limit(orch: Orchestrator) -> int:
    """Most duplex sessions at once: the duplex stage's slots over its replicas (as each replica's engine
    sized them to its frame budget, once Ready; max_num_seqs before), and the server's cap."""
    stage_id = orch.pipeline.stages[0].stage_id
    stage = orch.deploy.stage(stage_id)
    handles = orch.workers.get(stage_id, [])
    slots = sum(h.capacity if h.ready and h.capacity is not None else stage.max_num_seqs for h in handles)
    return min(slots if handles else stage.max_num_seqs * stage.num_replicas, orch.deploy.server.max_realtime_sessions)


class DuplexSession(RealtimeSession):
    def __init__(self, ws: web.WebSocketResponse, request: web.Request, orch: Orchestrator, model: str,
                 stats: RealtimeStats) -> None:
        super().__init__(ws, request, orch, model, stats)
        self.cfg = replace(self.cfg, turn_detection=None)
        self.dstats: DuplexStats = stats.duplex
        self._in = Resampler(wire_rate(self.cfg.input_audio_format), MODEL_RATE)
        self._wire = WireStream(self.cfg.input_audio_format)
        self._out: Resampler | None = None
        self.stream: RequestStream | None = None
        self._pump: asyncio.Task | None = None
        self.live: dict[str, Any] | None = None  # the open response: id, item
        self._items: deque[str] = deque()  # this session's response items in the conversation, oldest first
        self.muted = False
        self._closing = False  # the client's connection ended: the stream's abort is ours, not news
        self._ending = False  # the pump is ending the session itself (error event, close): wait for it

    def _reset_vad(self) -> None:  # duplex sessions have no turns: never a VAD
        self._vad = None
        self._speech_item = None

    # ---- the loop ----

    async def serve(self, idle_timeout_s: float) -> None:
        d = self.dstats  # (the route checked the limit; this count is taken before any await)
        d.sessions_live += 1
        d.sessions_total += 1
        try:
            await super().serve(idle_timeout_s)
        finally:
            d.sessions_live -= 1

    async def _dispatch(self, event: ce.ClientEventT) -> None:
        eid = event.event_id
        match event:
            case ce.BufferAppend(audio=b64):
                await self._append_duplex(b64, eid)
            case ce.ResponseCreate(response=r):
                self._refuse_response_fields(r, eid)
                if self.live is not None:  # (as every session answers a second response.create)
                    raise ce.BadEvent(f"conversation already has an active response {self.live['id']}",
                                      code="conversation_already_has_active_response", event_id=eid)
                self.muted = False
                await self._ensure_stream(None)
            case ce.ResponseCancel(response_id=rid):
                if self.live is None or (rid is not None and rid != self.live["id"]):
                    raise ce.BadEvent("no active response to cancel", code="response_cancel_not_active",
                                      param="response_id" if rid else None, event_id=eid)
                self.muted = True
                await self._close_live("cancelled", {"type": "cancelled", "reason": "client_cancelled"})
            case ce.ItemCreate():  # (accepted, the model would never hear it: say so instead)
                raise ce.BadEvent("a full-duplex model hears only the audio stream (input_audio_buffer.append): "
                                  "it takes no conversation items, text or audio", param="item", event_id=eid,
                                  code="unsupported_in_duplex_session")
            case ce.BufferCommit():
                raise ce.BadEvent("a duplex session has no turns: stream input_audio_buffer.append without "
                                  "committing", code="duplex_no_commit", event_id=eid)
            case ce.BufferClear():
                self._clear_input()
                await self.send(ev.BufferCleared())
            case ce.ItemDelete(item_id=iid) if self.live is not None and self.live["item"].id == iid:
                # The item the model is speaking into: its response ends first (as response.cancel), so no
                # delta and no item.done names it after its conversation.item.deleted.
                self.muted = True
                await self._close_live("cancelled", {"type": "cancelled", "reason": "client_cancelled"})
                self.conversation.delete(iid)
                await self.send(ev.ItemDeleted(item_id=iid))
            case _:
                await super()._dispatch(event)

    def _refuse_response_fields(self, r: ce.ResponseIn | None, eid: str | None) -> None:
        """What a duplex session's one response cannot be: out of band (a second answer beside the model's
        live stream), given `input` items (the model hears only the audio stream), or anything the live stream
        is not: another format, no audio, tools, another temperature, a token limit (these were accepted and
        ignored: a client asking for text only, or G.711, got pcm16 audio). Values every session refuses are
        refused first, with the same codes (response_request.py Options)."""
        if r is None:
            return
        if r.conversation == "none":
            raise ce.BadEvent("a full-duplex session has one response, the model's live answer to the audio "
                              "stream: out-of-band responses (conversation 'none') are not served",
                              code="unsupported_parameter", param="response.conversation", event_id=eid)
        if r.input is not None:
            raise ce.BadEvent("a full-duplex model hears only the audio stream: response.input is not served",
                              code="unsupported_parameter", param="response.input", event_id=eid)
        try:
            self._refuse_tools(r.tools, r.tool_choice, "response.")  # (as session.update refuses them)
            opts = Options.build(self.cfg, r, None)
            tokens = r.max_output_tokens if r.max_output_tokens is not None else r.max_response_output_tokens
            ga_format = r.audio is not None and r.audio.output is not None and r.audio.output.format is not None
            live = "the model's live stream is the session's: change it with session.update"
            if opts.output_audio_format != self.cfg.output_audio_format:
                raise ce.BadEvent(f"{live} (output_audio_format)", code="unsupported_parameter",
                                  param="response.audio.output.format" if ga_format else "response.output_audio_format")
            if "audio" not in opts.modalities:
                raise ce.BadEvent("a full-duplex model always speaks: its response's modalities include 'audio'",
                                  code="unsupported_parameter",
                                  param="response.output_modalities" if r.output_modalities else "response.modalities")
            if opts.temperature != self.cfg.temperature:
                raise ce.BadEvent(f"{live} (temperature)", code="unsupported_parameter", param="response.temperature")
            if tokens is not None and tokens != "inf":
                raise ce.BadEvent("the model's live stream has no output token limit", code="unsupported_parameter",
                                  param="response.max_output_tokens" if r.max_output_tokens is not None
                                  else "response.max_response_output_tokens")
        except ce.BadEvent as err:
            err.event_id = eid
            raise

    async def _session_update(self, s: ce.SessionIn, eid: str | None) -> None:
        cfg, dialect = await self._checked_update(s, eid)  # (every session's checks: tools, session.type, ...)
        if cfg.speed != 1.0:  # its frames go out in real time, one per frame heard
            raise ce.BadEvent("a full-duplex session speaks in real time: audio.output.speed must be 1.0",
                              param="session.audio.output.speed", event_id=eid)
        if cfg.input_audio_transcription is not None:  # it would be accepted and never answered
            ga = (dialect or self.dialect) == "ga"
            raise ce.BadEvent("a full-duplex session has no committed turns to transcribe: leave input audio "
                              "transcription unset", code="unsupported_parameter", event_id=eid,
                              param="session.audio.input.transcription" if ga else "session.input_audio_transcription")  # fmt: skip
        old, self.cfg = self.cfg, replace(cfg, turn_detection=None)  # the model decides when to speak: no VAD
        if dialect is not None:
            self.dialect = dialect
        # A resampler holds its filter's delay (up to ~60 ms of G.711): a new one only for a new format,
        # else every update (instructions, voice) would drop that much of the user's and the model's audio.
        if self.cfg.input_audio_format != old.input_audio_format:
            self._in = Resampler(wire_rate(self.cfg.input_audio_format), MODEL_RATE)
            self._wire = WireStream(self.cfg.input_audio_format)
        if self.cfg.output_audio_format != old.output_audio_format:
            self._out = None
        if self.stream is not None and self.cfg.temperature != old.temperature:  # the live stream samples at it
            self.orch.feed(self.stream.request_id, {"temperature": self.cfg.temperature})
        await self.send(ev.SessionUpdated(session=render_session(self.cfg, self.id, self.dialect)))

    # ---- input ----

    async def _append_duplex(self, b64: str, eid: str | None) -> None:
        # The engine keeps the newest 2 s of a session's input and drops the rest, so of a long append
        # (a 15 MiB event is minutes of G.711) only its tail is decoded, resampled and fed: the rest was
        # decoded, resampled 3x and shipped whole, seconds of this event loop (every session's frames) for
        # audio the engine then dropped. Even its base64 is decoded only where the tail is (the rest is checked
        # in one pass, audio.py `_wire_tail`). What is skipped counts as dropped input, as the engine's drops.
        rate = wire_rate(self.cfg.input_audio_format)
        try:
            x = self._wire.decode(b64, keep=int(MAX_FEED_S * rate))
        except AudioFormatError as err:
            raise ce.BadEvent(str(err), param="audio", event_id=eid) from None
        self.dstats.dropped_input_s += self._wire.skipped / rate
        x = self._in.push(x)
        if self.muted and len(x) and float(np.sqrt(np.mean(np.square(x)))) > SPEECH_RMS:
            self.muted = False
        if self.stream is None:
            await self._ensure_stream(x)
        elif len(x):
            self.orch.feed(self.stream.request_id, {"audio": x.astype(np.float32), "sample_rate": MODEL_RATE})

    def _clear_input(self) -> None:
        """input_audio_buffer.clear: nothing appended before it reaches the model. The engine drops the
        session's buffered input (up to its MAX_INPUT_S, ahead of the frame clock), the resampler what its
        filter holds, the wire stream a held odd byte. Frames already stepped were heard."""
        self._in = Resampler(wire_rate(self.cfg.input_audio_format), MODEL_RATE)
        self._wire.clear()
        if self.stream is not None:
            self.orch.feed(self.stream.request_id, {"clear": True})

    async def _ensure_stream(self, first: np.ndarray | None) -> None:
        if self.stream is not None:
            return
        audio = first if first is not None else np.zeros(0, np.float32)
        spec = RequestSpec(inputs={"audio": audio.astype(np.float32), "sample_rate": MODEL_RATE},
                           params={"temperature": self.cfg.temperature, "voice": self.cfg.voice,
                                   "instructions": self.cfg.instructions}, streaming=True,
                           request_id=new_request_id("duplex"))
        try:
            self.stream = self.orch.submit(spec)
        except (AdmissionError, StageUnavailable) as err:
            api = from_exception(err)
            code = "session_limit_reached" if isinstance(err, AdmissionError) else api.code or "server_error"
            await self._fail(code, str(err), api.type)
            return
        self._pump = asyncio.ensure_future(self._run_pump(self.stream))

    async def _fail(self, code: str, message: str, kind: str = "server_error") -> None:
        await self.send(ev.Error(error={"type": kind, "code": code, "message": message, "param": None,
                                        "event_id": None}))
        await self.ws.close(code=LIMIT_CLOSE_CODE if code == "session_limit_reached" else 1011,
                            message=code.encode())

    # ---- output ----

    async def _run_pump(self, stream: RequestStream) -> None:
        """Send each frame as it comes; a stream that ends while the client is still here ends the session."""
        try:
            await self._pump_frames(stream)
        finally:  # (the client left mid-answer, this task cancelled with the session: counted, unheard)
            if self.live is not None:
                live, self.live = self.live, None
                self.stats.response_done(live["id"], "cancelled", None)

    async def _pump_frames(self, stream: RequestStream) -> None:
        try:
            async for chunk in stream:
                if isinstance(chunk.output, AudioOutput) and chunk.output.frame is not None:
                    await self._on_frame(chunk.output, chunk.output.frame,
                                         send=stream.backlog() <= MAX_SEND_BACKLOG_FRAMES)
        except ClientGone:
            return
        except RequestError as err:
            if self._closing:
                return
            api = from_exception(err)  # (the REST routes' code and type for the same error)
            code = "session_limit_reached" if "session_limit_reached" in str(err) else api.code or "server_error"
            fail = (code, str(err), api.type)
        except Exception as err:  # this session's boundary: log it, tell the client, end the session
            log.exception("realtime.duplex_error", session_id=self.id, error=type(err).__name__)
            fail = ("server_error", f"internal error: {type(err).__name__}", "server_error")
        else:
            fail = None
        self._ending = True
        log.warning("realtime.duplex_ended", session_id=self.id, code=fail[0] if fail else "completed")
        try:
            if fail is None:
                await self._close_live("completed", None)
                await self.ws.close(code=1000, message=b"the model's stream ended")
                return
            await self._close_live("failed", {"type": "failed", "error": {"type": fail[2], "code": fail[0],
                                                                          "message": fail[1]}})
            await self._fail(fail[0], fail[1], fail[2])
        except ClientGone:
            return

    async def _on_frame(self, out: AudioOutput, frame: DuplexFrame, send: bool = True) -> None:
        self.dstats.frame(frame.frame_ms, frame.start_lag_ms, frame.late, frame.input_to_output_ms,
                          frame.dropped_input_s)
        if not send:
            self.dstats.unsent_frames += 1
        if self.muted or not send:
            return
        live = self.live or await self._open_live()
        text, fmt = frame.text, self.cfg.output_audio_format
        x = out.audio
        if len(x) and out.sample_rate != wire_rate(fmt):
            if self._out is None:
                self._out = Resampler(out.sample_rate, wire_rate(fmt))
            x = self._out.push(x)
        # The item holds the frame before it is sent (no await between): a retrieve or truncate the loop
        # handles meanwhile sees what the client was sent or is about to be.
        hear(live["item"].content[0], live["clock"].ms(len(x), wire_rate(fmt)), text)
        if len(x):
            await self.send(ev.AudioDelta(response_id=live["id"], item_id=live["item"].id,
                                          delta=encode_wire(x, fmt)))
        if text and self.live is live:  # (a cancel may have closed it while the audio was sent)
            await self.send(ev.TranscriptDelta(response_id=live["id"], item_id=live["item"].id, delta=text))

    def _render_response(self, live: dict[str, Any], status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        ga = self.dialect == "ga"  # (GA writes the voice and format under `audio.output`, as responses.py)
        audio = ({"audio": {"output": {"format": render_format(self.cfg.output_audio_format), "voice": self.cfg.voice}}}
                 if ga else {"voice": self.cfg.voice, "output_audio_format": self.cfg.output_audio_format})
        return {"object": "realtime.response", "id": live["id"], "status": status, "status_details": details,
                "output": [render_item(live["item"], self.dialect)] if status != "in_progress" else [],
                "conversation_id": self.conversation.id, "output_modalities" if ga else "modalities": ["audio"],
                **audio, "usage": None, "metadata": None}

    async def _open_live(self) -> dict[str, Any]:
        """A new response, its item added to the conversation (the oldest of ITEMS_KEPT deleted)."""
        item = Item(id=new_id("item"), role="assistant", status="in_progress", content=[Part("audio", transcript="")])
        live = self.live = {"id": new_id("resp"), "item": item, "clock": AudioClock()}
        prev = self.conversation.add(item)
        self._items.append(item.id)
        dropped = self._items.popleft() if len(self._items) > ITEMS_KEPT else None
        dropped = dropped if dropped is not None and self.conversation.delete(dropped) else None
        await self.send(ev.ResponseCreated(response=self._render_response(live, "in_progress", None)))
        rendered = {**render_item(item, self.dialect), "content": []}
        await self.send(ev.OutputItemAdded(response_id=live["id"], output_index=0, item=rendered))
        await self.send(ev.ItemCreated(previous_item_id=prev, item=rendered))
        await self.send(ev.ContentPartAdded(response_id=live["id"], item_id=item.id,
                                            part=render_part(item.content[0], self.dialect)))
        if dropped is not None:  # (after the new item's announcement: clients learn of both in order)
            await self.send(ev.ItemDeleted(item_id=dropped))
        return live

    async def _close_live(self, status: str, details: dict[str, Any] | None) -> None:
        live, self.live = self.live, None
        if live is None:
            return
        self.stats.response_done(live["id"], status, None)  # (counted even if the client never hears its end)
        if self.ws.closed:
            return
        item = live["item"]
        item.status = "completed" if status == "completed" else "incomplete"
        part = item.content[0]
        rid, iid = live["id"], item.id
        await self.send(ev.AudioDone(response_id=rid, item_id=iid))
        await self.send(ev.TranscriptDone(response_id=rid, item_id=iid, transcript=part.transcript or ""))
        await self.send(ev.ContentPartDone(response_id=rid, item_id=iid, part=render_part(part, self.dialect)))
        rendered = render_item(item, self.dialect)
        await self.send(ev.OutputItemDone(response_id=rid, output_index=0, item=rendered))
        if self.dialect == "ga":
            await self.send(ev.ItemDone(previous_item_id=None, item=rendered))
        await self.send(ev.ResponseDone(response=self._render_response(live, status, details)))

    async def _close_response(self) -> None:
        """The connection ended: abort the session's request in the stage and stop the pump."""
        self._closing = True
        if self.stream is not None and not self.stream.ended:
            self.stream.abort()
        if self._pump is not None:
            if not self._ending:  # (one ending the session is closing the socket: let it finish)
                self._pump.cancel()
            await asyncio.wait({self._pump})
