"""The qwen3_tts pipeline (Qwen3-TTS 12 Hz, CustomVoice / VoiceDesign / Base): talker + code predictor (LLM_AR) -> codec.

    0 talker  text (+ a style prompt) -> one frame of codes per step (group 0 from the
              talker, the rest from its code predictor)
    1 codec   frames -> 24 kHz audio deltas          (final output "audio")

transformers has no qwen3_tts: the talker, code predictor and codec decoder are
assembled in modules.py / codec_model.py from transformers' Qwen3 and
Qwen3-Omni-MoE code2wav blocks plus our own quantizer and projections, read
from the public layout (config.json model_type "qwen3_tts", `talker.*`
weights, the codec in `speech_tokenizer/`). With async chunk on, every frame
goes to the codec stage as it is sampled.

What a folder offers the speech API depends on its `tts_model_type` (config.json),
so `speech_of` reads it (`folder_speech`): "custom_voice" has named speakers
(`talker_config.spk_id`) and style instructions; "voice_design" takes its voice
from the instructions (voice names are accepted and ignored); "base" clones: it
has no built-in voice, speaks only in a custom voice (a reference clip, and its
transcript when known) and takes no instructions, as the original's
voice-clone call, which needs a reference clip and has no instruct text.
Topology only: imports without torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline
from omni_actors.config.speech import SpeechSpec

_PKG = "omni_actors.models.qwen3_tts"
VOICES = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
"""The CustomVoice checkpoints' named speakers (`talker_config.spk_id`); a VoiceDesign
checkpoint has none and takes its voice from `instructions`, so the name is ignored there."""
RATE = 24000
SPEECH = SpeechSpec(voices=VOICES, sample_rate=RATE, cloning=False, instructions=True)
CLONING = SpeechSpec(voices=(), sample_rate=RATE, cloning=True, instructions=False)


def folder_speech(folder: Path) -> SpeechSpec:
    """The speech spec of one qwen3_tts folder, by its config.json `tts_model_type` (module docstring).

    An unreadable config gives the CustomVoice spec; the talker stage names the problem when it loads."""
    try:
        config = json.loads((folder / "config.json").read_text())
        kind = config.get("tts_model_type")
        speakers = (config.get("talker_config") or {}).get("spk_id") or {}
    except (OSError, ValueError, AttributeError):
        return SPEECH
    if kind == "base":
        return CLONING
    if speakers and isinstance(speakers, dict):
        return SpeechSpec(voices=tuple(str(k).lower() for k in speakers), sample_rate=RATE, instructions=True)
    return SPEECH


@register_pipeline("qwen3_tts")
def qwen3_tts() -> PipelineConfig:
    return PipelineConfig(
        name="qwen3_tts",
        detect=("transformers:qwen3_tts",),
        description="Qwen3-TTS 12 Hz text to speech (talker + multi-token code predictor, 12 Hz codec); "
                    "named speakers and style instructions, or voice cloning (Base checkpoints)",
        speech=SPEECH,
        speech_of=f"{_PKG}:folder_speech",
        stages=(
            StageSpec(
                stage_id=0, model_stage="talker", execution_type=ExecutionType.LLM_AR,
                engine="omni_actors.workers.engines.hf_ar:HfAREngine",
                engine_defaults={"adapter": f"{_PKG}.talker:Qwen3TTSTalkerAdapter"},
            ),
            StageSpec(
                stage_id=1, model_stage="codec", execution_type=ExecutionType.LLM_GENERATION,
                engine="omni_actors.workers.engines.generation:GenerationEngine",
                engine_defaults={"adapter": f"{_PKG}.codec:Qwen3TTSCodecAdapter"},
                input_sources=(0,), processor="omni_actors.models.processors:concat_upstream",
                chunk_processor="omni_actors.models.processors:pass_chunk",
                final_output=True, final_output_type="audio",
            ),
        ),
    )  # fmt: skip
