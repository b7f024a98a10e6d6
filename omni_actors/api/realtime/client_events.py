"""Realtime client events: the msgspec structs a client sends, beta and GA shapes, decoded in one pass.

    decode_client(raw) -> ClientEvent          (raises BadEvent naming event_id and param)

Client events are one tagged union; `session.update` accepts the beta shape (flat
`input_audio_format`, `turn_detection`...) and the GA one (`type: "realtime"` or
`"transcription"`, `audio.input.*`, `audio.output.*`, `output_modalities`), lenient
about fields we do not use; beta's `transcription_session.update` sets a transcription session.
A field that fails to decode is coded as the REST routes code it (api/errors.py `validation_detail`). Server events: events.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omni_actors.api.allowed_values import expected_text
from omni_actors.api.errors import validation_detail
from omni_actors.api.schemas import (
    MAX_TOOLS,
    FunctionName,
    Instructions,
    Metadata,
    Name,
    Temperature,
    TokenCount,
)

MaxTokens = TokenCount | Literal["inf"]
MAX_ID_CHARS = 64
"""Longest item or call id a client sends (OpenAI's own ids are far shorter; ours: conversation.new_id)."""
ItemId = Annotated[str, Meta(max_length=MAX_ID_CHARS)]


class TurnDetectionIn(msgspec.Struct, kw_only=True):
    type: str = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    """semantic_vad's: how soon a pause ends the user's turn."""


class FormatIn(msgspec.Struct, kw_only=True):
    type: str
    rate: int | None = None


class TranscriptionIn(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GA `audio.input.transcription` / beta `input_audio_transcription`: the fields of
    /v1/audio/transcriptions' form with these names (a wrong type is refused here; what the
    model's recognizer refuses, at session.update: transcription.py `check_options`)."""

    model: Name | None = None
    language: Name | None = None
    prompt: Instructions | None = None


class AudioInputIn(msgspec.Struct, kw_only=True):
    format: FormatIn | str | UnsetType = UNSET
    turn_detection: TurnDetectionIn | UnsetType | None = UNSET
    transcription: TranscriptionIn | UnsetType | None = UNSET


class AudioOutputIn(msgspec.Struct, kw_only=True):
    format: FormatIn | str | UnsetType = UNSET
    voice: Name | UnsetType = UNSET
    speed: float | UnsetType = UNSET


class AudioIn(msgspec.Struct, kw_only=True):
    input: AudioInputIn | UnsetType = UNSET
    output: AudioOutputIn | UnsetType = UNSET


class FunctionTool(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A session's or response's function tool, as Realtime writes it (flat: no `function` wrapper)."""

    type: Literal["function"] = "function"
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None


Tools = Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)]
ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]


class SessionIn(msgspec.Struct, kw_only=True):
    type: str | UnsetType = UNSET  # GA: "realtime" | "transcription"
    model: Name | UnsetType = UNSET
    instructions: Instructions | UnsetType = UNSET
    modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    voice: Name | UnsetType = UNSET
    input_audio_format: str | UnsetType = UNSET
    output_audio_format: str | UnsetType = UNSET
    input_audio_transcription: TranscriptionIn | UnsetType | None = UNSET
    turn_detection: TurnDetectionIn | UnsetType | None = UNSET
    audio: AudioIn | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    max_response_output_tokens: MaxTokens | UnsetType = UNSET
    max_output_tokens: MaxTokens | UnsetType = UNSET
    tools: Tools | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET


class NoiseReductionIn(msgspec.Struct, kw_only=True):
    type: Literal["near_field", "far_field"]


INCLUDABLE = Literal["item.input_audio_transcription.logprobs"]


class TranscriptionSessionIn(msgspec.Struct, kw_only=True):
    """Beta `transcription_session.update`'s session (OpenAI's beta transcription API): the GA
    transcription session's settings under their beta names (session_updates.py `_transcription_session_update`)."""

    input_audio_format: str | UnsetType = UNSET
    input_audio_transcription: TranscriptionIn | UnsetType | None = UNSET
    turn_detection: TurnDetectionIn | UnsetType | None = UNSET
    input_audio_noise_reduction: NoiseReductionIn | UnsetType | None = UNSET
    include: Annotated[list[INCLUDABLE], Meta(max_length=1)] | UnsetType | None = UNSET


class ContentIn(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ItemIn(msgspec.Struct, kw_only=True):
    id: ItemId | None = None
    type: Literal["message", "function_call", "function_call_output", "item_reference"] = "message"
    """("item_reference": in response.create's `input` only, an item of the conversation by its `id`.)"""
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentIn] = []
    call_id: ItemId | None = None
    name: FunctionName | None = None
    arguments: str | None = None
    output: str | None = None


class ResponseAudioOutputIn(msgspec.Struct, kw_only=True):
    format: FormatIn | str | None = None
    voice: Name | None = None


class ResponseAudioIn(msgspec.Struct, kw_only=True):
    """GA response.create `audio`: the response's own output format and voice."""

    output: ResponseAudioOutputIn | None = None


class ResponseIn(msgspec.Struct, kw_only=True):
    modalities: list[Literal["text", "audio"]] | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    instructions: Instructions | None = None
    voice: Name | None = None
    output_audio_format: str | None = None
    audio: ResponseAudioIn | None = None  # GA: audio.output.{format, voice}
    temperature: Temperature | None = None
    max_response_output_tokens: MaxTokens | None = None
    max_output_tokens: MaxTokens | None = None
    conversation: str | None = None  # "auto" | "none"
    metadata: Metadata | None = None
    input: list[ItemIn] | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None


class ClientEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionIn


class TranscriptionSessionUpdate(ClientEvent, tag="transcription_session.update"):
    session: TranscriptionSessionIn


class BufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str


class BufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class BufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class ItemCreate(ClientEvent, tag="conversation.item.create"):
    item: ItemIn
    previous_item_id: ItemId | None = None


class ItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: ItemId


class ItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: ItemId
    audio_end_ms: int
    content_index: int = 0


class ItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: ItemId


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseIn | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class OutputAudioClear(ClientEvent, tag="output_audio_buffer.clear"):
    """GA (WebRTC/SIP) event; over a WebSocket the client owns playback, so this only acknowledges."""


ClientEventT = (
    SessionUpdate | TranscriptionSessionUpdate | BufferAppend | BufferCommit | BufferClear | ItemCreate | ItemRetrieve
    | ItemTruncate | ItemDelete | ResponseCreate | ResponseCancel | OutputAudioClear
)
CLIENT_TYPES = frozenset(c.__struct_config__.tag for c in ClientEventT.__args__)  # type: ignore[attr-defined]


class _Envelope(msgspec.Struct):
    type: Any = None
    event_id: Any = None


class BadEvent(Exception):
    """A client event we cannot act on; becomes an `error` event, never a closed session."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None,
                 event_id: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.event_id, self.type = message, code, param, event_id, type


def range_code(kind: str, below: bool) -> str:
    """REST's code for a number out of its range: `kind` "integer" or "decimal"."""
    return f"{kind}_{'below_min' if below else 'above_max'}_value"


_decoder = msgspec.json.Decoder(ClientEventT)
_envelope = msgspec.json.Decoder(_Envelope)


def event_id_of(raw: str | bytes) -> str | None:
    """The `event_id` of an event we will not decode in full (best effort)."""
    try:
        env = _envelope.decode(raw)
    except msgspec.DecodeError:
        return None
    return env.event_id if isinstance(env.event_id, str) else None


def decode_client(raw: str | bytes) -> ClientEventT:
    try:
        return _decoder.decode(raw)
    except RecursionError:  # (thousands of nested levels exhaust the decoder's stack)
        raise BadEvent("event is nested too deeply", code="invalid_json") from None
    except msgspec.DecodeError as err:
        try:
            env = _envelope.decode(raw)
        except msgspec.DecodeError:
            raise BadEvent(f"event is not a JSON object: {err}", code="invalid_json") from None
        event_id = env.event_id if isinstance(env.event_id, str) else None
        if not isinstance(env.type, str):
            raise BadEvent("event has no string `type`", code="invalid_event", param="type",
                           event_id=event_id) from None
        if env.type not in CLIENT_TYPES:
            raise BadEvent(f"unknown event type {env.type!r}", code="invalid_event", param="type",
                           event_id=event_id) from None
        msg, param, code = (validation_detail(err) if isinstance(err, msgspec.ValidationError)
                            else (str(err), None, "invalid_value"))
        listed = expected_text(ClientEventT, param) if code == "invalid_value" else ""
        # coded as the REST routes code the same mistake (api/errors.py `validation_detail`): a wrong type is
        # invalid_type, a value out of its range decimal_above_max_value, integer_below_min_value, ...
        raise BadEvent(f"{env.type}: {msg}{listed}", code=code, param=param, event_id=event_id) from None


