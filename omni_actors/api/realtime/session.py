"""Realtime session configuration: `session.update` applied (beta and GA shapes), the session rendered.

Plain data and plain `def`s; the connection's session is their only writer. The
conversation's items and the input audio buffer: conversation.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from msgspec import UNSET

from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import FORMATS, WIRE_RATE
from omni_actors.api.realtime.vad import VadParams

VAD_TYPES = ("server_vad", "semantic_vad")
EAGERNESS_SILENCE_MS = {"high": 300, "medium": 500, "auto": 500, "low": 1000}
"""semantic_vad's closing silence by eagerness ("high": answer at a short pause)."""
MAX_VAD_DURATION_MS = 10_000
"""Longest prefix padding or closing silence a session may ask of the VAD."""
"""semantic_vad is accepted and served by the same silero detector."""
GA_FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
BETA_TO_GA_FORMAT = {v: k for k, v in GA_FORMATS.items()}
DEFAULT_VOICE = "alloy"
SESSION_TYPES = ("realtime", "transcription")
SPEED_RANGE = (0.25, 1.5)
"""OpenAI's bounds for a realtime session's `audio.output.speed`."""


@dataclass(frozen=True)
class TurnDetection:
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str = "auto"
    """semantic_vad's. Its turns are the same VAD's (no model of what was said): the eagerness sets the
    closing silence (EAGERNESS_SILENCE_MS)."""

    def vad_params(self) -> VadParams:
        return VadParams(self.threshold, self.prefix_padding_ms, self.silence_duration_ms)


@dataclass(frozen=True)
class SessionConfig:
    model: str
    type: str = "realtime"
    """GA session type: "realtime" (a conversation) or "transcription" (turns transcribed, no response)."""
    modalities: tuple[str, ...] = ("text", "audio")
    instructions: str = ""
    voice: str = DEFAULT_VOICE
    input_audio_format: str = "pcm16"
    output_audio_format: str = "pcm16"
    speed: float = 1.0
    """GA `audio.output.speed` (0.25-1.5): the answer's audio stretched in time, pitch kept."""
    input_audio_transcription: dict[str, Any] | None = None
    turn_detection: TurnDetection | None = TurnDetection()
    temperature: float = 0.8
    max_output_tokens: int | None = None
    """None means "inf"."""
    tools: tuple[ce.FunctionTool, ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    """"required" or {"type": "function", "name"} force a call where the pipeline can (api/tools.py),
    checked against `tools` at each session.update (function_calls.py `forced_call`)."""


def parse_format(value: Any, param: str) -> str:
    if isinstance(value, ce.FormatIn):
        fmt = GA_FORMATS.get(value.type)
        if fmt is None:
            raise ce.BadEvent(f"unsupported audio format {value.type!r}; expected one of {sorted(GA_FORMATS)}",
                              param=f"{param}.type")
        if fmt == "pcm16" and value.rate not in (None, WIRE_RATE):
            raise ce.BadEvent(f"audio/pcm rate must be {WIRE_RATE}", param=f"{param}.rate")
        return fmt
    fmt = GA_FORMATS.get(value, value)
    if fmt not in FORMATS:
        raise ce.BadEvent(f"unsupported audio format {value!r}; expected one of {list(FORMATS)}", param=param)
    return fmt


def _turn_detection(td: ce.TurnDetectionIn | None, old: TurnDetection | None, param: str) -> TurnDetection | None:
    if td is None:
        return None
    if td.type not in VAD_TYPES:
        raise ce.BadEvent(f"unsupported turn_detection type {td.type!r}; expected one of {list(VAD_TYPES)}",
                          param=f"{param}.type")
    base = old if old is not None and old.type == td.type else TurnDetection(type=td.type)
    out = replace(base, **{k: getattr(td, k) for k in (
        "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response", "eagerness")
        if getattr(td, k) is not None})
    if out.type == "semantic_vad" and td.silence_duration_ms is None:
        out = replace(out, silence_duration_ms=EAGERNESS_SILENCE_MS[out.eagerness])
    if not 0.0 <= out.threshold <= 1.0:  # (a range error is coded as REST codes it: decimal_above_max_value)
        raise ce.BadEvent("threshold must be between 0 and 1", param=f"{param}.threshold",
                          code=ce.range_code("decimal", out.threshold < 0))
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if not 0 <= getattr(out, key) <= MAX_VAD_DURATION_MS:
            raise ce.BadEvent(f"{key} must be between 0 and {MAX_VAD_DURATION_MS}", param=f"{param}.{key}",
                              code=ce.range_code("integer", getattr(out, key) < 0))
    return out


def _tokens(value: Any) -> int | None:
    return None if value == "inf" else int(value)


def apply_update(cfg: SessionConfig, s: ce.SessionIn) -> tuple[SessionConfig, ev.Dialect | None]:
    """The config after a session.update, and the dialect it signals (GA if `type: realtime`)."""
    dialect: ev.Dialect | None = None
    new: dict[str, Any] = {}
    if s.type is not UNSET:
        if s.type not in SESSION_TYPES:
            raise ce.BadEvent(f"unsupported session type {s.type!r}; expected one of {list(SESSION_TYPES)}",
                              param="session.type")
        dialect = "ga"
        new["type"] = s.type
    for key in ("instructions", "voice", "temperature", "tool_choice"):
        if getattr(s, key) is not UNSET:
            new[key] = getattr(s, key)
    for key in ("modalities", "output_modalities"):
        if getattr(s, key) is not UNSET:
            if not getattr(s, key):
                raise ce.BadEvent(f"{key} must name at least one of 'text', 'audio'", param=f"session.{key}")
            new["modalities"] = tuple(dict.fromkeys(getattr(s, key)))
    if s.tools is not UNSET:
        new["tools"] = tuple(s.tools)
    for key in ("max_response_output_tokens", "max_output_tokens"):
        if getattr(s, key) is not UNSET:
            new["max_output_tokens"] = _tokens(getattr(s, key))
    if s.input_audio_format is not UNSET:
        new["input_audio_format"] = parse_format(s.input_audio_format, "session.input_audio_format")
    if s.output_audio_format is not UNSET:
        new["output_audio_format"] = parse_format(s.output_audio_format, "session.output_audio_format")
    if s.input_audio_transcription is not UNSET:
        new["input_audio_transcription"] = _transcription(s.input_audio_transcription)
    if s.turn_detection is not UNSET:
        new["turn_detection"] = _turn_detection(s.turn_detection, cfg.turn_detection, "session.turn_detection")
    if s.audio is not UNSET:
        a_in, a_out = s.audio.input, s.audio.output
        if a_in is not UNSET:
            if a_in.format is not UNSET:
                new["input_audio_format"] = parse_format(a_in.format, "session.audio.input.format")
            if a_in.transcription is not UNSET:
                new["input_audio_transcription"] = _transcription(a_in.transcription)
            if a_in.turn_detection is not UNSET:
                new["turn_detection"] = _turn_detection(
                    a_in.turn_detection, cfg.turn_detection, "session.audio.input.turn_detection")
        if a_out is not UNSET:
            if a_out.format is not UNSET:
                new["output_audio_format"] = parse_format(a_out.format, "session.audio.output.format")
            if a_out.voice is not UNSET:
                new["voice"] = a_out.voice
            if a_out.speed is not UNSET:
                new["speed"] = _speed(a_out.speed, "session.audio.output.speed")
    if s.model is not UNSET:
        new["model"] = s.model
    return replace(cfg, **new), dialect


def _transcription(value: ce.TranscriptionIn | None) -> dict[str, Any] | None:
    """The options as the session holds and renders them: the fields the client set."""
    return None if value is None else msgspec.to_builtins(value)


def _speed(value: float, param: str) -> float:
    if not (math.isfinite(value) and SPEED_RANGE[0] <= value <= SPEED_RANGE[1]):
        code = ce.range_code("decimal", value < SPEED_RANGE[0]) if math.isfinite(value) else "invalid_value"
        raise ce.BadEvent(f"speed must be from {SPEED_RANGE[0]} to {SPEED_RANGE[1]}, got {value!r}", param=param,
                          code=code)
    return float(value)


def _render_td(td: TurnDetection | None) -> dict[str, Any] | None:
    """As OpenAI echoes it: semantic_vad with its eagerness and no VAD numbers, server_vad without eagerness."""
    if td is None:
        return None
    shown = td.__dict__.copy()
    keep = ("type", "eagerness", "create_response", "interrupt_response") if td.type == "semantic_vad" else None
    return {k: v for k, v in shown.items() if k in keep} if keep else {k: v for k, v in shown.items() if k != "eagerness"}


def render_format(fmt: str) -> dict[str, Any]:
    """A format as GA writes it: `{"type": "audio/pcm", "rate": 24000}`."""
    return {"type": BETA_TO_GA_FORMAT[fmt], **({"rate": WIRE_RATE} if fmt == "pcm16" else {})}


def render_transcription_session(cfg: SessionConfig, session_id: str) -> dict[str, Any]:
    """A beta transcription session (`?intent=transcription`), as OpenAI's beta API echoes it
    (the SDK's beta TranscriptionSession; no client_secret over the WebSocket)."""
    return {
        "id": session_id, "object": "realtime.transcription_session", "modalities": ["text"],
        "input_audio_format": cfg.input_audio_format, "input_audio_transcription": cfg.input_audio_transcription,
        "turn_detection": _render_td(cfg.turn_detection), "input_audio_noise_reduction": None, "include": [],
    }


def render_session(cfg: SessionConfig, session_id: str, dialect: ev.Dialect) -> dict[str, Any]:
    tokens = "inf" if cfg.max_output_tokens is None else cfg.max_output_tokens
    if dialect == "ga":
        fmt = render_format
        if cfg.type == "transcription":  # (the SDK's RealtimeTranscriptionSessionCreateResponse)
            return {
                "type": "transcription", "object": "realtime.transcription_session", "id": session_id,
                "audio": {"input": {"format": fmt(cfg.input_audio_format),
                                    "transcription": cfg.input_audio_transcription,
                                    "turn_detection": _render_td(cfg.turn_detection), "noise_reduction": None}},
                "include": [],
            }
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": cfg.model,
            "output_modalities": list(cfg.modalities), "instructions": cfg.instructions,
            "audio": {
                "input": {"format": fmt(cfg.input_audio_format), "transcription": cfg.input_audio_transcription,
                          "turn_detection": _render_td(cfg.turn_detection), "noise_reduction": None},
                "output": {"format": fmt(cfg.output_audio_format), "voice": cfg.voice, "speed": cfg.speed},
            },
            "tools": msgspec.to_builtins(cfg.tools), "tool_choice": cfg.tool_choice, "max_output_tokens": tokens,
        }
    return {
        "id": session_id, "object": "realtime.session", "model": cfg.model,
        "modalities": list(cfg.modalities), "instructions": cfg.instructions, "voice": cfg.voice,
        "input_audio_format": cfg.input_audio_format, "output_audio_format": cfg.output_audio_format,
        "input_audio_transcription": cfg.input_audio_transcription,
        "turn_detection": _render_td(cfg.turn_detection), "tools": msgspec.to_builtins(cfg.tools),
        "tool_choice": cfg.tool_choice, "temperature": cfg.temperature,
        "max_response_output_tokens": tokens,
    }
