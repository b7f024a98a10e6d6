"""The csm pipeline (Sesame CSM): backbone + depth decoder (LLM_AR) -> Mimi codec decoder (LLM_GENERATION).

    0 backbone  text (+ a reference clip to clone) -> one frame of 32 Mimi codes per step
    1 codec     frames -> 24 kHz audio deltas          (final output "audio")

With async chunk on, every frame goes to the codec stage as it is sampled and the
codec decodes growing windows of them (generation.py), so the first audio leaves
after a few frames. Both stages load from one `CsmForConditionalGeneration`
folder (model_type "csm"). Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.config.speech import SpeechSpec
from omni_actors.models.stages import entry_stage, tts_pipeline

_PKG = "omni_actors.models.csm"
VOICES = ("0", "1")
"""CSM's speaker ids (the "[0]" / "[1]" text prefixes of sesame/csm-1b)."""


@register_pipeline("csm")
def csm() -> PipelineConfig:
    return tts_pipeline(
        "csm",
        "Sesame CSM text to speech (Llama backbone + depth decoder, Mimi codec); clones a reference clip",
        SpeechSpec(voices=VOICES, sample_rate=24000, cloning=True),
        entry_stage("backbone", adapter=f"{_PKG}.backbone:CsmBackboneAdapter"),
        f"{_PKG}.codec:MimiCodecAdapter",
    )
