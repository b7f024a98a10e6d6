"""The vibevoice pipeline (Microsoft VibeVoice): Qwen2 LM + diffusion head (LLM_AR) -> acoustic decoder (LLM_GENERATION).

    0 lm     text (+ a reference clip to clone) -> one acoustic latent per step (7.5 a second)
    1 codec  latents -> 24 kHz audio deltas       (final output "audio")

The LM stage is VibeVoice's own engine (engine.py: a guidance branch per request and
a diffusion head per step; it also decodes each latent, since the LM reads its audio
back through the semantic encoder). With async chunk on, each latent goes to the
codec stage as it is made; the acoustic decoder is causal and keeps a streaming cache
per request, so windows need no context. Both stages load from one
`VibeVoiceForConditionalGeneration` folder (model_type "vibevoice"). Topology only:
imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.config.speech import SpeechSpec
from omni_actors.models.stages import entry_stage, tts_pipeline

_PKG = "omni_actors.models.vibevoice"
VOICES = ("0", "1", "2", "3")
"""The script's speakers ("Speaker 0:" .. "Speaker 3:"); VibeVoice's voices come from reference clips."""


@register_pipeline("vibevoice")
def vibevoice() -> PipelineConfig:
    return tts_pipeline(
        "vibevoice",
        "Microsoft VibeVoice text to speech (Qwen2 LM + diffusion head, acoustic tokenizer); clones a reference clip",
        SpeechSpec(voices=VOICES, sample_rate=24000, cloning=True),
        entry_stage("lm", engine=f"{_PKG}.engine:VibeVoiceEngine"),
        f"{_PKG}.codec:AcousticCodecAdapter",
    )
