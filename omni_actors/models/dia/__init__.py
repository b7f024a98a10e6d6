"""The dia pipeline (Nari Labs Dia): text encoder + audio decoder (LLM_AR) -> DAC codec decoder (LLM_GENERATION).

    0 decoder  text (+ a reference clip to clone) -> one frame of 9 DAC codes per step
    1 codec    frames -> 44.1 kHz audio deltas      (final output "audio")

The decoder stage is Dia's own engine (engine.py: an encoder-decoder with classifier-
free guidance keeps two decoder rows per request). With async chunk on, each frame
goes to the codec stage once the delay pattern has completed it, and the codec
decodes growing windows of them with context on both sides (DAC is not causal).
Both stages load from one `DiaForConditionalGeneration` folder (model_type "dia") and
the DAC folder its processor names. Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.config.speech import SpeechSpec
from omni_actors.models.stages import entry_stage, tts_pipeline

_PKG = "omni_actors.models.dia"
VOICES = ("S1", "S2")
"""Dia's speaker tags ("[S1]" / "[S2]" before a speaker's text)."""


@register_pipeline("dia")
def dia() -> PipelineConfig:
    return tts_pipeline(
        "dia",
        "Nari Labs Dia text to speech (encoder-decoder with guidance, DAC codec); clones a reference clip",
        SpeechSpec(voices=VOICES, sample_rate=44100, cloning=True),
        entry_stage("decoder", engine=f"{_PKG}.engine:DiaEngine"),
        f"{_PKG}.codec:DacCodecAdapter",
    )
