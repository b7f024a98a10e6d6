"""Typed final outputs: what the API reads from a final stage, converted once from the stage's payload.

    TextOutput        text delta, finish_reason, token counts; on the last: tool calls, if any; the
                      delta's tokens' log-probabilities where the request asked ("logprobs" param)
    AudioOutput       float32 mono samples, their rate, the transcript piece they speak; all channels
                      where the stage made several; a duplex frame's timing
    TranscriptOutput  a transcription delta of the user's audio; with timestamps asked, its segments/words
    ImageOutput       uint8 images [n, H, W, 3] (None on a progress-only chunk), progress, step previews
    VideoOutput       uint8 frames [T, H, W, 3] (None on a progress-only chunk), fps, its sound, progress

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
    shown: str = ""
    """With tools offered: the part of the answer, up to this delta, newly known not to be a call
    (the stage's tool parser reading as it streams), which a streamed answer shows at once."""
    tool_parts: tuple[ToolCallPart, ...] = ()
    """With tools offered: the pieces of calls the parser read in this delta, as it streams."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """With params["logprobs"] (a vLLM stage): the tokens whose text this delta (or one before it) carries,
    in order; their texts joined are the answer's text."""


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token: its text, log-probability and the likeliest alternatives asked for."""

    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """A piece of a call as the answer streams: a call's first carries its id and name, the next
    ones more of its arguments' JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


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
    channels: np.ndarray | None = None
    """float32 [C, S] when the stage made more than one channel (`audio` is then their mean)."""
    frame: DuplexFrame | None = None
    """On a duplex model's frame: how that frame went."""


@dataclass(frozen=True, slots=True)
class DuplexFrame:
    """One frame of a full-duplex session, as its engine timed it."""

    frame_ms: float
    start_lag_ms: float
    late: int
    input_to_output_ms: float | None
    dropped_input_s: float
    text: str = ""
    """The model's words in this frame (its inner monologue)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a diffusion request is: `step` of `total`, in `phase` ("denoise" | "decode")."""

    fraction: float
    step: int = 0
    total: int = 0
    phase: str = "denoise"


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
    progress: Progress | None = None
    preview: np.ndarray | None = None
    """uint8 [n, H, W, 3]: the images so far, at the steps a request asked to see."""


@dataclass(frozen=True, slots=True)
class VideoOutput:
    frames: np.ndarray | None
    fps: float | None = None
    progress: Progress | None = None
    audio: np.ndarray | None = None
    """float32 [C, S]: the clip's sound, where the model makes one (else None)."""
    sample_rate: int | None = None
    seed: int | None = None


FinalOutput = TextOutput | AudioOutput | TranscriptOutput | ImageOutput | VideoOutput


def _progress(data: dict[str, Any]) -> Progress | None:
    fraction = data.get("progress")
    if fraction is None:
        return None
    return Progress(float(fraction), int(data.get("step") or 0), int(data.get("total") or 0),
                    str(data.get("phase") or "denoise"))


def _array(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value)


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
            shown = data.get("shown")
            parts = tuple(ToolCallPart(int(p["index"]), p.get("id"), p.get("name"), p.get("arguments"))
                          for p in data.get("tool_parts") or ())
            return TextOutput(text, tokens, data.get("finish_reason"), None if prompt is None else int(prompt),
                              calls, content if isinstance(content, str) else None,
                              shown if isinstance(shown, str) else "", parts, _logprobs(data.get("logprobs")))
        case "audio":
            return _audio(data)
        case "transcript":
            return _transcript(data)
        case "image":
            return ImageOutput(_array(data.get("images")), _progress(data), _array(data.get("preview")))
        case "video":
            fps, seed, rate = data.get("fps"), data.get("seed"), data.get("sample_rate")
            return VideoOutput(_array(data.get("frames")), None if fps is None else float(fps), _progress(data),
                               _array(data.get("audio")), None if rate is None else int(rate),
                               None if seed is None else int(seed))
    return None


def _logprobs(entries: Any) -> tuple[TokenLogprob, ...]:
    """A text payload's "logprobs": [[token, logprob, [[alternative, logprob], ...]], ...] (vllm_ar.py)."""
    return tuple(TokenLogprob(str(token), float(lp), tuple(TopLogprob(str(t), float(v)) for t, v in top))
                 for token, lp, top in entries or ())


def _audio(data: dict[str, Any]) -> AudioOutput:
    audio = data.get("audio")
    channels = None
    if audio is None:
        samples = np.zeros(0, np.float32)
    else:
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim == 2 and samples.shape[0] > 1:  # [C, S]: several channels
            channels, samples = samples, samples.mean(axis=0)
        samples = samples.reshape(-1)
    transcript = data.get("transcript")
    frame = None
    if "frame_ms" in data:
        io = data.get("input_to_output_ms")
        frame = DuplexFrame(float(data["frame_ms"]), float(data.get("start_lag_ms", 0.0)), int(data.get("late", 0)),
                            None if io is None else float(io), float(data.get("dropped_input_s", 0.0)),
                            str(data.get("text") or ""))
    return AudioOutput(samples, int(data.get("sample_rate") or DEFAULT_SAMPLE_RATE),
                       transcript if isinstance(transcript, str) else None, channels, frame)


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
