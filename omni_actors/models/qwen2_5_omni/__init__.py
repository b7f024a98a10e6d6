"""The qwen2_5_omni pipeline: thinker (LLM_AR) -> talker (LLM_AR) -> code2wav (LLM_GENERATION).

All three stages load from one Qwen2.5-Omni checkpoint folder (each its own
part). The thinker runs on the transformers AR engine, not vLLM: vLLM 0.32's
Qwen-Omni thinker needs torchvision, which this CPU environment cannot have
(see thinker.py); the talker needs the thinker's hidden states, which the
transformers thinker hands over directly. This module defines topology only
and imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline

HF_AR = "omni_actors.workers.engines.hf_ar:HfAREngine"
GENERATION = "omni_actors.workers.engines.generation:GenerationEngine"
PROCESSORS = "omni_actors.models.qwen2_5_omni.processors"


def omni_pipeline(
    name: str, package: str, thinker: str, talker: str, code2wav: str
) -> PipelineConfig:
    """The three-stage Qwen-Omni topology with the given adapter classes ("module:Class")."""
    return PipelineConfig(
        name=name,
        detect=(f"transformers:{name}",),
        description="Qwen-Omni: text/audio/image in; text and speech out",
        stages=(
            StageSpec(
                stage_id=0, model_stage="thinker", execution_type=ExecutionType.LLM_AR,
                engine=HF_AR, engine_defaults={"adapter": f"{package}.{thinker}"},
                final_output=True, final_output_type="text", guided=True,
            ),
            StageSpec(
                stage_id=1, model_stage="talker", execution_type=ExecutionType.LLM_AR,
                engine=HF_AR, engine_defaults={"adapter": f"{package}.{talker}"},
                input_sources=(0,), processor=f"{PROCESSORS}:thinker_to_talker",
                chunk_processor=f"{PROCESSORS}:thinker_to_talker_chunk",
            ),
            StageSpec(
                stage_id=2, model_stage="code2wav", execution_type=ExecutionType.LLM_GENERATION,
                engine=GENERATION, engine_defaults={"adapter": f"{package}.{code2wav}"},
                input_sources=(1,), processor=f"{PROCESSORS}:talker_to_code2wav",
                chunk_processor=f"{PROCESSORS}:talker_to_code2wav_chunk",
                final_output=True, final_output_type="audio",
            ),
        ),
    )  # fmt: skip


@register_pipeline("qwen2_5_omni")
def qwen2_5_omni() -> PipelineConfig:
    return omni_pipeline(
        "qwen2_5_omni", "omni_actors.models.qwen2_5_omni",
        "thinker:Qwen2_5OmniThinkerAdapter", "talker:Qwen2_5OmniTalkerAdapter",
        "code2wav:Qwen2_5OmniCode2WavAdapter",
    )  # fmt: skip
