"""The csm pipeline (Sesame CSM): backbone + depth decoder (LLM_AR) -> Mimi codec decoder (LLM_GENERATION).

    0 backbone  text (+ a reference clip to clone) -> one frame of 32 Mimi codes per step
    1 codec     frames -> 24 kHz audio deltas          (final output "audio")

With async chunk on, every frame goes to the codec stage as it is sampled and the
codec decodes growing windows of them (generation.py), so the first audio leaves
after a few frames. Both stages load from one `CsmForConditionalGeneration`
folder (model_type "csm"). Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline
from omni_actors.config.speech import SpeechSpec

_PKG = "omni_actors.models.csm"
VOICES = ("0", "1")
"""CSM's speaker ids (the "[0]" / "[1]" text prefixes of sesame/csm-1b)."""


@register_pipeline("csm")
def csm() -> PipelineConfig:
    return PipelineConfig(
        name="csm",
        detect=("transformers:csm",),
        description="Sesame CSM text to speech (Llama backbone + depth decoder, Mimi codec); clones a reference clip",
        speech=SpeechSpec(voices=VOICES, sample_rate=24000, cloning=True),
        stages=(
            StageSpec(
                stage_id=0, model_stage="backbone", execution_type=ExecutionType.LLM_AR,
                engine="omni_actors.workers.engines.hf_ar:HfAREngine",
                engine_defaults={"adapter": f"{_PKG}.backbone:CsmBackboneAdapter"},
                owns_tokenizer=True,
            ),
            StageSpec(
                stage_id=1, model_stage="codec", execution_type=ExecutionType.LLM_GENERATION,
                engine="omni_actors.workers.engines.generation:GenerationEngine",
                engine_defaults={"adapter": f"{_PKG}.codec:MimiCodecAdapter"},
                input_sources=(0,), processor="omni_actors.models.processors:concat_upstream",
                chunk_processor="omni_actors.models.processors:pass_chunk",
                final_output=True, final_output_type="audio",
            ),
        ),
    )  # fmt: skip
