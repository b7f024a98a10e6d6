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
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from omni_actors import logs
from omni_actors.api.calls import PipelineCall
from omni_actors.api.errors import ApiError, from_exception
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import Item
from omni_actors.api.realtime.session import SessionConfig
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.errors import AdmissionError, RequestError, StageUnavailable
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import TranscriptOutput

log = logs.get(__name__)

ROUTE = "/v1/realtime"
CONVERSATION_OUTPUTS = frozenset({"text", "audio"})
"""Output types a conversation (a model response) needs; a pipeline with neither only transcribes."""
TRANSCRIPTION_OPTIONS = ("language", "prompt")
"""`audio.input.transcription` fields passed on as the REST route passes its form fields."""


class Host(Protocol):
    app: web.Application
    orch: Orchestrator
    cfg: SessionConfig

    async def send(self, event: ev.ServerEvent) -> None: ...


def transcribes_only(pipe: PipelineConfig) -> bool:
    """True for a pipeline that makes transcripts and nothing a conversation could answer with."""
    outputs = pipe.output_types()
    return "transcript" in outputs and not outputs & CONVERSATION_OUTPUTS


def transcription_params(cfg: SessionConfig) -> dict[str, Any]:
    opts = cfg.input_audio_transcription or {}
    return {"modalities": ["transcript"], **{k: opts[k] for k in TRANSCRIPTION_OPTIONS if opts.get(k)}}


TRANSCRIPTION_ERRORS = (AdmissionError, StageUnavailable, ApiError, RequestError, ValueError)
"""What ends one turn's transcription with `.failed` (the session goes on)."""


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
