"""Synthetic pipelines (no weights) for runtime tests, benchmarks and API development.

    synthetic        thinker (text) -> talker (codes) -> vocoder (audio)
    synthetic_text   one text stage
    synthetic_image  one image (DIFFUSION) stage
    synthetic_fanin  0 -> 1, 0 -> 2, (1, 2) -> 3
    synthetic_asr    one transcript stage: audio in, "N samples at R Hz" out
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline

ENGINE = "omni_actors.workers.synthetic:SyntheticEngine"
PASS = "omni_actors.models.processors:pass_chunk"
AR, GEN, DIFF = ExecutionType.LLM_AR, ExecutionType.LLM_GENERATION, ExecutionType.DIFFUSION


@register_pipeline("synthetic")
def synthetic() -> PipelineConfig:
    return PipelineConfig(
        name="synthetic",
        requires_model=False,
        description="text -> codes -> audio, deterministic, no weights",
        stages=(
            StageSpec(stage_id=0, model_stage="thinker", execution_type=AR, engine=ENGINE,
                      engine_defaults={"kind": "text"},
                      final_output=True, final_output_type="text"),
            StageSpec(stage_id=1, model_stage="talker", execution_type=AR, engine=ENGINE,
                      engine_defaults={"kind": "codes"},
                      input_sources=(0,), chunk_processor=PASS),
            StageSpec(stage_id=2, model_stage="vocoder", execution_type=GEN, engine=ENGINE,
                      engine_defaults={"kind": "audio"},
                      input_sources=(1,), chunk_processor=PASS, final_output=True, final_output_type="audio"),
        ),
    )


@register_pipeline("synthetic_text")
def synthetic_text() -> PipelineConfig:
    return PipelineConfig(
        name="synthetic_text",
        requires_model=False,
        stages=(
            StageSpec(stage_id=0, model_stage="llm", execution_type=AR, engine=ENGINE,
                      final_output=True, final_output_type="text"),
        ),
    )


@register_pipeline("synthetic_image")
def synthetic_image() -> PipelineConfig:
    return PipelineConfig(
        name="synthetic_image",
        requires_model=False,
        stages=(
            StageSpec(stage_id=0, model_stage="dit", execution_type=DIFF, engine=ENGINE,
                      engine_defaults={"kind": "image", "chunks": 4},
                      final_output=True, final_output_type="image"),
        ),
    )


@register_pipeline("synthetic_fanin")
def synthetic_fanin() -> PipelineConfig:
    return PipelineConfig(
        name="synthetic_fanin",
        requires_model=False,
        stages=(
            StageSpec(stage_id=0, model_stage="root", execution_type=AR, engine=ENGINE),
            StageSpec(stage_id=1, model_stage="left", execution_type=AR, engine=ENGINE, input_sources=(0,), chunk_processor=PASS),
            StageSpec(stage_id=2, model_stage="right", execution_type=AR, engine=ENGINE, input_sources=(0,), chunk_processor=PASS),
            StageSpec(stage_id=3, model_stage="join", execution_type=AR, engine=ENGINE,
                      input_sources=(1, 2), chunk_processor=PASS, final_output=True, final_output_type="text"),
        ),
    )


@register_pipeline("synthetic_asr")
def synthetic_asr() -> PipelineConfig:
    return PipelineConfig(
        name="synthetic_asr",
        requires_model=False,
        description="audio -> a transcript describing it, no weights",
        stages=(
            StageSpec(stage_id=0, model_stage="asr", execution_type=AR, engine=ENGINE,
                      engine_defaults={"kind": "transcript", "chunks": 1},
                      final_output=True, final_output_type="transcript"),
        ),
    )
