"""The generic `diffusion` pipeline: one DIFFUSION stage serving a diffusers pipeline folder.

The deploy `model` is a diffusers folder (model_index.json at its root); the
engine loads whatever pipeline class it names. Build a tiny one offline with
`omni_actors.models.tiny.diffusion.make_tiny_diffusion`. Topology only: this
module imports without torch or diffusers.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline

ENGINE = "omni_actors.workers.engines.diffusion:DiffusionEngine"


@register_pipeline("diffusion")
def diffusion() -> PipelineConfig:
    return PipelineConfig(
        detect=("diffusers:*",),
        name="diffusion",
        description="text (or class) to image with any diffusers pipeline; batched, per-step progress",
        stages=(
            StageSpec(
                stage_id=0,
                model_stage="diffusion",
                execution_type=ExecutionType.DIFFUSION,
                engine=ENGINE,
                final_output=True,
                final_output_type="image",
            ),
        ),
    )
