"""Transcription sessions (GA `session.type: "transcription"`): each committed turn transcribed, no response.

    task = asyncio.ensure_future(transcribe_turn(host, item))   # per committed user item

The turn's audio goes through the REST routes' PipelineCall as
/v1/audio/transcriptions sends it (`modalities: ["transcript"]`: the planner's
transcript-only route), so both give the same text for the same audio. The
transcript streams as `conversation.item.input_audio_transcription.delta`
events whose concatenation is the `.completed` transcript; a pipeline error
becomes `.failed`. Turns are transcribed concurrently, each in its own task;
a transcribed turn's audio is let go (the item keeps its transcript). A streaming
recognizer (`PipelineConfig.live_transcription`) hears each turn while it is
spoken instead (live_transcription.py), through the same delta and completion helpers.

Beta's transcription sessions (`?intent=transcription`, `transcription_session.update`) are this
session under beta names (`beta_update`; session_updates.py renders transcription_session.*).

Also here: which pipelines can hold a conversation at all (`conversation_refusal`: one
that answers in text, or a full-duplex one), and the check of new transcription options
at session.update (`check_options`: tried on the recognizer, refused as the REST route's
400 refuses them, before any turn is spoken).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

import numpy as np
from aiohttp import web
from msgspec import UNSET

from omni_actors import logs
from omni_actors.api.calls import PipelineCall
from omni_actors.api.errors import ApiError, from_exception, refusal_text
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import Item
from omni_actors.api.realtime.session import SessionConfig
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.api.transcript_formats import known_language, language_code
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.errors import AdmissionError, RequestError, RequestRejected, StageUnavailable
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import TranscriptOutput

log = logs.get(__name__)

ROUTE = "/v1/realtime"
ANSWER_OUTPUT = "text"
"""What a conversation needs of a pipeline: it answers in text (spoken too where it also makes audio).
One without makes something of its input instead (speech of a text, a transcript, an image), except a
full-duplex model, which answers in speech (duplex.py)."""
TRANSCRIPTION_OPTIONS = ("language", "prompt")
"""`audio.input.transcription` fields passed on as the REST route passes its form fields."""
CHECK_AUDIO_S = 0.2
"""Silence a session's new transcription options are tried on (check_options)."""
CHECK_TIMEOUT_S = 10.0
"""Longest session.update waits for that try; past it the options are taken unchecked."""


class Host(Protocol):
    app: web.Application
    orch: Orchestrator
    cfg: SessionConfig

    async def send(self, event: ev.ServerEvent) -> None: ...


def converses(pipe: PipelineConfig) -> bool:
    """True for a pipeline that can answer a conversation (a realtime session's responses)."""
    return ANSWER_OUTPUT in pipe.output_types() or pipe.duplex


def transcribes_only(pipe: PipelineConfig) -> bool:
    """True for a pipeline that makes transcripts and no answer to a conversation."""
    return "transcript" in pipe.output_types() and not converses(pipe)


def only_transcribes(model: str) -> str:
    return (f"model {model!r} only transcribes: it cannot hold a conversation; open a "
            "transcription session (session.update with session.type 'transcription')")


def conversation_refusal(pipe: PipelineConfig, model: str) -> str | None:
    """Why a realtime session on `pipe` (served as `model`) cannot hold a conversation, else None."""
    if converses(pipe):
        return None
    if transcribes_only(pipe):
        return only_transcribes(model)
    speech = "; to have a text spoken, send it to POST /v1/audio/speech" if pipe.speech is not None else ""
    return (f"model {model!r} cannot hold a conversation: it makes {sorted(pipe.output_types())} from a "
            f"request's input, not an answer to it{speech}")


def no_transcripts(pipe: PipelineConfig) -> str | None:
    """Why `pipe` cannot serve a transcription session (GA session.type, beta intent or update), else None."""
    if "transcript" in pipe.output_types():
        return None
    return f"pipeline {pipe.name!r} makes no transcripts: it cannot serve a transcription session"


def beta_update(s: ce.TranscriptionSessionIn, pipe: PipelineConfig) -> ce.SessionIn:
    """Beta `transcription_session.update` as the GA transcription session's update (the same checks and
    engine path follow; its fields keep their beta names, so each refusal's param is `session.<field>`).
    What it asks and nothing would serve is refused, never taken and ignored."""
    if (refusal := no_transcripts(pipe)) is not None:  # (a duplex model's session too)
        raise ce.BadEvent(refusal, code="unsupported_session_type")
    if s.input_audio_noise_reduction not in (UNSET, None):
        raise ce.BadEvent("input audio noise reduction is not served: leave it null", code="unsupported_parameter",
                          param="session.input_audio_noise_reduction")
    if s.include not in (UNSET, None) and s.include:
        raise ce.BadEvent("transcription logprobs are not served: leave `include` empty",
                          code="unsupported_parameter", param="session.include")
    return ce.SessionIn(type="transcription", input_audio_format=s.input_audio_format,
                        input_audio_transcription=s.input_audio_transcription, turn_detection=s.turn_detection)


def transcription_params(cfg: SessionConfig) -> dict[str, Any]:
    """The stage params of a turn's transcription, as /v1/audio/transcriptions passes its form's: the
    `language` as its ISO-639-1 code (one not known was refused at session.update: check_options)."""
    opts = cfg.input_audio_transcription or {}
    params = {k: opts[k] for k in TRANSCRIPTION_OPTIONS if opts.get(k)}
    if "language" in params:
        params["language"] = known_language(params["language"]) or params["language"]
    return {"modalities": ["transcript"], **params}


TRANSCRIPTION_ERRORS = (AdmissionError, StageUnavailable, ApiError, RequestError, ValueError)
"""What ends one turn's transcription with `.failed` (the session goes on)."""


class Refusal(NamedTuple):
    """A recognizer's refusal of a session's transcription options."""

    option: str | None
    """"language" or "prompt"; None where both were set and the stage did not name one."""
    code: str
    """REST's code for the same refusal (api/errors.py `from_exception`)."""
    message: str


async def check_options(host: Host, cfg: SessionConfig) -> Refusal | None:
    """The pipeline's recognizer's refusal of `cfg`'s transcription `language` or `prompt`; None when it
    takes them.

    No pipeline declares what its recognizer takes (one language per deploy, none, or no prompt), and
    /v1/audio/transcriptions checks nothing up front: its stage refuses the request (a 400). So the
    options are tried as that route passes them, on CHECK_AUDIO_S of silence, and the stage's own
    refusal is the answer. A try that cannot tell (the stage busy, away, or slower than
    CHECK_TIMEOUT_S) takes the options: each turn's `.failed` would then say what is wrong."""
    params = transcription_params(cfg)
    asked = [k for k in TRANSCRIPTION_OPTIONS if k in params]
    if not asked or "transcript" not in host.orch.pipeline.output_types():
        return None
    if "language" in asked:  # not a language code: refused as the REST route refuses it, before the stage
        try:
            language_code(params["language"])
        except ApiError as err:
            return Refusal("language", err.code or "invalid_value", err.message)
    inputs = {"audio": np.zeros(int(CHECK_AUDIO_S * VAD_RATE), np.float32), "sample_rate": VAD_RATE}
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S), PipelineCall(
                host.app, ROUTE, inputs, params, {"transcript"}, orch=host.orch) as call:
            await call.started()  # (leaving aborts the rest of the request)
    except RequestRejected as err:
        api = from_exception(err)
        if api.param is not None and api.param not in asked:  # a refusal of something else, not the options
            return None
        return Refusal(api.param or (asked[0] if len(asked) == 1 else None), api.code or "rejected_by_stage",
                       refusal_text(err.detail))
    except (TimeoutError, *TRANSCRIPTION_ERRORS) as err:
        log.warning("realtime.transcription_options_unchecked", error=type(err).__name__)
    return None


async def stream_transcript(host: Host, call: PipelineCall, item_id: str, index: int) -> str:
    """Send the call's transcript as deltas as it comes; return the whole (stripped) transcript.

    The deltas add up to the returned transcript exactly: trailing whitespace waits until more
    text follows it."""
    pieces: list[str] = []
    sent = 0  # characters of the stripped transcript sent as deltas
    async for chunk in call:
        if not isinstance(chunk.output, TranscriptOutput):
            continue
        pieces.append(chunk.output.text)
        text = "".join(pieces).strip()
        if len(text) > sent:
            delta, sent = text[sent:], len(text)
            await host.send(ev.TranscriptionDelta(item_id=item_id, content_index=index, delta=delta))
    return "".join(pieces).strip()


async def send_failed(host: Host, item_id: str, index: int, err: Exception) -> None:
    e = from_exception(err)
    log.warning("realtime.transcription_failed", item_id=item_id, error=type(err).__name__)
    await host.send(ev.TranscriptionFailed(item_id=item_id, content_index=index, error={
        "type": e.type, "code": e.code or type(err).__name__, "message": e.message, "param": None}))


async def refuse_unheard(host: Host, item: Item) -> None:
    """A committed turn of a session that asked for `input_audio_transcription` on a pipeline that
    makes no transcripts: `.failed` saying so (the session and its responses go on), not silence."""
    name = host.orch.pipeline.name
    index = next(i for i, p in enumerate(item.content) if p.type == "input_audio")
    await host.send(ev.TranscriptionFailed(item_id=item.id, content_index=index, error={
        "type": "invalid_request_error", "code": "unsupported_parameter", "param": "input_audio_transcription",
        "message": f"pipeline {name!r} has no speech recognizer: it hears the user's audio but makes no "
                   "transcript of it; serve a pipeline with one (an assistant) to get transcripts"}))


async def send_completed(host: Host, item: Item, index: int, transcript: str) -> None:
    part = item.content[index]
    part.transcript = transcript
    part.audio = None  # transcribed: a long dictation session does not run into realtime_max_audio_s
    await host.send(ev.TranscriptionCompleted(item_id=item.id, content_index=index, transcript=transcript))


async def transcribe_turn(host: Host, item: Item) -> None:
    """Transcribe `item`'s audio, sending deltas as they come, then the whole (or `.failed`)."""
    index = next(i for i, p in enumerate(item.content) if p.type == "input_audio")
    inputs = {"audio": item.content[index].audio, "sample_rate": VAD_RATE}
    try:
        async with PipelineCall(host.app, ROUTE, inputs, transcription_params(host.cfg), {"transcript"},
                                orch=host.orch) as call:
            transcript = await stream_transcript(host, call, item.id, index)
    except TRANSCRIPTION_ERRORS as err:
        await send_failed(host, item.id, index, err)
        return
    await send_completed(host, item, index, transcript)
