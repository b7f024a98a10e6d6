"""A /v1/realtime session: one session object and one receive loop per connection (the route: route.py).

The loop decodes each client event and dispatches it with `match`. Input audio
(appends, VAD turns, commits, live transcription) is input_audio.py's half of the
session; conversation items from the client (item.create/.retrieve/.truncate, response.create's
`input`) are client_items.py's; session.update and its checks are session_updates.py's. Responses
run as tasks (responses.py) that send their own deltas: the conversation's, one at a time, and
out-of-band ones (`conversation: "none"`) beside it, MAX_RESPONSES in all; a transcription session
transcribes each committed turn instead (transcription.py). Any bad event is answered with an `error`
event and the session goes on; a closed or vanished client aborts its responses in every stage. A
session opened with a client secret (client_secrets.py) starts from the secret's session, applied as
a session.update is."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import replace

from aiohttp import WSMsgType, web

from omni_actors import logs
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import Resampler, WireStream, wire_rate
from omni_actors.api.realtime.client_items import ClientItems
from omni_actors.api.realtime.client_secret_store import CLIENT_SECRET_KEY
from omni_actors.api.realtime.conversation import Conversation, InputBuffer, new_id
from omni_actors.api.realtime.input_audio import InputAudio
from omni_actors.api.realtime.live_transcription import LiveTurn
from omni_actors.api.realtime.response_request import Options
from omni_actors.api.realtime.responses import ResponseRun
from omni_actors.api.realtime.session import SessionConfig
from omni_actors.api.realtime.session_updates import SessionUpdates
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.api.realtime.vad import VAD_RATE, VadDetector
from omni_actors.orchestrator.core import Orchestrator

log = logs.get(__name__)

MAX_EVENT_BYTES = 15 * 1024 * 1024 + 64 * 1024
"""Largest client event we act on: a 15 MiB append plus its JSON envelope."""
MAX_RESPONSES = 4
"""Responses one session runs at once: its conversation's (one at most) and out-of-band ones
(`response.conversation: "none"`); one more is an `error` (response_limit_reached)."""


class ClientGone(ConnectionError):
    """The WebSocket closed while we were sending to it."""


class RealtimeSession(InputAudio, ClientItems, SessionUpdates):
    def __init__(self, ws: web.WebSocketResponse, request: web.Request, orch: Orchestrator, model: str,
                 stats: RealtimeStats) -> None:
        self.ws = ws
        self.request = request  # (the upgrade request: what the REST helpers this session reuses take)
        self.app = request.app
        self.max_audio = int(orch.deploy.server.realtime_max_audio_s * VAD_RATE)
        self.max_text = int(orch.deploy.server.max_body_mb * 1024 * 1024)
        """Most text (characters, Item.size) the conversation holds: what one REST request body may carry, as
        every response sends the whole conversation to the pipeline as one chat request would."""
        self.orch = orch
        self.stats = stats
        self.id = new_id("sess")
        self.dialect: ev.Dialect = "beta"
        audio_out = "audio" in orch.pipeline.output_types()
        self.cfg = SessionConfig(model=model, modalities=("text", "audio") if audio_out else ("text",))
        self.beta_transcription = request.query.get("intent") == "transcription"
        """OpenAI's beta transcription API (`?intent=transcription`, or a `transcription_session.update`): the
        GA transcription session under beta names (transcription_session.created/.updated, beta fields)."""
        if self.beta_transcription:  # (the route refused the intent where the pipeline makes no transcripts)
            self.cfg = replace(self.cfg, type="transcription")
        self.conversation = Conversation()
        self.buffer = InputBuffer()
        self.timeline = 0  # 16 kHz samples of input audio so far
        self.response: ResponseRun | None = None  # the conversation's response in progress
        self.responses: dict[str, ResponseRun] = {}  # every response in progress, out-of-band ones too
        self.transcribing: dict[str, asyncio.Event] = {}  # user items a response in progress transcribes (responses.py)
        self._transcriptions: set[asyncio.Task] = set()  # a transcription session's turns in flight
        self._live: LiveTurn | None = None  # the turn a streaming recognizer is hearing now
        self._in = Resampler(wire_rate(self.cfg.input_audio_format), VAD_RATE)
        self._wire = WireStream(self.cfg.input_audio_format)  # (holds a pcm16 append's odd last byte)
        self._vad: VadDetector | None = None
        self._speech_item: str | None = None
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._presetting = False  # start_from in progress: its session.updated is not sent
        self._reset_vad()

    # ---- sending ----

    async def send(self, event: ev.ServerEvent) -> None:
        if self._presetting and isinstance(event, ev.SessionUpdated | ev.TranscriptionSessionUpdated):
            return  # (start_from: session.created, sent next, shows the result)
        if self.ws.closed:
            raise ClientGone("websocket closed")
        data = ev.encode_server(event, self.dialect, f"event_{self._prefix}{next(self._ids):x}")
        try:
            await self.ws.send_frame(data, WSMsgType.TEXT)
        except ConnectionError as err:
            raise ClientGone(str(err)) from err

    async def send_error(self, err: ce.BadEvent) -> None:
        await self.send(ev.Error(error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": err.event_id}))

    # ---- the loop ----

    async def start_from(self, s: ce.SessionIn) -> None:
        """Apply a client secret's session before session.created, as a session.update is applied (every check,
        a duplex session's own too) but without its session.updated; a BadEvent changes nothing. Also how
        client_secrets.py checks a secret's session at creation, on a session never connected."""
        self._presetting = True
        try:
            await self._session_update(s, None)
        finally:
            self._presetting = False

    async def serve(self, idle_timeout_s: float) -> None:
        refused: ce.BadEvent | None = None
        if (secret := self.request.get(CLIENT_SECRET_KEY)) is not None and secret.session is not None:
            try:  # (checked when the secret was made; a voice deleted since is refused now)
                await self.start_from(secret.session)
            except ce.BadEvent as err:
                refused = err
        await self.send(self._session_event(updated=False))
        if not self.beta_transcription:  # (OpenAI's beta transcription sessions announce no conversation)
            await self.send(ev.ConversationCreated(conversation={"id": self.conversation.id,
                                                                 "object": "realtime.conversation"}))
        if refused is not None:  # the session goes on with the server's defaults, and the client is told why
            refused.message = f"the client secret's session was not applied: {refused.message}"
            await self.send_error(refused)
        try:
            while True:
                try:
                    msg = await self.ws.receive(timeout=idle_timeout_s)
                except TimeoutError:
                    if self.responses:
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
                raise ce.BadEvent(f"event of {len(raw)} bytes exceeds the {MAX_EVENT_BYTES} byte limit",
                                  code="event_too_large", event_id=ce.event_id_of(raw))
            await self._dispatch(ce.decode_client(raw))
        except ce.BadEvent as err:
            await self.send_error(err)
        except ClientGone:
            raise
        except Exception as err:  # connection boundary: report, log, keep the session
            log.exception("realtime.event_failed", session_id=self.id, error=type(err).__name__)
            await self.send_error(ce.BadEvent(f"internal error: {type(err).__name__}", code="server_error",
                                              type="server_error"))

    async def _dispatch(self, event: ce.ClientEventT) -> None:
        eid = event.event_id
        match event:
            case ce.BufferAppend(audio=audio):
                await self._append(audio, eid)
            case ce.SessionUpdate(session=s):
                if self.beta_transcription:
                    raise ce.BadEvent("a beta transcription session is updated with transcription_session.update",
                                      code="unsupported_in_transcription_session", param="type", event_id=eid)
                await self._session_update(s, eid)
            case ce.TranscriptionSessionUpdate(session=s):
                await self._transcription_session_update(s, eid)
            case ce.BufferCommit():
                await self._commit_manual(eid)
            case ce.BufferClear():
                self.buffer.clear()
                self._in.flush()  # (the resampler's delay holds the last cleared ms: not the next turn's)
                self._wire.clear()  # (an odd byte held from the last append is cleared audio too)
                self._drop_live()
                await self.send(ev.BufferCleared())
            case ce.ItemCreate(item=it, previous_item_id=prev):
                await self._create_item(it, prev, eid)
            case ce.ItemRetrieve(item_id=item_id):
                await self._retrieve_item(item_id, eid)
            case ce.ItemTruncate(item_id=item_id, content_index=ci, audio_end_ms=end):
                await self._truncate(self._item(item_id, eid), ci, end, eid)
            case ce.ItemDelete(item_id=item_id):
                item = self._item(item_id, eid)
                if self.response is not None and any(o is item for o in self.response.output):
                    # An item the conversation's response still streams into (its answer, a call it reads):
                    # stop the response first, as a truncate of a live answer does, so no delta and no
                    # item.done names the item after its conversation.item.deleted.
                    await self._cancel_response("client_cancelled")
                self.conversation.delete(item_id)
                await self.send(ev.ItemDeleted(item_id=item_id))
            case ce.ResponseCreate(response=r):
                await self._create_response(r, eid)
            case ce.ResponseCancel(response_id=rid):  # (no id: the conversation's, as OpenAI's)
                run = self.response if rid is None else self.responses.get(rid)
                if run is None:
                    raise ce.BadEvent("no active response to cancel", code="response_cancel_not_active",
                                      param="response_id" if rid else None, event_id=eid)
                await self._cancel_response("client_cancelled", run)
            case ce.OutputAudioClear():
                await self.send(ev.OutputAudioCleared())

    # ---- responses ----

    async def _create_response(self, r: ce.ResponseIn | None, eid: str | None) -> None:
        if self.cfg.type == "transcription":
            raise ce.BadEvent("a transcription session makes no responses; its committed turns are transcribed",
                              code="unsupported_in_transcription_session", event_id=eid)
        out_of_band = r is not None and r.conversation == "none"  # (runs beside the conversation's)
        if self.response is not None and not out_of_band:
            raise ce.BadEvent(f"conversation already has an active response {self.response.id}",
                              code="conversation_already_has_active_response", event_id=eid)
        if len(self.responses) >= MAX_RESPONSES:
            raise ce.BadEvent(f"this session already runs {MAX_RESPONSES} responses, the most it runs at once; "
                              "wait for a response.done or cancel one", code="response_limit_reached",
                              event_id=eid)
        try:
            if r is not None:
                self._refuse_tools(r.tools, r.tool_choice, "response.")
                await self._check_tool_schemas(r.tools, r.tool_choice, "response.tools")
                if r.voice is not None:
                    await self._check_voice(r.voice, "response.voice")
                if r.audio is not None and r.audio.output is not None and r.audio.output.voice is not None:
                    await self._check_voice(r.audio.output.voice, "response.audio.output.voice")
            context = None
            if r is not None and r.input is not None:
                context = await self._response_input(list(r.input))
            opts = Options.build(self.cfg, r, context)
            if (refusal := self._conversation_refusal()) is not None:  # (a bad field is named first)
                raise ce.BadEvent(refusal, code="unsupported_session_type")
        except ce.BadEvent as err:
            err.event_id = eid
            raise
        run = ResponseRun(self, opts)
        self.responses[run.id] = run
        if opts.in_conversation:
            self.response = run
        # Sent here, not from the run's task: a client's next event (a second response.create, a cancel)
        # is answered after this one's response.created, in the order it sent them.
        await self.send(ev.ResponseCreated(response=run.render()))
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

    async def _cancel_response(self, reason: str, run: ResponseRun | None = None) -> None:
        """Stop `run` (default: the conversation's response) and wait for its response.done."""
        run = run or self.response
        if run is None or run.task is None:
            return
        run.cancel(reason)
        await asyncio.wait({run.task})

    async def _close_response(self) -> None:
        """Stop every response and any turn still being transcribed (each aborts its request)."""
        pending = set(self._transcriptions)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        tasks = {run.task for run in self.responses.values() if run.task is not None}
        for run in self.responses.values():
            run.cancel("client_gone")
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
