"""Tiny random-weight LongCat-Image and LongCat-Image-Edit checkpoints in the real diffusers layout.

Real classes: LongCatImageTransformer2DModel, AutoencoderKL (FLUX-style, 8x),
FlowMatchEulerDiscreteScheduler, a Qwen2.5-VL text encoder with Qwen's real
vocabulary and the offline Qwen2Tokenizer (qwen_image.py), and a
`text_processor` folder (Qwen2VLProcessor) written by hand because transformers
5.19 builds that class only with torchvision (served here through
models/diffusion/processors.py).
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.diffusion.processors import image_only_qwen2_vl_processor
from omni_actors.models.tiny.qwen_image import (
    TEXT_HIDDEN,
    name_component,
    qwen_vl_image_processor,
    qwen_vl_text_encoder,
    qwen_vl_tokenizer,
    write_qwen_vl_processor,
)

VARIANTS = {"longcat_image": "LongCatImagePipeline", "longcat_image_edit": "LongCatImageEditPipeline"}


def make_tiny_longcat_image(out_dir: str | Path, seed: int = 0, variant: str = "longcat_image") -> Path:
    """Write a tiny LongCat-Image pipeline of `variant` (see VARIANTS) to `out_dir`; return the folder."""
    import diffusers
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        LongCatImageTransformer2DModel,
    )

    if variant not in VARIANTS:
        raise ValueError(f"unknown LongCat-Image variant {variant!r}; expected one of {sorted(VARIANTS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        latent = 16  # the pipelines fix 16 latent channels (the FLUX VAE)
        transformer = LongCatImageTransformer2DModel(
            patch_size=1, in_channels=latent * 4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=TEXT_HIDDEN, pooled_projection_dim=TEXT_HIDDEN,
            axes_dims_rope=[4, 6, 6],
        )  # fmt: skip
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
            up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=(16, 16, 32, 32), layers_per_block=1,
            latent_channels=latent, norm_num_groups=4, sample_size=64, scaling_factor=0.3611, shift_factor=0.1159,
        )  # fmt: skip
        tokenizer = qwen_vl_tokenizer(seed)
        processor = image_only_qwen2_vl_processor(qwen_vl_image_processor(), tokenizer, tokenizer.chat_template)
        pipe = getattr(diffusers, VARIANTS[variant])(
            scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=qwen_vl_text_encoder(),
            tokenizer=tokenizer, text_processor=processor, transformer=transformer,
        )  # fmt: skip
        pipe.register_modules(text_processor=None)  # the edit pipeline's init reads it; the folder is written below
    pipe.save_pretrained(out, safe_serialization=True)
    write_qwen_vl_processor(out / "text_processor", tokenizer)
    name_component(out, "text_processor", "transformers", "Qwen2VLProcessor")
    return out
