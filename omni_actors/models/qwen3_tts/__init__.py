"""The qwen3_tts pipeline (Qwen3-TTS 12 Hz, CustomVoice / VoiceDesign): talker + code predictor (LLM_AR) -> codec.

    0 talker  text (+ a style prompt) -> one frame of codes per step (group 0 from the
              talker, the rest from its code predictor)
    1 codec   frames -> 24 kHz audio deltas          (final output "audio")

transformers has no qwen3_tts: the talker, code predictor and codec decoder are
assembled in modules.py / codec_model.py from transformers' Qwen3 and
Qwen3-Omni-MoE code2wav blocks plus our own quantizer and projections, read
from the public layout (config.json model_type "qwen3_tts", `talker.*`
weights, the codec in `speech_tokenizer/`). With async chunk on, every frame
goes to the codec stage as it is sampled. Base (voice cloning) checkpoints are
refused by the talker stage: their weights load, the cloning prompt is not written.
Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline
from omni_actors.config.speech import SpeechSpec

_PKG = "omni_actors.models.qwen3_tts"
VOICES = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
"""The CustomVoice checkpoints' named speakers (`talker_config.spk_id`); a VoiceDesign
checkpoint has none and takes its voice from `instructions`, so the name is ignored there."""


@register_pipeline("qwen3_tts")
def qwen3_tts() -> PipelineConfig:
    return PipelineConfig(
        name="qwen3_tts",
        detect=("transformers:qwen3_tts",),
        description="Qwen3-TTS 12 Hz text to speech (talker + multi-token code predictor, 12 Hz codec); "
                    "named speakers, style instructions",
        speech=SpeechSpec(voices=VOICES, sample_rate=24000, cloning=False, instructions=True),
        stages=(
            StageSpec(
                stage_id=0, model_stage="talker", execution_type=ExecutionType.LLM_AR,
                engine="omni_actors.workers.engines.hf_ar:HfAREngine",
                engine_defaults={"adapter": f"{_PKG}.talker:Qwen3TTSTalkerAdapter"},
                owns_tokenizer=True,
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
