"""A speech request's pipeline inputs and params: voice resolution, style prompt, speed, seed.

Shared by POST /v1/audio/speech and the text-in WebSocket. Checked against the
pipeline's `SpeechSpec` (config/speech.py); a pipeline without one (an omni model
that also speaks) gets the fields passed through as they came.

    voice  a built-in name, in any case     -> inputs["voice"] (the name as the pipeline lists it)
           one of OpenAI's names            -> the built-in voice at its index (mod the count)
           "voice_..." or {"id": "voice_..."} (cloning pipelines) -> the default voice (if any) plus
                                               inputs "reference_audio" / "reference_text" /
                                               "reference_id" (the voice's id); a stored sample that is
                                               silent (voices.silence) is a 400 naming `voice`
           anything else                    -> 400 listing the choices
           A pipeline with no built-in voices (it only clones) needs a custom voice: anything else,
           or no voice, is a 400 naming `voice`.
    listed_voice(pipe, name, param) is the built-in check alone, for chat's `audio.voice` (param
    "audio.voice"): the same 400 where the pipeline lists voices, nothing where it lists none.
    instructions  pipelines with `instructions` only; else 400 naming the field (empty or whitespace-only
                  instructions are none, on every pipeline)
    speed  params["speed"] where the stages honour it (`native_speed`); else the API stretches the
           audio in time, keeping its pitch (speech_audio.py, time_stretch.py)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.diffusion_caps import served_caps
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.schemas import VoiceRef
from omni_actors.api.voices import silence, voice_store
from omni_actors.audio import resample
from omni_actors.config.deploy import model_id
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.config.speech import OPENAI_VOICES
from omni_actors.orchestrator.core import Orchestrator

CUSTOM_PREFIX = "voice_"


@dataclass
class SpeechCall:
    inputs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None
    api_speed: float = 1.0
    """Speed the API applies to the audio (1.0 where the stages apply it themselves)."""


def voice_choices(pipe: PipelineConfig) -> list[str]:
    spec = pipe.speech
    return [*spec.voices, *OPENAI_VOICES] if spec else []


def _needs_custom(pipe: PipelineConfig, given: str | None, param: str = "voice") -> ApiError:
    what = f"voice {given!r}" if given else "a request without a voice"
    return bad_request(f"model {pipe.name!r} has no built-in voices, it speaks only in a custom voice "
                       f"(voice={{\"id\": \"voice_...\"}}, see /v1/audio/voices); {what} cannot be spoken",
                       param, "custom_voice_required")


def builtin_voice(pipe: PipelineConfig, name: str, param: str = "voice") -> str:
    """The built-in voice `name` stands for (itself, or an OpenAI name's), of a pipeline with a
    SpeechSpec; a 400 naming `param` for any other name."""
    spec = pipe.speech
    assert spec is not None
    if not spec.voices:
        raise _needs_custom(pipe, name, param)
    # without case, as the stages match (config.speech.pick_voice); before 2026-12-05 "Vivian" or "s1"
    # was a 400 while "ALLOY" spoke
    by_lower = {v.lower(): v for v in spec.voices}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    if name.lower() in OPENAI_VOICES:
        return spec.voices[OPENAI_VOICES.index(name.lower()) % len(spec.voices)]
    custom = " or a custom voice id (voice_...)" if spec.cloning else ""
    raise bad_request(f"unknown voice {name!r}; this model's voices are {voice_choices(pipe)}{custom}",
                      param, "unknown_voice")


def listed_voice(pipe: PipelineConfig, name: str, param: str) -> str | None:
    """`builtin_voice` where the pipeline lists built-in voices; None (unchecked) where it lists none."""
    return builtin_voice(pipe, name, param) if pipe.speech is not None and pipe.speech.voices else None


async def speech_call(request: web.Request, pipe: PipelineConfig, text: str, voice: str | VoiceRef | None,
                      instructions: str | None, speed: float, seed: int | None) -> SpeechCall:
    """What the pipeline gets for one text; 400 naming the field the pipeline cannot honour."""
    if instructions is not None and not instructions.strip():
        instructions = None  # whitespace-only is no style prompt, as "" is (it was a 400 before 2026-12-05)
    call = SpeechCall(inputs={"text": text})
    if seed is not None:
        call.params["seed"] = seed
    spec = pipe.speech
    if spec is None:  # a pipeline that speaks without declaring voices: pass through
        if isinstance(voice, VoiceRef):
            raise bad_request(f"model {pipe.name!r} cannot speak in a custom voice", "voice", "unsupported_voice")
        call.inputs.update({k: v for k, v in (("voice", voice), ("instructions", instructions)) if v})
        call.api_speed = speed  # no stage is known to honour it: the API stretches the audio
        return call
    call.sample_rate = spec.sample_rate
    if instructions:
        if not spec.instructions:
            raise bad_request(f"model {pipe.name!r} takes no style instructions; leave `instructions` out",
                              "instructions", "unsupported_parameter")
        call.inputs["instructions"] = instructions
    if spec.native_speed:
        call.params["speed"] = speed
    else:
        call.api_speed = speed
    vid = voice.id if isinstance(voice, VoiceRef) else voice
    if vid is None:
        if not spec.voices:
            raise _needs_custom(pipe, None)
        call.inputs["voice"] = spec.voices[0]
    elif vid.startswith(CUSTOM_PREFIX) and vid not in spec.voices:
        if not spec.cloning:
            raise bad_request(f"model {pipe.name!r} cannot speak in a custom voice; its voices are "
                              f"{voice_choices(pipe)}", "voice", "unsupported_voice")
        store = voice_store(request)
        found = store.voice(vid)
        if found is None:
            raise bad_request(f"custom voice {vid!r} does not exist", "voice", "unknown_voice")
        try:
            audio, rate = await off_loop(store.clip, vid)
        except (KeyError, OSError):
            raise bad_request(f"custom voice {vid!r} has no readable sample", "voice", "unknown_voice") from None
        silent = silence(audio, f"the sample of custom voice {vid!r}")
        if silent:  # stored before uploads were checked for silence
            raise bad_request(silent, "voice", "audio_silent")
        if spec.voices:
            call.inputs["voice"] = spec.voices[0]
        call.inputs.update(reference_text=found.transcript, reference_id=vid,
                           reference_audio=await off_loop(resample, audio, rate, spec.sample_rate))
    else:
        call.inputs["voice"] = builtin_voice(pipe, vid)
    return call


def require_speech_model(orch: Orchestrator, name: str | None, param: str = "model") -> None:
    """A diffusion model that makes sound from a prompt (Stable Audio) reads no text to speak: a 400
    naming `param` that points at its route, before anything reaches its stage."""
    if served_caps(orch) is not None:
        raise bad_request(f"model {name or model_id(orch.deploy)!r} makes sound from a prompt, not speech from "
                          "text; use /v1/audio/generations", param, "unsupported_task")
