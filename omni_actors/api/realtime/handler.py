"""The /v1/realtime WebSocket: one session object and one receive loop per connection.

The loop decodes each client event and dispatches it with `match`. Audio is
decoded, resampled to 16 kHz and run through the VAD off the event loop (one
shared thread), in arrival order. Responses run as tasks (responses.py) that
send their own deltas; a transcription session transcribes each committed
turn instead (transcription.py), or, on a streaming recognizer, each turn while
it is spoken (live_transcription.py). Any bad event is answered with an `error` event and
the session goes on; a closed or vanished client aborts its response in every
stage of the pipeline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import uuid
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web

from omni_actors import logs
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.errors import ApiError
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import AudioFormatError, Resampler, decode_wire, wire_rate
from omni_actors.api.realtime.live_transcription import LiveTurn
from omni_actors.api.realtime.responses import Options, ResponseRun
from omni_actors.api.realtime.session import (
    Conversation,
    InputBuffer,
    Item,
    Part,
    SessionConfig,
    apply_update,
    item_from_client,
    ms,
    new_id,
    render_item,
    render_session,
    truncate,
)
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.api.realtime.transcription import (
    TRANSCRIPTION_ERRORS,
    transcribe_turn,
    transcribes_only,
)
from omni_actors.api.realtime.vad import VAD_RATE, VadDetector, VadEvent
from omni_actors.api.tools import tools_refusal
from omni_actors.orchestrator.core import Orchestrator

log = logs.get(__name__)

MAX_EVENT_BYTES = 15 * 1024 * 1024 + 64 * 1024
"""Largest client event we act on: a 15 MiB append plus its JSON envelope."""
MAX_FRAME_BYTES = 2 * MAX_EVENT_BYTES
"""aiohttp's limit; events between the two get an `error` event, larger ones close the socket (1009)."""
HEARTBEAT_S = 20.0
"""WebSocket ping interval; a client that stops answering is treated as gone."""
MIN_COMMIT_MS = 100
"""Shortest input buffer `input_audio_buffer.commit` accepts (as OpenAI's)."""
INLINE_INGEST_SAMPLES = 4800
"""Appends up to this many wire samples (200 ms at 24 kHz) without VAD are handled on the loop."""
INLINE_AUDIO_SAMPLES = 16000
"""Conversation items with at most this much audio (base64 characters to decode, or 16 kHz samples
to encode: about a second) are converted on the loop; bigger ones in the thread pool."""

VAD_EXECUTOR = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="realtime-vad")
"""One thread for decoding, resampling and VAD of every session (onnxruntime releases the GIL)."""


class ClientGone(ConnectionError):
    """The WebSocket closed while we were sending to it."""


class RealtimeSession:
    def __init__(self, ws: web.WebSocketResponse, app: web.Application, orch: Orchestrator, model: str,
                 stats: RealtimeStats) -> None:
        self.ws = ws
        self.app = app
        self.max_audio = int(orch.deploy.server.realtime_max_audio_s * VAD_RATE)
        self.orch = orch
        self.stats = stats
        self.id = new_id("sess")
        self.dialect: ev.Dialect = "beta"
        audio_out = "audio" in orch.pipeline.output_types()
        self.cfg = SessionConfig(model=model, modalities=("text", "audio") if audio_out else ("text",))
        self.conversation = Conversation()
        self.buffer = InputBuffer()
        self.timeline = 0  # 16 kHz samples of input audio so far
        self.response: ResponseRun | None = None
        self.transcribes_only = transcribes_only(orch.pipeline)
        self._transcriptions: set[asyncio.Task] = set()  # a transcription session's turns in flight
        self._live: LiveTurn | None = None  # the turn a streaming recognizer is hearing now
        self._in = Resampler(wire_rate(self.cfg.input_audio_format), VAD_RATE)
        self._vad: VadDetector | None = None
        self._speech_item: str | None = None
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._reset_vad()

    # ---- sending ----

    async def send(self, event: ev.ServerEvent) -> None:
        if self.ws.closed:
            raise ClientGone("websocket closed")
        data = ev.encode_server(event, self.dialect, f"event_{self._prefix}{next(self._ids):x}")
        try:
            await self.ws.send_frame(data, WSMsgType.TEXT)
        except ConnectionError as err:
            raise ClientGone(str(err)) from err

    async def send_error(self, err: ev.BadEvent) -> None:
        await self.send(ev.Error(error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": err.event_id}))

    # ---- the loop ----

    async def serve(self, idle_timeout_s: float) -> None:
        await self.send(ev.SessionCreated(session=render_session(self.cfg, self.id, self.dialect)))
        await self.send(ev.ConversationCreated(conversation={"id": self.conversation.id,
                                                             "object": "realtime.conversation"}))
        try:
            while True:
                try:
                    msg = await self.ws.receive(timeout=idle_timeout_s)
                except TimeoutError:
                    if self.response is not None:
                        continue
                    log.info("realtime.idle_timeout", session_id=self.id)
                    await self.ws.close(code=1000, message=b"idle timeout")
                    return
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await self._on_raw(msg.data)
                elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    return
        except ClientGone:
            return
        finally:
            await self._close_response()

    async def _on_raw(self, raw: str | bytes) -> None:
        try:
            if len(raw) > MAX_EVENT_BYTES:
                raise ev.BadEvent(f"event of {len(raw)} bytes exceeds the {MAX_EVENT_BYTES} byte limit",
                                  code="event_too_large", event_id=ev.event_id_of(raw))
            await self._dispatch(ev.decode_client(raw))
        except ev.BadEvent as err:
            await self.send_error(err)
        except ClientGone:
            raise
        except Exception as err:  # connection boundary: report, log, keep the session
            log.exception("realtime.event_failed", session_id=self.id, error=type(err).__name__)
            await self.send_error(ev.BadEvent(f"internal error: {type(err).__name__}", code="server_error",
                                              type="server_error"))

    async def _dispatch(self, event: ev.ClientEventT) -> None:
        eid = event.event_id
        match event:
            case ev.BufferAppend(audio=audio):
                await self._append(audio, eid)
            case ev.SessionUpdate(session=s):
                await self._session_update(s, eid)
            case ev.BufferCommit():
                await self._commit_manual(eid)
            case ev.BufferClear():
                self.buffer.clear()
                self._drop_live()
                await self.send(ev.BufferCleared())
            case ev.ItemCreate(item=it, previous_item_id=prev):
                try:
                    (item,) = await self._items_from_client([it])
                    prev = self.conversation.add(item, prev)
                except ev.BadEvent as err:
                    err.event_id = eid
                    raise
                await self._announce_item(item, prev)
            case ev.ItemRetrieve(item_id=item_id):
                item = self._item(item_id, eid)
                held = sum(len(p.audio) for p in item.content if p.audio is not None)
                rendered = (render_item(item, self.dialect, with_audio=True) if held <= INLINE_AUDIO_SAMPLES
                            else await off_loop(render_item, item, self.dialect, True))  # (encodes its audio)
                await self.send(ev.ItemRetrieved(item=rendered))
            case ev.ItemTruncate(item_id=item_id, content_index=ci, audio_end_ms=end):
                await self._truncate(self._item(item_id, eid), ci, end, eid)
            case ev.ItemDelete(item_id=item_id):
                self._item(item_id, eid)
                self.conversation.delete(item_id)
                await self.send(ev.ItemDeleted(item_id=item_id))
            case ev.ResponseCreate(response=r):
                await self._create_response(r, eid)
            case ev.ResponseCancel(response_id=rid):
                if self.response is None or (rid is not None and rid != self.response.id):
                    raise ev.BadEvent("no active response to cancel", code="response_cancel_not_active",
                                      param="response_id" if rid else None, event_id=eid)
                await self._cancel_response("client_cancelled")
            case ev.OutputAudioClear():
                await self.send(ev.OutputAudioCleared())

    # ---- session and items ----

    def _refuse_tools(self, tools: Any, tool_choice: Any, prefix: str) -> None:
        if (refusal := tools_refusal(self.orch.pipeline, tools, tool_choice, prefix)) is not None:
            raise ev.BadEvent(refusal[0], code="unsupported_parameter", param=refusal[1])

    async def _session_update(self, s: ev.SessionIn, eid: str | None) -> None:
        try:
            self._refuse_tools(s.tools, s.tool_choice, "session.")
            cfg, dialect = apply_update(self.cfg, s)
            if self.transcribes_only and s.type == "realtime":
                raise ev.BadEvent(self._only_transcribes(), code="unsupported_session_type", param="session.type")
            if cfg.type == "transcription" and "transcript" not in self.orch.pipeline.output_types():
                raise ev.BadEvent(f"pipeline {self.orch.pipeline.name!r} makes no transcripts: it cannot serve a "
                                  "transcription session", code="unsupported_session_type", param="session.type")
        except ev.BadEvent as err:
            err.event_id = eid
            raise
        old, self.cfg = self.cfg, cfg
        if dialect is not None:
            self.dialect = dialect
        if cfg.input_audio_format != old.input_audio_format:
            self._in = Resampler(wire_rate(cfg.input_audio_format), VAD_RATE)
        if cfg.turn_detection != old.turn_detection:
            self._reset_vad()
        await self.send(ev.SessionUpdated(session=render_session(self.cfg, self.id, self.dialect)))

    def _only_transcribes(self) -> str:
        return (f"model {self.cfg.model!r} only transcribes: it cannot hold a conversation; open a "
                "transcription session (session.update with session.type 'transcription')")

    def _reset_vad(self) -> None:
        td = self.cfg.turn_detection
        self._vad = VadDetector(td.vad_params(), origin=self.timeline) if td is not None else None
        self._speech_item = None
        self._drop_live()

    async def _items_from_client(self, items: list[ev.ItemIn]) -> list[Item]:
        """Client items with their audio decoded: refused by size before any decoding (the
        session's audio limit, from the base64 length), decoded off the loop when big."""
        b64 = [len(c.audio) for it in items for c in it.content if c.type == "input_audio" and c.audio]
        self._check_audio_room(sum(self._vad_samples(n) for n in b64))
        fmt = self.cfg.input_audio_format
        if sum(b64) <= INLINE_AUDIO_SAMPLES:
            return [item_from_client(it, fmt) for it in items]
        return await off_loop(lambda: [item_from_client(it, fmt) for it in items])

    def _vad_samples(self, b64_chars: int) -> int:
        """How many 16 kHz samples `b64_chars` of base64 audio in the session's format come to."""
        fmt = self.cfg.input_audio_format
        wire_samples = b64_chars * 3 // 4 // (2 if fmt == "pcm16" else 1)
        return wire_samples * VAD_RATE // wire_rate(fmt)

    def _item(self, item_id: str, eid: str | None) -> Item:
        item = self.conversation.get(item_id)
        if item is None:
            raise ev.BadEvent(f"item {item_id!r} does not exist", code="item_not_found", param="item_id",
                              event_id=eid)
        return item

    async def _announce_item(self, item: Item, prev: str | None) -> None:
        rendered = render_item(item, self.dialect)
        await self.send(ev.ItemCreated(previous_item_id=prev, item=rendered))
        if self.dialect == "ga":
            await self.send(ev.ItemDone(previous_item_id=prev, item=rendered))

    async def _truncate(self, item: Item, ci: int, end_ms: int, eid: str | None) -> None:
        if item.role != "assistant" or not 0 <= ci < len(item.content) or item.content[ci].type != "audio":
            raise ev.BadEvent("only an assistant audio content part can be truncated", param="content_index",
                              event_id=eid)
        part = item.content[ci]
        if not 0 <= end_ms <= part.audio_ms:
            raise ev.BadEvent(f"audio_end_ms must be between 0 and the part's {part.audio_ms} ms",
                              param="audio_end_ms", event_id=eid)
        truncate(part, end_ms)
        await self.send(ev.ItemTruncated(item_id=item.id, content_index=ci, audio_end_ms=end_ms))

    # ---- input audio ----

    def _ingest(self, b64: str) -> tuple[np.ndarray, list[VadEvent]]:
        """Decode, resample to 16 kHz, run the VAD. Plain def: runs in VAD_EXECUTOR for big inputs."""
        x, _rate = decode_wire(b64, self.cfg.input_audio_format)
        x16 = self._in.push(x)
        return x16, (self._vad.feed(x16) if self._vad is not None else [])

    async def _append(self, b64: str, eid: str | None) -> None:
        vad = self._vad
        try:  # checked before the VAD hears it: refused audio leaves no trace
            self._check_audio_room(self._vad_samples(len(b64)))
        except ev.BadEvent as err:
            err.event_id = eid
            raise
        try:
            if vad is None and len(b64) * 3 // 8 <= INLINE_INGEST_SAMPLES:
                x16, turns = self._ingest(b64)
            else:
                loop = asyncio.get_running_loop()
                x16, turns = await loop.run_in_executor(VAD_EXECUTOR, self._ingest, b64)
        except AudioFormatError as err:
            raise ev.BadEvent(str(err), param="audio", event_id=eid) from None
        self.buffer.append(x16)
        self.timeline += len(x16)
        for turn in turns:
            if turn.kind == "start":
                await self._speech_started(turn.sample)
            else:
                await self._speech_stopped(turn.sample)
        if self._hears_live() and self._live is None and vad is None and self.buffer.size:
            self._speech_item = new_id("item")  # manual commits: the turn starts with its first audio
            await self._open_live(self._speech_item)
        if self._live is not None:
            self._live.catch_up(self.buffer)
        td = self.cfg.turn_detection
        if vad is not None and td is not None and not vad.speaking:
            self.buffer.drop_before(vad.position - td.prefix_padding_ms * VAD_RATE // 1000)

    def _check_audio_room(self, samples: int) -> None:
        """Refuse audio that would take the session past server.realtime_max_audio_s."""
        held = self.buffer.size + self.conversation.audio_samples()
        if samples and held + samples > self.max_audio:
            raise ev.BadEvent(f"the session would hold {ms(held + samples) // 1000} s of audio; the limit is "
                              f"{ms(self.max_audio) // 1000} s (server.realtime_max_audio_s): commit or clear "
                              "the input buffer, or delete conversation items",
                              code="audio_limit_exceeded", param="audio")

    async def _speech_started(self, pos: int) -> None:
        self._speech_item = new_id("item")
        self.buffer.drop_before(pos)
        await self.send(ev.SpeechStarted(audio_start_ms=ms(pos), item_id=self._speech_item))
        if self._hears_live():
            await self._open_live(self._speech_item)
        td = self.cfg.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            await self._cancel_response("turn_detected")

    async def _speech_stopped(self, pos: int) -> None:
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        await self.send(ev.SpeechStopped(audio_end_ms=ms(pos), item_id=item_id))
        await self._commit(self.buffer.take(until=pos), item_id)
        td = self.cfg.turn_detection
        if td is not None and td.create_response and self.response is None and self.cfg.type == "realtime":
            await self._create_response(None, None)

    async def _commit_manual(self, eid: str | None) -> None:
        tail = self._in.flush()  # the resampler's delay: the last few ms appended belong to this item
        self.buffer.append(tail)
        self.timeline += len(tail)
        if ms(self.buffer.size) < MIN_COMMIT_MS:
            raise ev.BadEvent(f"buffer too small: {ms(self.buffer.size)} ms of audio, need {MIN_COMMIT_MS} ms",
                              code="input_audio_buffer_commit_empty", event_id=eid)
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        await self._commit(self.buffer.take(), item_id)

    async def _commit(self, audio: np.ndarray, item_id: str) -> None:
        item = Item(id=item_id, role="user", content=[Part("input_audio", audio=audio)])
        prev = self.conversation.add(item)
        await self.send(ev.BufferCommitted(previous_item_id=prev, item_id=item_id))
        await self._announce_item(item, prev)
        live, self._live = self._live, None
        if live is not None and live.item_id == item_id:
            live.finish(audio, item)
        elif self.cfg.type == "transcription":
            if live is not None:
                live.task.cancel()
            task = asyncio.ensure_future(transcribe_turn(self, item))
            self._transcriptions.add(task)
            task.add_done_callback(self._transcription_ended)

    def _hears_live(self) -> bool:
        """True when turns are transcribed while spoken (a streaming recognizer in a transcription session)."""
        return self.cfg.type == "transcription" and self.orch.pipeline.live_transcription

    async def _open_live(self, item_id: str) -> None:
        self._drop_live()
        try:
            self._live = await LiveTurn.open(self, item_id, self.buffer.start)
        except TRANSCRIPTION_ERRORS as err:  # refused now: the turn is transcribed once committed instead
            log.warning("realtime.live_transcription_refused", session_id=self.id, error=type(err).__name__)
            return
        self._transcriptions.add(self._live.task)
        self._live.task.add_done_callback(self._transcription_ended)

    def _drop_live(self) -> None:
        """Forget the turn being heard (its audio was cleared): abort its request."""
        live, self._live = self._live, None
        if live is not None:
            live.task.cancel()

    # ---- responses ----

    async def _create_response(self, r: ev.ResponseIn | None, eid: str | None) -> None:
        if self.cfg.type == "transcription":
            raise ev.BadEvent("a transcription session makes no responses; its committed turns are transcribed",
                              code="unsupported_in_transcription_session", event_id=eid)
        if self.transcribes_only:
            raise ev.BadEvent(self._only_transcribes(), code="unsupported_session_type", event_id=eid)
        if self.response is not None:
            raise ev.BadEvent(f"conversation already has an active response {self.response.id}",
                              code="conversation_already_has_active_response", event_id=eid)
        try:
            if r is not None:
                self._refuse_tools(r.tools, r.tool_choice, "response.")
            context = None
            if r is not None and r.input is not None:
                context = await self._items_from_client(list(r.input))
            opts = Options.build(self.cfg, r, context)
        except ev.BadEvent as err:
            err.event_id = eid
            raise
        self.response = run = ResponseRun(self, opts)
        run.start().add_done_callback(self._response_ended)

    def _transcription_ended(self, task: asyncio.Task) -> None:
        self._transcriptions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            if not isinstance(err, ClientGone):
                log.error("realtime.transcription_error", session_id=self.id, error=repr(err))

    def _response_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            if not isinstance(err, ClientGone):
                log.error("realtime.response_failed", session_id=self.id, error=repr(err))

    async def _cancel_response(self, reason: str) -> None:
        run = self.response
        if run is None or run.task is None:
            return
        run.cancel(reason)
        await asyncio.wait({run.task})

    async def _close_response(self) -> None:
        """Stop the response and any turn still being transcribed (each aborts its request)."""
        pending = set(self._transcriptions)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        run = self.response
        if run is not None and run.task is not None:
            run.cancel("client_gone")
            run.task.cancel()
            await asyncio.wait({run.task})


# ---- the route --------------------------------------------------------------------


async def realtime_handler(request: web.Request, orch: Orchestrator, sessions: set[Any],
                           stats: RealtimeStats) -> web.StreamResponse:
    server = orch.deploy.server  # (the API key was checked by the app's auth middleware, as for every route)
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, compress=False, heartbeat=HEARTBEAT_S,
                               protocols=("realtime",))
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "/v1/realtime is a WebSocket endpoint: open it with a WebSocket upgrade request",
                       None, "websocket_upgrade_required")
    await ws.prepare(request)
    if len(sessions) >= server.max_realtime_sessions:
        stats.sessions_rejected += 1
        log.warning("realtime.session_limit", limit=server.max_realtime_sessions)
        await ws.close(code=1013, message=f"too many realtime sessions (limit {server.max_realtime_sessions})".encode())
        return ws
    model = request.query.get("model") or server.served_model_name or orch.deploy.pipeline
    if orch.pipeline.duplex:  # full-duplex model: one long streaming request per session
        from omni_actors.api.realtime.duplex import DuplexSession  # imports this module

        session: RealtimeSession = DuplexSession(ws, request.app, orch, model, stats)
    else:
        session = RealtimeSession(ws, request.app, orch, model, stats)
    sessions.add(session)
    stats.sessions_total += 1
    stats.sessions_open = len(sessions)
    log.info("realtime.session_open", session_id=session.id, sessions=len(sessions))
    try:
        await session.serve(server.realtime_idle_timeout_s)
    finally:
        sessions.discard(session)
        stats.sessions_open = len(sessions)
        if not ws.closed:
            await ws.close()
        log.info("realtime.session_closed", session_id=session.id, sessions=len(sessions))
    return ws
