"""The higgs_audio_v2 pipeline (Boson AI Higgs-Audio-V2): dual-FFN Llama LM (LLM_AR) -> audio tokenizer decoder (LLM_GENERATION).

    0 lm     text (+ a scene description, + a reference clip to clone) -> one frame of 8 codes per step
    1 codec  frames -> 24 kHz audio deltas           (final output "audio")

The LM runs on the shared transformers AR engine through an adapter (lm.py): the delay
pattern (codebook k k steps late, delay.py) completes a frame each step once its ramp is
done, and with async chunk on each frame goes to the codec stage then; the codec decodes
growing windows with context on both sides (its DAC decoder is not causal). Both stages
load from one `HiggsAudioV2ForConditionalGeneration` folder (model_type "higgs_audio_v2")
and the audio tokenizer folder its processor names. The audio tokenizer's module imports
torchaudio, which is not installed here: codec_loading.py says how it is loaded anyway.
Topology only: imports without torch.
"""

from __future__ import annotations

from omni_actors.config.pipeline import PipelineConfig, register_pipeline
from omni_actors.config.speech import SpeechSpec
from omni_actors.models.stages import entry_stage, tts_pipeline

_PKG = "omni_actors.models.higgs_audio_v2"
VOICES = ("default", "SPEAKER0", "SPEAKER1")
"""No built-in speakers: `default` speaks the text as it is (the model picks the voice), `SPEAKER0` /
`SPEAKER1` tag it as Higgs's multi-speaker scripts do (prompt.py; the same tuple)."""


@register_pipeline("higgs_audio_v2")
def higgs_audio_v2() -> PipelineConfig:
    return tts_pipeline(
        "higgs_audio_v2",
        "Boson AI Higgs-Audio-V2 text to speech (dual-FFN Llama, 8 delayed codebooks, DAC-based audio "
        "tokenizer); scene descriptions as instructions; clones a reference clip",
        SpeechSpec(voices=VOICES, sample_rate=24000, cloning=True, instructions=True),
        entry_stage("lm", adapter=f"{_PKG}.lm:HiggsLMAdapter"),
        f"{_PKG}.codec:HiggsCodecAdapter",
    )
