"""Stage shapes several model families share: an entry stage, a streaming codec stage, a TTS pair.

Topology only: imports without torch.
"""

from __future__ import annotations

from typing import Any

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec
from omni_actors.config.speech import SpeechSpec

HF_AR_ENGINE = "omni_actors.workers.engines.hf_ar:HfAREngine"
GENERATION_ENGINE = "omni_actors.workers.engines.generation:GenerationEngine"


def entry_stage(
    model_stage: str, engine: str = HF_AR_ENGINE, adapter: str | None = None,
    execution_type: ExecutionType = ExecutionType.LLM_AR, **spec: Any,
) -> StageSpec:  # fmt: skip
    """Stage 0, the request's first: `engine` (HfAREngine, or the model's own) over the model's
    `adapter` ("module:Class") when it takes one."""
    return StageSpec(
        stage_id=0, model_stage=model_stage, execution_type=execution_type, engine=engine,
        engine_defaults={"adapter": adapter} if adapter else {}, **spec,
    )  # fmt: skip


def codec_stage(adapter: str) -> StageSpec:
    """Stage 1: stage 0's frames (whole, or chunk by chunk) decoded in growing windows to audio, the final output."""
    return StageSpec(
        stage_id=1, model_stage="codec", execution_type=ExecutionType.LLM_GENERATION,
        engine=GENERATION_ENGINE, engine_defaults={"adapter": adapter},
        input_sources=(0,), processor="omni_actors.models.processors:concat_upstream",
        chunk_processor="omni_actors.models.processors:pass_chunk",
        final_output=True, final_output_type="audio",
    )  # fmt: skip


def tts_pipeline(
    name: str, description: str, speech: SpeechSpec, frames: StageSpec, codec_adapter: str
) -> PipelineConfig:
    """A text-to-speech family: stage 0 makes `frames` of codes, stage 1 (`codec_stage`) makes audio of them.

    Detected by the checkpoint's model_type `name`.
    """
    return PipelineConfig(
        name=name, detect=(f"transformers:{name}",), description=description, speech=speech,
        stages=(frames, codec_stage(codec_adapter)),
    )  # fmt: skip
