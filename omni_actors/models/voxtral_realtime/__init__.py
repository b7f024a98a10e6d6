"""The voxtral_realtime pipeline: streaming speech to text with Voxtral Realtime, one LLM_AR stage.

    0 asr   audio (any rate, resampled to 16 kHz), whole or streamed in -> transcript deltas

Serves `/v1/audio/transcriptions` for a `VoxtralRealtimeForConditionalGeneration` folder
(model_type "voxtral_realtime") and realtime transcription sessions, where each turn's
audio is fed to one streaming request as it arrives (`live_transcription`), so its
transcript deltas go out while the user is still speaking. Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.models.stages import entry_stage


@register_pipeline("voxtral_realtime")
def voxtral_realtime() -> PipelineConfig:
    return PipelineConfig(
        name="voxtral_realtime",
        detect=("transformers:voxtral_realtime",),
        description="Voxtral Realtime streaming speech recognition (transcript streamed as audio arrives)",
        live_transcription=True,
        stages=(
            entry_stage("asr", adapter="omni_actors.models.voxtral_realtime.asr:VoxtralRealtimeAdapter",
                        final_output=True, final_output_type="transcript"),
        ),
    )  # fmt: skip
