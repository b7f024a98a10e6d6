"""`make-tiny` entry points of the diffusers inpainting families: Qwen-Image (+ Edit) inpaint and FLUX.2 Klein inpaint.

An inpainting pipeline of diffusers 0.42 takes the same components as its
family's base pipeline: `QwenImageInpaintPipeline` those of `QwenImagePipeline`
(the real Qwen/Qwen-Image folder loads into it), `QwenImageEditInpaintPipeline`
those of `QwenImageEditPipeline` (with the Qwen2VLProcessor), so their folders
are the tiny base folders with another `_class_name`. `Flux2KleinInpaintPipeline`
is built here: FLUX.2's transformer (no guidance embedding) and VAE with a
Qwen3ForCausalLM text encoder and Qwen's tokenizer, as FLUX.2 [klein] ships.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import seeded_pipeline
from omni_actors.models.tiny.text_encoders import QWEN3_TEXT_HIDDEN, qwen3_config


def qwen_image_inpaint(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return _renamed(make_tiny_qwen_image(out_dir, seed, "qwen_image"), "QwenImageInpaintPipeline")


def qwen_image_edit_inpaint(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return _renamed(make_tiny_qwen_image(out_dir, seed, "qwen_image_edit"), "QwenImageEditInpaintPipeline")


def _renamed(out: Path, class_name: str) -> Path:
    """Name `class_name` as the folder's pipeline (its components are the ones that class takes)."""
    index_file = out / "model_index.json"
    index = json.loads(index_file.read_text())
    index["_class_name"] = class_name
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return out


KLEIN_TEXT_LAYERS = 28
"""The pipeline stacks the text encoder's hidden states 9, 18 and 27 (Qwen3-4B has 36 layers)."""


def flux2_klein_inpaint(out_dir: str | Path, seed: int = 0) -> Path:
    """FLUX.2 [klein] inpaint: Flux2Transformer2DModel, AutoencoderKLFlux2, a Qwen3ForCausalLM text encoder."""
    return seeded_pipeline(out_dir, seed, lambda: _flux2_klein_inpaint(seed))


def _flux2_klein_inpaint(seed: int) -> Any:
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinInpaintPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3ForCausalLM

    from omni_actors.models.tiny.qwen_image import qwen_vl_tokenizer

    text_encoder = Qwen3ForCausalLM(qwen3_config(KLEIN_TEXT_LAYERS, tie_word_embeddings=True)).eval()
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=QWEN3_TEXT_HIDDEN * 3, timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False,
    )  # fmt: skip
    vae = AutoencoderKLFlux2(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), layers_per_block=1,
        latent_channels=4, norm_num_groups=16, use_quant_conv=False, use_post_quant_conv=False,
    )  # fmt: skip
    return Flux2KleinInpaintPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=qwen_vl_tokenizer(seed), transformer=transformer, is_distilled=False,
    )  # fmt: skip
