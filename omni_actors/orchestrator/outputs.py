"""Typed final outputs: what the API reads from a final stage, converted once from the stage's payload.

    TextOutput        text delta, finish_reason, token counts; on the last: tool calls, if any
    AudioOutput       float32 mono samples, their rate, the transcript piece they speak
    TranscriptOutput  a transcription delta of the user's audio; with timestamps asked, its segments/words
    ImageOutput       uint8 images [n, H, W, 3] (None on a progress-only chunk), progress
    VideoOutput       uint8 frames [T, H, W, 3] (None on a progress-only chunk), fps, progress

Payloads between stages stay model-specific dicts; only a final stage's
output, by its `final_output_type`, becomes one of these (`to_final`), in the
orchestrator, so the routes never read string keys of a payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_actors.audio import DEFAULT_SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class TextOutput:
    text: str
    tokens: int
    """Tokens this delta stands for (the stage's count, else one per non-empty delta)."""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    tool_calls: tuple[ToolCallOutput, ...] = ()
    """On the last delta of an answer that called tools: the calls, read by the stage's tool parser."""
    content: str | None = None
    """With `tool_calls`: the answer's text outside the calls (None: none)."""


@dataclass(frozen=True, slots=True)
class ToolCallOutput:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI's `function.arguments`."""


@dataclass(frozen=True, slots=True)
class AudioOutput:
    audio: np.ndarray
    """float32 mono; may be empty (a chunk that only ends the stream or carries a transcript)."""
    sample_rate: int
    transcript: str | None = None


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    start: float
    end: float
    text: str
    seek: int = 0
    tokens: tuple[int, ...] = ()
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    """The statistics after `text` are Whisper's; a stage that does not make one leaves it 0."""


@dataclass(frozen=True, slots=True)
class TranscriptWord:
    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class TranscriptOutput:
    text: str
    segments: tuple[TranscriptSegment, ...] = ()
    """Timed pieces of the transcript (stages that time it, when params["timestamps"] asks)."""
    words: tuple[TranscriptWord, ...] = ()
    language: str | None = None


@dataclass(frozen=True, slots=True)
class ImageOutput:
    images: np.ndarray | None
    progress: float | None = None


@dataclass(frozen=True, slots=True)
class VideoOutput:
    frames: np.ndarray | None
    fps: float | None = None
    progress: float | None = None


FinalOutput = TextOutput | AudioOutput | TranscriptOutput | ImageOutput | VideoOutput


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def to_final(output_type: str | None, data: dict[str, Any]) -> FinalOutput | None:
    """The typed output of a final stage's payload (None: a type no route reads)."""
    match output_type:
        case "text":
            text = str(data.get("text") or "")
            if "token_ids" in data:
                tokens = len(data["token_ids"])
            else:
                tokens = int(data.get("num_tokens", 1 if text else 0))
            prompt = data.get("prompt_tokens")
            calls = tuple(ToolCallOutput(str(c["id"]), str(c["name"]), str(c["arguments"]))
                          for c in data.get("tool_calls") or ())
            content = data.get("content")
            return TextOutput(text, tokens, data.get("finish_reason"), None if prompt is None else int(prompt),
                              calls, content if isinstance(content, str) else None)
        case "audio":
            audio = data.get("audio")
            samples = (np.zeros(0, np.float32) if audio is None
                       else np.asarray(audio, dtype=np.float32).reshape(-1))
            transcript = data.get("transcript")
            return AudioOutput(samples, int(data.get("sample_rate") or DEFAULT_SAMPLE_RATE),
                               transcript if isinstance(transcript, str) else None)
        case "transcript":
            return _transcript(data)
        case "image":
            images = data.get("images")
            return ImageOutput(None if images is None else np.asarray(images), _float(data.get("progress")))
        case "video":
            frames = data.get("frames")
            return VideoOutput(None if frames is None else np.asarray(frames), _float(data.get("fps")),
                               _float(data.get("progress")))
    return None


def _transcript(data: dict[str, Any]) -> TranscriptOutput:
    segments = tuple(
        TranscriptSegment(float(s["start"]), float(s["end"]), str(s["text"]), int(s.get("seek", 0)),
                          tuple(int(t) for t in s.get("tokens", ())),
                          *(float(s.get(k, 0.0)) for k in _SEGMENT_STATS))
        for s in data.get("segments") or ())
    words = tuple(TranscriptWord(str(w["word"]), float(w["start"]), float(w["end"])) for w in data.get("words") or ())
    language = data.get("language")
    return TranscriptOutput(str(data.get("text") or ""), segments, words,
                            language if isinstance(language, str) else None)


_SEGMENT_STATS = ("temperature", "avg_logprob", "compression_ratio", "no_speech_prob")
