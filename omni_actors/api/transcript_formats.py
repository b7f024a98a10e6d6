"""The timed response formats of /v1/audio/transcriptions (verbose_json, srt and vtt), and language names.

A stage that times its transcript sends segments (and words, when asked); for one that does
not, the whole transcript is one segment spanning the audio, so every format has an answer.
Times are kept within the audio: Whisper rounds a segment's end to its 20 ms timestamp tokens,
which can land past the last sample (a 2.99 s clip's segment ending at 3.00 s).

Languages, one form each way for every recognizer (Whisper, Qwen3-ASR, Voxtral Realtime, the realtime
session's transcription, which all pass through here):

    language_code(asked, param) -> "en"       a client's `language`: an ISO-639-1 code (any case, a region
                                              subtag dropped: "en-US") or Whisper's name; else a 400 naming
                                              `param`. Recognizers are given this code.
    language_name(reported) -> "english"      what a recognizer names (a code, or Qwen3-ASR's "English")
                                              as OpenAI's verbose_json reports it
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import msgspec

from omni_actors.api.errors import bad_request
from omni_actors.api.schemas import (
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptionWord,
)
from omni_actors.orchestrator.outputs import TranscriptOutput, TranscriptSegment

TIMED_FORMATS = ("srt", "vtt", "verbose_json")
LANGUAGE_NAMES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}
"""Whisper's languages, code -> name: OpenAI's verbose_json names the language so ("english")."""
LANGUAGE_ALIASES = {"fil": "tl", "filipino": "tl", "burmese": "my", "valencian": "ca", "flemish": "nl",
                    "haitian": "ht", "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
                    "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh", "jv": "jw"}
"""Other names (Whisper's aliases; Qwen3-ASR's "Filipino", which Whisper calls tagalog) and codes (ISO's
"jv" for Javanese, which Whisper writes "jw") -> code."""
_CODES = {name: code for code, name in LANGUAGE_NAMES.items()} | LANGUAGE_ALIASES
_TAG = re.compile(r"([a-z]{2,3})(?:[-_][a-z0-9]{2,8})+")
"""A BCP-47 style tag ("en-US", "pt_BR", "zh-Hans"): its language subtag is the code."""


def language_name(language: str | None) -> str:
    """`language` as OpenAI's verbose_json reports it: the lower-case English name ("english") of a code
    ("en", "EN") or a name in any case ("English"), as a client sends it or a recognizer reports it (Whisper
    a code, Qwen3-ASR a name); one not known is reported lower-cased, and none as ""."""
    key = (language or "").strip().lower()
    return LANGUAGE_NAMES.get(_CODES.get(key, key), key)


def known_language(language: str) -> str | None:
    """The code of a language a client names (module docstring), or None for one not known here."""
    key = language.strip().lower()
    tagged = _TAG.fullmatch(key)
    code = _CODES.get(key, tagged[1] if tagged else key)
    return code if code in LANGUAGE_NAMES else None


def language_code(language: str, param: str = "language") -> str:
    """A client's `language` as the ISO-639-1 code recognizers are given ("EN", "en-US", "English" -> "en");
    a 400 naming `param` for one no recognizer knows (as OpenAI's, whose `language` takes ISO-639-1)."""
    code = known_language(language)
    if code is None:
        raise bad_request(f"language {language[:40]!r} is not an ISO-639-1 code (such as 'en', 'de', 'zh') of a "
                          "language a recognizer knows", param, "invalid_value")
    return code



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
    reported = next((o.language for o in outputs if o.language), None) or language
    body = TranscriptionVerbose(
        task="transcribe", language=language_name(reported), duration=body_s, text=text,
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
