"""The timed response formats of /v1/audio/transcriptions: verbose_json, srt and vtt.

A stage that times its transcript sends segments (and words, when asked); for one that does
not, the whole transcript is one segment spanning the audio, so every format has an answer.
Times are kept within the audio: Whisper rounds a segment's end to its 20 ms timestamp tokens,
which can land past the last sample (a 2.99 s clip's segment ending at 3.00 s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import msgspec

from omni_actors.api.schemas import (
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptionWord,
)
from omni_actors.orchestrator.outputs import TranscriptOutput, TranscriptSegment

TIMED_FORMATS = ("srt", "vtt", "verbose_json")
LANGUAGE_NAMES = {
    "ar": "arabic", "cs": "czech", "da": "danish", "de": "german", "el": "greek", "en": "english", "es": "spanish",
    "fa": "persian", "fi": "finnish", "fr": "french", "he": "hebrew", "hi": "hindi", "hu": "hungarian",
    "id": "indonesian", "it": "italian", "ja": "japanese", "ko": "korean", "nl": "dutch", "no": "norwegian",
    "pl": "polish", "pt": "portuguese", "ro": "romanian", "ru": "russian", "sv": "swedish", "th": "thai",
    "tr": "turkish", "uk": "ukrainian", "vi": "vietnamese", "zh": "chinese",
}
"""verbose_json's `language` is a name, as OpenAI writes it ("english"); a code not here stays a code."""
CONTENT_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt", "verbose_json": "application/json"}


def timed_segments(text: str, outputs: Sequence[TranscriptOutput], seconds: float) -> list[TranscriptSegment]:
    """The stage's segments, else (a stage that does not time its text) one over the whole audio."""
    duration = round(seconds, 3)
    segments = [dataclasses.replace(s, start=_within(s.start, duration), end=_within(s.end, duration))
                for out in outputs for s in out.segments if s.text.strip()]
    if segments or not text:
        return segments
    return [TranscriptSegment(0.0, duration, text)]


def _within(t: float, duration: float) -> float:
    return min(max(t, 0.0), duration)


def render(fmt: str, text: str, outputs: Sequence[TranscriptOutput], seconds: float, language: str | None,
           words: bool, segments: bool = True) -> bytes:
    """The body of a timed response format `fmt` (one of TIMED_FORMATS). verbose_json has `words` when
    `words`, and `segments` unless only words were asked for (`segments` False), as OpenAI leaves them out."""
    timed = timed_segments(text, outputs, seconds)
    if fmt == "srt":
        return _cues(timed, ",", numbered=True).encode()
    if fmt == "vtt":
        return ("WEBVTT\n\n" + _cues(timed, ".", numbered=False)).encode()
    body_s = round(seconds, 3)
    code = next((o.language for o in outputs if o.language), None) or language or ""
    body = TranscriptionVerbose(
        task="transcribe", language=LANGUAGE_NAMES.get(code.lower(), code), duration=body_s, text=text,
        segments=[TranscriptionSegment(i, s.seek, s.start, s.end, s.text, list(s.tokens), s.temperature,
                                       s.avg_logprob, s.compression_ratio, s.no_speech_prob)
                  for i, s in enumerate(timed)],
        usage=TranscriptionUsage("duration", math.ceil(seconds)),
        words=[TranscriptionWord(w.word, _within(w.start, body_s), _within(w.end, body_s))
               for o in outputs for w in o.words] if words else None)
    if segments:
        return msgspec.json.encode(body)
    fields = msgspec.to_builtins(body)  # (TranscriptionVerbose, in schemas.py, requires `segments`)
    del fields["segments"]
    return msgspec.json.encode(fields)


def _cues(segments: Sequence[TranscriptSegment], decimal: str, *, numbered: bool) -> str:
    cues = []
    for i, s in enumerate(segments, 1):
        head = f"{i}\n" if numbered else ""
        cues.append(f"{head}{_clock(s.start, decimal)} --> {_clock(s.end, decimal)}\n{s.text.strip()}\n")
    return "\n".join(cues)


def _clock(seconds: float, decimal: str) -> str:
    """HH:MM:SS,mmm (SubRip) or HH:MM:SS.mmm (WebVTT)."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"
