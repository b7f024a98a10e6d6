"""Tiny random-weight checkpoints of each bundled pipeline's real architecture, built offline.

`make_tiny(pipeline, out_dir, seed)` writes a folder in the real on-disk format
(config, safetensors weights, tokenizer/processor files, side files) that the
real loading code reads. Builders are imported lazily: this module imports
without torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path

IMAGE_FAMILIES = ("qwen_image", "z_image", "hunyuan_image", "qwen_image_edit", "qwen_image_edit_plus",
                  "qwen_image_layered", "flux2", "longcat_image", "longcat_image_edit", "glm_image")
"""The diffusers image families built here (omni_actors.models.tiny.image_families: one builder each)."""
INPAINT_FAMILIES = ("qwen_image_inpaint", "qwen_image_edit_inpaint", "flux2_klein_inpaint")
"""The diffusers inpainting families built here (omni_actors.models.tiny.inpaint_families)."""

_BUILDERS: dict[str, str] = {
    "qwen2_5_omni": "omni_actors.models.tiny.qwen2_5_omni:make_tiny_qwen2_5_omni",
    "qwen3_omni_moe": "omni_actors.models.tiny.qwen3_omni_moe:make_tiny_qwen3_omni_moe",
    "llama": "omni_actors.models.tiny.llama:make_tiny_llama",
    "diffusion": "omni_actors.models.tiny.diffusion:make_tiny_diffusion",
    "moshi": "omni_actors.models.tiny.moshi:make_tiny_moshi",
    "sd_inpaint": "omni_actors.models.tiny.diffusion:make_tiny_sd_inpaint",
    **{name: f"omni_actors.models.tiny.image_families:{name}" for name in IMAGE_FAMILIES},
    **{name: f"omni_actors.models.tiny.inpaint_families:{name}" for name in INPAINT_FAMILIES},
    "wan2_2": "omni_actors.models.tiny.video:make_tiny_wan2_2",
    "wan2_2_i2v": "omni_actors.models.tiny.video:make_tiny_wan2_2_i2v",
    "wan2_2_i2v-a14b": "omni_actors.models.tiny.video:make_tiny_wan2_2_i2v_a14b",
    "stable_audio": "omni_actors.models.tiny.video:make_tiny_stable_audio",
    "ltx2": "omni_actors.models.tiny.video:make_tiny_ltx2",
    "hunyuan_video_1_5": "omni_actors.models.tiny.video:make_tiny_hunyuan_video_1_5",
    "csm": "omni_actors.models.tiny.csm:make_tiny_csm",
    "qwen3_tts": "omni_actors.models.tiny.qwen3_tts:make_tiny_qwen3_tts",
    "qwen3_tts-voice-design": "omni_actors.models.tiny.qwen3_tts:make_tiny_qwen3_tts_voice_design",
    "qwen3_tts-base": "omni_actors.models.tiny.qwen3_tts:make_tiny_qwen3_tts_base",
    "csm-1b-sized": "omni_actors.models.tiny.csm:make_csm_1b_sized",
    "dia": "omni_actors.models.tiny.dia:make_tiny_dia",
    "higgs_audio_v2": "omni_actors.models.tiny.higgs_audio_v2:make_tiny_higgs_audio_v2",
    "higgs_audio_v2-3b-sized": "omni_actors.models.tiny.higgs_audio_v2:make_higgs_audio_v2_3b_sized",
    "dia-1.6b-sized": "omni_actors.models.tiny.dia:make_dia_1_6b_sized",
    "vibevoice": "omni_actors.models.tiny.vibevoice:make_tiny_vibevoice",
    "vibevoice-1.5b-sized": "omni_actors.models.tiny.vibevoice:make_vibevoice_1_5b_sized",
    "qwen3_asr": "omni_actors.models.tiny.qwen3_asr:make_tiny_qwen3_asr",
    "voxtral_realtime": "omni_actors.models.tiny.voxtral_realtime:make_tiny_voxtral_realtime",
}


def tiny_names() -> list[str]:
    """Names `make_tiny` accepts."""
    return sorted(_BUILDERS)


def make_tiny(pipeline: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny checkpoint for `pipeline` into `out_dir`; return the folder."""
    try:
        ref = _BUILDERS[pipeline]
    except KeyError:
        raise ValueError(
            f"no tiny builder for {pipeline!r}; known: {', '.join(tiny_names())}"
        ) from None
    from omni_actors import progress

    module, _, fn = ref.partition(":")
    # Two steps, each of seconds: importing the builder (torch, transformers/diffusers), then building
    # and writing the checkpoint.
    bar = progress.start("model.make_tiny", 2, pipeline=pipeline)
    builder = getattr(importlib.import_module(module), fn)
    bar.advance(step="imported")
    out = Path(builder(out_dir, seed=seed))
    bar.advance(step="written")
    return out
