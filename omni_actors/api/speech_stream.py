"""WebSocket /v1/audio/speech/stream: text streamed in (token by token is fine), speech streamed out.

Client events (JSON; text frames, or binary frames holding the same JSON, as on /v1/realtime):

    {"type": "session.update", "session": {"model", "voice", "response_format", "instructions",
                                           "speed", "seed"}}      any subset; answered session.updated
    {"type": "input_text.append", "text": "..."}
    {"type": "input_text.flush"}      speak what is buffered now
    {"type": "input_text.done"}       no more text for this utterance: finish it, then speech.audio.done

Each may carry an "event_id", echoed in the error it causes.

Server events: session.created, session.updated, speech.audio.delta {"audio": base64 of
`response_format` bytes}, speech.audio.done {"usage"}, error {"error": {"type", "code", "message",
"param", "event_id"}} (the session lives on).

A text runs from its first input_text.append to its input_text.done. session.update inside
one is refused (error, code "text_in_progress"); between texts it is taken and applies to
the texts appended after it. A text keeps the settings it started with (TextSettings) to its
speech.audio.done, even while it is still speaking after its input_text.done and the session
has since been updated.

session.created / session.updated also say "sample_rate", the rate of the audio deltas
(read-only; ignored in session.update): 24000 for pcm, the default (OpenAI's pcm, as on
POST /v1/audio/speech), else the model's (null when the model does not declare it; the
format's own header says it then). "seed" is the session's: the client's, else one drawn
at random when the session opens; every clause of every text is made with it, so a
sampled voice keeps its speaker from clause to clause.

The buffered text is cut at clause boundaries (CLAUSE; a clause grows to at most
MAX_CLAUSE_CHARS) and each clause is one pipeline
request, started as soon as its boundary arrives, long before input_text.done; up to
MAX_AHEAD clauses run at once and their audio is sent strictly in text order, through
one encoder per utterance (one wav header, one mp3 stream). After speech.audio.done the
same session can speak the next text. Closing the socket aborts every request it holds.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from omni_actors.api.calls import PipelineCall, orchestrator, require_model, route_model
from omni_actors.api.errors import ApiError, bad_request, from_exception, validation_detail
from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.api.realtime.client_events import event_id_of
from omni_actors.api.schemas import Instructions, Seed, SpeechFormat, VoiceRef
from omni_actors.api.speech import Encoding, audio_of, speech_usage
from omni_actors.api.speech_audio import FORMATS, PCM_RATE, wire_rate
from omni_actors.api.speech_inputs import SpeechCall, require_speech_model, speech_call
from omni_actors.errors import AdmissionError, RequestError, StageUnavailable
from omni_actors.orchestrator.core import Orchestrator

ROUTE = "/v1/audio/speech/stream"
CLAUSE = re.compile(r"[.!?;:,](?=\s)|[\u3002\uff01\uff1f\uff0c\uff1b]|\n")
"""A clause ends at Latin punctuation followed by white space, at CJK punctuation, or at a newline."""
MAX_CLAUSE_CHARS = 240
MAX_AHEAD = 2
"""Clauses synthesized at once (the next one starts while the current one is sent)."""
MAX_BUFFER_CHARS = 4096
"""Text held waiting for a clause end; past it the text is spoken as it is."""
HEARTBEAT_S = 30.0
MAX_MESSAGE_BYTES = 1 << 20
SESSION_SEED_BOUND = 1 << 31
"""A session without a client seed draws one in [0, this)."""
CLAUSE_ERRORS = (ApiError, RequestError, AdmissionError, StageUnavailable)
"""What ends one clause with an `error` event (the text and the session go on). A clause refused at
submit (a stage's queue full: REST's 429 `queue_full`; no ready replica: 503) is one too: before
2026-12-05 those ended the clause's task unseen, and its audio was missing with no word to the client."""


class SessionConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    model: str | None = None
    voice: str | VoiceRef | None = None
    response_format: SpeechFormat = "pcm"
    instructions: Instructions | None = None
    speed: float = 1.0
    seed: Seed | None = None


class TextSettings(msgspec.Struct, frozen=True):
    """What a text is spoken with: the session's settings when it started, kept to its end."""

    config: SessionConfig
    orch: Orchestrator
    """The pipeline serving `config.model`."""
    api_speed: float = 1.0
    """The speed the API applies to the audio (1.0 where the model speaks at `config.speed` itself)."""
    rate: int | None = None
    """The model's sample rate, where it declares one."""


class ClientEvent(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    session: dict[str, Any] | None = None
    text: str | None = None
    event_id: str | None = None


def split_clauses(buffer: str, final: bool) -> tuple[list[str], str]:
    """Whole clauses at the front of `buffer`, and the rest (everything when `final`)."""
    out: list[str] = []
    start = 0
    for m in CLAUSE.finditer(buffer):
        out.append(buffer[start : m.end()])
        start = m.end()
    rest = buffer[start:]
    while len(rest) > MAX_CLAUSE_CHARS:
        cut = rest.rfind(" ", 0, MAX_CLAUSE_CHARS)
        cut = cut if cut > 0 else MAX_CLAUSE_CHARS
        out.append(rest[:cut])
        rest = rest[cut:]
    if final:
        out.append(rest)
        rest = ""
    return [c for c in out if c.strip()], rest


class Utterance:
    """One text from its first clause to speech.audio.done: clause requests and their ordered sender."""

    def __init__(self, session: Session, after: asyncio.Task | None) -> None:
        self.session = session
        self.settings = session.settings
        self.clauses: asyncio.Queue[tuple[asyncio.Queue, asyncio.Event] | None] = asyncio.Queue()
        """Each clause's audio queue and the event its sender sets once all of that audio has been sent."""
        self.sent: list[asyncio.Event] = []
        """Every clause's event: all set when the sender ends, however it ends (no clause keeps its place)."""
        self.words = 0
        self.tokens: list[dict[int, tuple[int, int]]] = []
        """Each clause request's stage tokens (its usage), as they end."""
        self.runs: set[asyncio.Task] = set()
        self.voiced: asyncio.Future[SpeechCall] | None = None
        """The text's voice, style and speed resolved once, at its first clause (a custom voice's clip read
        and resampled then): every clause speaks with it, even if the voice is deleted mid-text (before
        2026-12-05 each clause read the voice again, and the clauses after a delete were errors)."""
        self.sender = asyncio.ensure_future(self._send(after))

    def start(self, clause: str) -> None:
        out: asyncio.Queue = asyncio.Queue()
        sent = asyncio.Event()
        self.sent.append(sent)
        self.words += len(clause.split())
        run = asyncio.ensure_future(self._run(clause, out, sent))
        self.runs.add(run)
        run.add_done_callback(self.runs.discard)
        self.clauses.put_nowait((out, sent))

    def end(self) -> None:
        self.clauses.put_nowait(None)

    async def _run(self, clause: str, out: asyncio.Queue, sent: asyncio.Event) -> None:
        """Synthesize `clause` into `out` (then None). Its place among the MAX_AHEAD is held until its audio
        has been sent, so a client that reads slowly (or not at all) holds the synthesis back: at most
        MAX_AHEAD clauses of audio wait in memory (before 2026-12-05 a place was freed when the audio was
        made, and a client that did not read had the whole text synthesized and held, however long)."""
        try:
            async with self.session.ahead:
                try:
                    await self._synthesize(clause, out)
                except CLAUSE_ERRORS as err:
                    out.put_nowait(err)
                out.put_nowait(None)
                await sent.wait()
        finally:
            out.put_nowait(None)  # (cancelled before its end: the sender does not wait; a second None is never read)

    async def _synthesize(self, clause: str, out: asyncio.Queue) -> None:
        s, st = self.session, self.settings
        cfg = st.config
        if self.voiced is None:
            self.voiced = asyncio.ensure_future(speech_call(
                s.request, st.orch.pipeline, "-", cfg.voice, cfg.instructions, cfg.speed, cfg.seed))
        what = await asyncio.shield(self.voiced)  # (one clause cancelled leaves it to the others)
        inputs = {**what.inputs, "text": clause}
        async with PipelineCall(s.request, ROUTE, inputs, dict(what.params), {"audio"}, orch=st.orch) as call:
            async for chunk in call:
                if (got := audio_of(chunk)) is not None:
                    out.put_nowait(got)
            assert call.stream is not None
            self.tokens.append(call.stream.stage_tokens)

    async def _send(self, after: asyncio.Task | None) -> None:
        """Audio of each clause in text order, then speech.audio.done (after the previous text's)."""
        try:
            await self._send_all(after)
        finally:
            for sent in self.sent:  # (a sender that failed or was cancelled leaves no clause holding a place)
                sent.set()

    async def _send_all(self, after: asyncio.Task | None) -> None:
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)
        s, st = self.session, self.settings
        enc = Encoding(st.config.response_format, st.api_speed, st.rate)
        chunks = 0
        while (clause := await self.clauses.get()) is not None:
            queue, sent = clause
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    await s.error(item if isinstance(item, ApiError) else from_exception(item))
                    continue
                chunks += 1
                if data := await enc.feed(*item):
                    await s.send({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            sent.set()  # (its place among the MAX_AHEAD goes to the next clause)
        if tail := await enc.finish():
            await s.send({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
        usage = speech_usage(self.words, chunks, self.tokens)
        await s.send({"type": "speech.audio.done", "usage": msgspec.to_builtins(usage)})

    def cancel(self) -> None:
        self.sender.cancel()
        for run in list(self.runs):
            run.cancel()
        if self.voiced is not None:
            self.voiced.cancel()


class Session:
    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        self.request, self.ws = request, ws
        orch = orchestrator(request)
        self.settings = TextSettings(SessionConfig(model=require_model(orch, None),
                                                   seed=secrets.randbelow(SESSION_SEED_BOUND)), orch)
        """What the next text is spoken with; each Utterance keeps the one it started with."""
        self.buffer = ""
        self.in_text = False
        """Between a text's first input_text.append and its input_text.done: session.update is refused."""
        self.ahead = asyncio.Semaphore(MAX_AHEAD)
        self.current: Utterance | None = None
        self.last: asyncio.Task | None = None
        self.all: set[Utterance] = set()
        """The texts not yet done (their speech.audio.done sent): each is let go then, so a long-lived
        session holds only what it is still speaking (before 2026-12-05 it kept every text to the end)."""

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(msgspec.json.encode(event).decode())

    async def error(self, err: ApiError, event_id: str | None = None) -> None:
        await self.send({"type": "error", "error": {**err.body()["error"], "event_id": event_id}})

    def described(self) -> dict[str, Any]:
        fmt, rate = self.settings.config.response_format, self.settings.rate
        wire = PCM_RATE if fmt == "pcm" else wire_rate(fmt, rate) if rate else None
        return {**msgspec.structs.asdict(self.settings.config), "sample_rate": wire}  # every field, defaults too

    async def update(self, raw: dict[str, Any] | None) -> None:
        if self.in_text:
            raise bad_request("session.update is not allowed in the middle of a text; send input_text.done "
                              "first", "session", "text_in_progress")
        raw = {k: v for k, v in (raw or {}).items() if k != "sample_rate"}  # read-only (an echoed session)
        if raw.get("seed", 0) is None:
            raw.pop("seed")  # the session keeps one seed: null does not take it away
        try:
            new = msgspec.convert({**msgspec.to_builtins(self.settings.config), **raw}, SessionConfig)
        except msgspec.ValidationError as err:
            msg, path, code = validation_detail(err)
            raise bad_request(f"session: {msg}", f"session.{path}" if path else "session", code) from None
        orch, _ = self.request.app[PIPELINES_KEY].find(new.model, {"audio"}, "session.model")
        # as at connect (a Stable Audio model was taken here before 2026-12-05, and each text then failed on
        # its stage's "prompt: a string is required")
        require_speech_model(orch, new.model, "session.model")
        if not 0.25 <= new.speed <= 4.0:
            raise bad_request("speed must be between 0.25 and 4.0", "session.speed")
        if new.response_format not in FORMATS:
            raise bad_request(f"response_format must be one of {list(FORMATS)}", "session.response_format")
        try:
            what = await speech_call(self.request, orch.pipeline, "-", new.voice, new.instructions, new.speed,
                                     new.seed)
        except ApiError as err:  # (a field of the update: named as the other update errors are)
            if err.param and not err.param.startswith("session"):
                err.param = f"session.{err.param}"
            raise
        self.settings = TextSettings(new, orch, what.api_speed, what.sample_rate)  # for the next texts only
        await self.send({"type": "session.updated", "session": self.described()})

    def append(self, text: str) -> None:
        self.in_text = True
        self._take(text, final=False)

    def flush(self) -> None:
        self._take("", final=True)

    def done(self) -> None:
        self._take("", final=True)
        self._utterance().end()  # an empty text still gets its speech.audio.done
        self.current, self.in_text = None, False

    def _take(self, text: str, final: bool) -> None:
        """Buffer `text`; start every whole clause (all of it when `final`)."""
        if len(self.buffer) + len(text) > MAX_BUFFER_CHARS:
            final = True  # a text with no clause end for this long is spoken as it is
        clauses, self.buffer = split_clauses(self.buffer + text, final)
        for clause in clauses:
            self._utterance().start(clause)

    def _utterance(self) -> Utterance:
        """The current text's, started (with the session's settings now) at its first clause."""
        if self.current is None:
            utt = self.current = Utterance(self, self.last)
            self.last = utt.sender
            self.all.add(utt)
            utt.sender.add_done_callback(lambda _: self.all.discard(utt))
        return self.current

    def close(self) -> None:
        for utt in list(self.all):  # (each sender's done callback leaves the set)
            utt.cancel()


async def speech_stream(request: web.Request) -> web.StreamResponse:
    require_speech_model(*route_model(request, request.query.get("model"), {"audio"}))
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE_BYTES)
    await ws.prepare(request)
    session = Session(request, ws)
    await session.send({"type": "session.created", "session": session.described()})
    decoder = msgspec.json.Decoder(ClientEvent)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.ERROR:
                break
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            event_id = None
            try:
                event = decoder.decode(msg.data)  # a binary frame holds the same JSON, as on /v1/realtime
                event_id = event.event_id
                match event.type:
                    case "session.update":
                        await session.update(event.session)
                    case "input_text.append":
                        session.append(event.text or "")
                    case "input_text.flush":
                        session.flush()
                    case "input_text.done":
                        session.done()
                    case other:
                        raise bad_request(f"unknown event type {other!r}", "type", "unknown_event")
            except msgspec.DecodeError as err:
                await session.error(bad_request(f"invalid event: {err}", None, "invalid_event"),
                                    event_id_of(msg.data))
            except RecursionError:  # (thousands of nested levels exhaust the decoder's stack)
                await session.error(bad_request("invalid event: nested too deeply", None, "invalid_event"), None)
            except ApiError as err:
                await session.error(err, event_id)
    finally:
        session.close()
    return ws
