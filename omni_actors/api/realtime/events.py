"""Realtime server events: the msgspec structs we send, under their beta or GA names.

    encode_server(event, dialect, event_id) -> bytes   (the event's name in that dialect)

Server events carry their beta name; GA renames a few (GA_NAMES). Client events:
client_events.py.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

Dialect = Literal["beta", "ga"]

GA_NAMES = {
    "conversation.item.created": "conversation.item.added",
    "response.text.delta": "response.output_text.delta",
    "response.text.done": "response.output_text.done",
    "response.audio.delta": "response.output_audio.delta",
    "response.audio.done": "response.output_audio.done",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
}
"""Beta name -> GA name where they differ (GA adds conversation.item.done; see handler.py)."""


class ServerEvent(msgspec.Struct, kw_only=True):
    NAME: ClassVar[str] = ""
    type: str = ""
    event_id: str = ""


class Error(ServerEvent, kw_only=True):
    NAME = "error"
    error: dict[str, Any]


class _SessionEvent(ServerEvent, kw_only=True):
    session: dict[str, Any]


class SessionCreated(_SessionEvent, kw_only=True):
    NAME = "session.created"


class SessionUpdated(_SessionEvent, kw_only=True):
    NAME = "session.updated"


class TranscriptionSessionCreated(_SessionEvent, kw_only=True):
    NAME = "transcription_session.created"  # beta transcription sessions (`?intent=transcription`)


class TranscriptionSessionUpdated(_SessionEvent, kw_only=True):
    NAME = "transcription_session.updated"


class ConversationCreated(ServerEvent, kw_only=True):
    NAME = "conversation.created"
    conversation: dict[str, Any]


class BufferCommitted(ServerEvent, kw_only=True):
    NAME = "input_audio_buffer.committed"
    previous_item_id: str | None
    item_id: str


class BufferCleared(ServerEvent, kw_only=True):
    NAME = "input_audio_buffer.cleared"


class SpeechStarted(ServerEvent, kw_only=True):
    NAME = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, kw_only=True):
    NAME = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class ItemCreated(ServerEvent, kw_only=True):
    NAME = "conversation.item.created"
    previous_item_id: str | None
    item: dict[str, Any]


class ItemDone(ItemCreated, kw_only=True):
    NAME = "conversation.item.done"  # GA only


class ItemRetrieved(ServerEvent, kw_only=True):
    NAME = "conversation.item.retrieved"
    item: dict[str, Any]


class ItemTruncated(ServerEvent, kw_only=True):
    NAME = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ItemDeleted(ServerEvent, kw_only=True):
    NAME = "conversation.item.deleted"
    item_id: str


class TranscriptionDelta(ServerEvent, kw_only=True):
    NAME = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int
    delta: str


class TranscriptionCompleted(ServerEvent, kw_only=True):
    NAME = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int
    transcript: str


class TranscriptionFailed(ServerEvent, kw_only=True):
    NAME = "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int
    error: dict[str, Any]


class ResponseCreated(ServerEvent, kw_only=True):
    NAME = "response.created"
    response: dict[str, Any]


class ResponseDone(ResponseCreated, kw_only=True):
    NAME = "response.done"


class OutputItemAdded(ServerEvent, kw_only=True):
    NAME = "response.output_item.added"
    response_id: str
    output_index: int
    item: dict[str, Any]


class OutputItemDone(OutputItemAdded, kw_only=True):
    NAME = "response.output_item.done"


class _PartEvent(ServerEvent, kw_only=True):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartAdded(_PartEvent, kw_only=True):
    NAME = "response.content_part.added"
    part: dict[str, Any]


class ContentPartDone(ContentPartAdded, kw_only=True):
    NAME = "response.content_part.done"


class TextDelta(_PartEvent, kw_only=True):
    NAME = "response.text.delta"
    delta: str


class TextDone(_PartEvent, kw_only=True):
    NAME = "response.text.done"
    text: str


class AudioDelta(_PartEvent, kw_only=True):
    NAME = "response.audio.delta"
    delta: str


class AudioDone(_PartEvent, kw_only=True):
    NAME = "response.audio.done"


class TranscriptDelta(_PartEvent, kw_only=True):
    NAME = "response.audio_transcript.delta"
    delta: str


class TranscriptDone(_PartEvent, kw_only=True):
    NAME = "response.audio_transcript.done"
    transcript: str


class FunctionCallArgumentsDelta(ServerEvent, kw_only=True):
    NAME = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class FunctionCallArgumentsDone(ServerEvent, kw_only=True):
    NAME = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class RateLimitsUpdated(ServerEvent, kw_only=True):
    NAME = "rate_limits.updated"
    rate_limits: list[dict[str, Any]]


class OutputAudioCleared(ServerEvent, kw_only=True):
    NAME = "output_audio_buffer.cleared"


_encoder = msgspec.json.Encoder()


def server_name(event: ServerEvent, dialect: Dialect) -> str:
    return GA_NAMES.get(event.NAME, event.NAME) if dialect == "ga" else event.NAME


def encode_server(event: ServerEvent, dialect: Dialect, event_id: str) -> bytes:
    event.type = server_name(event, dialect)
    event.event_id = event_id
    return _encoder.encode(event)
