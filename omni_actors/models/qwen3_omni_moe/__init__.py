"""The qwen3_omni_moe pipeline: thinker (LLM_AR) -> talker + code predictor (LLM_AR) -> code2wav.

Same topology and processors as qwen2_5_omni (see its package docstring for why
the thinker runs on transformers here); the adapters are Qwen3-Omni's. This
module defines topology only and imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.models.qwen2_5_omni import omni_pipeline


@register_pipeline("qwen3_omni_moe")
def qwen3_omni_moe() -> PipelineConfig:
    return omni_pipeline(
        "qwen3_omni_moe", "omni_actors.models.qwen3_omni_moe",
        "thinker:Qwen3OmniMoeThinkerAdapter", "talker:Qwen3OmniMoeTalkerAdapter",
        "code2wav:Qwen3OmniMoeCode2WavAdapter",
    )  # fmt: skip
