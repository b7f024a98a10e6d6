"""What a speech-generating pipeline offers the speech API: voices, sample rate, cloning, style prompts.

A pipeline that speaks declares one `SpeechSpec` next to its topology
(`PipelineConfig.speech`); `/v1/models/{id}` lists its voices and
`/v1/audio/speech` checks requests against it, so the API never names a family.
"""

from __future__ import annotations

import msgspec


class SpeechSpec(msgspec.Struct, frozen=True, kw_only=True):
    voices: tuple[str, ...]
    """Built-in voice names; the first is the default. OpenAI's names map onto these."""
    sample_rate: int = 24000
    cloning: bool = False
    """True when the first stage conditions on a reference clip (custom voices): inputs
    "reference_audio" (float32 mono at `sample_rate`), "reference_text" and "reference_id"
    (the custom voice's id: a stage may key what it derives from the clip on it)."""
    instructions: bool = False
    """True when the first stage takes a style prompt (input "instructions")."""
    native_speed: bool = False
    """True when the stages honour params["speed"] themselves; otherwise the API
    resamples the audio it sends (which also shifts its pitch)."""


def text_and_voice(inputs: dict, family: str, voices: tuple[str, ...]) -> tuple[str, str]:
    """A speech request's text (non-empty) and voice (the first of `voices` when unset); ValueError otherwise."""
    text = inputs.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{family}: inputs need a non-empty 'text'")
    return text, pick_voice({}, inputs, list(voices), voices[0])


OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
)  # fmt: skip
"""OpenAI's voice names: each maps onto a model's built-in voices (by position, wrapping), so SDK
code written for OpenAI speaks unchanged."""


def pick_voice(params: dict, inputs: dict, voices: list[str], default: str) -> str:
    """The built-in voice a request asks for, of `voices`: its "speaker" (a stage's own name for it)
    or "voice" (the API's: chat's `audio.voice`), matched without case, or an OpenAI name (by
    position in `voices`, as /v1/audio/speech maps them); `default` without either. ValueError
    naming `voice` (a 400 for the client) for any other name."""
    asked = params.get("speaker") or inputs.get("speaker") or params.get("voice") or inputs.get("voice")
    if not asked:
        return default
    name = str(asked)
    by_lower = {v.lower(): v for v in voices}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    if name.lower() in OPENAI_VOICES:
        return voices[OPENAI_VOICES.index(name.lower()) % len(voices)]
    raise ValueError(f"voice: unknown voice {name!r}; this model's voices are {list(voices)} "
                     f"(or one of OpenAI's: {', '.join(OPENAI_VOICES)})")  # fmt: skip
