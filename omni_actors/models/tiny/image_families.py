"""`make-tiny` entry points of the diffusers image families: one function per name, each `(out_dir, seed) -> Path`.

Every builder writes a real diffusers folder with the family's real pipeline,
transformer, VAE, scheduler, text encoder and tokenizer classes at tiny widths
(docs/media.md lists them and what could not be built offline).
"""

from __future__ import annotations

from pathlib import Path


def qwen_image(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image")


def qwen_image_edit(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_edit")


def qwen_image_edit_plus(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_edit_plus")


def qwen_image_layered(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_layered")


def z_image(out_dir: str | Path, seed: int = 0) -> Path:
    """Z-Image: ZImageTransformer2DModel, AutoencoderKL (16 latent channels), a Qwen3 text encoder."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3Model

    from omni_actors.models.tiny.qwen_image import qwen_vl_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
            n_refiner_layers=1, n_heads=2, n_kv_heads=2, qk_norm=True, cap_feat_dim=16,
            axes_dims=[8, 4, 4], axes_lens=[256, 32, 32],
        )  # fmt: skip
        with torch.no_grad():  # made with torch.empty: give them values a saved file can hold
            transformer.x_pad_token.normal_()
            transformer.cap_pad_token.normal_()
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
            up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[32, 64], layers_per_block=1,
            latent_channels=16, norm_num_groups=32, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
        )  # fmt: skip
        text_encoder = Qwen3Model(Qwen3Config(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, vocab_size=151936, max_position_embeddings=4096,
        ))  # fmt: skip
        pipe = ZImagePipeline(
            transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
            text_encoder=text_encoder, tokenizer=qwen_vl_tokenizer(seed),
        )  # fmt: skip
    pipe.save_pretrained(out, safe_serialization=True)
    return out
