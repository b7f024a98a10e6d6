"""The qwen3_asr pipeline: speech to text with Qwen3-ASR (audio encoder + Qwen3 decoder), one LLM_AR stage.

    0 asr   audio (any rate, resampled to 16 kHz) -> transcript deltas   (final output "transcript")

Serves `/v1/audio/transcriptions` for a `Qwen3ASRForConditionalGeneration` folder
(model_type "qwen3_asr"). Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.models.stages import entry_stage


@register_pipeline("qwen3_asr")
def qwen3_asr() -> PipelineConfig:
    return PipelineConfig(
        name="qwen3_asr",
        detect=("transformers:qwen3_asr",),
        description="Qwen3-ASR speech recognition (streamed transcript)",
        stages=(
            entry_stage("asr", adapter="omni_actors.models.qwen3_asr.asr:Qwen3AsrAdapter",
                        final_output=True, final_output_type="transcript"),
        ),
    )  # fmt: skip
