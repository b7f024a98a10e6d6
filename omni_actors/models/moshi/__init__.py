"""The `moshi` pipeline: one full-duplex stage (Mimi encode, temporal + depth step, Mimi decode per 80 ms frame).

Topology only (imports without torch). The model folder is a Hugging Face Moshi
checkpoint (`config.json` model_type "moshi" with its Mimi `audio_encoder_config`).
Sessions reach it through the realtime WebSocket (api/realtime/duplex.py); the
stage runs on the duplex engine (workers/engines/duplex.py), batch size
`max_num_seqs` = the most live sessions.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, register_pipeline
from omni_actors.models.stages import entry_stage


@register_pipeline("moshi")
def moshi() -> PipelineConfig:
    return PipelineConfig(
        name="moshi",
        description="Moshi full-duplex speech-to-speech (realtime WebSocket sessions, batched per 80 ms frame)",
        detect=("transformers:moshi",),
        duplex=True,
        stages=(
            entry_stage("moshi", adapter="omni_actors.models.moshi.model:MoshiDuplexAdapter",
                        engine="omni_actors.workers.engines.duplex:DuplexEngine",
                        execution_type=ExecutionType.LLM_GENERATION,
                        final_output=True, final_output_type="audio"),
        ),
    )  # fmt: skip
