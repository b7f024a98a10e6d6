"""Tiny random-weight diffusers checkpoints (Stable Diffusion, DiT, DDPM) built offline.

Each builder writes a real diffusers pipeline folder with `save_pretrained`
(model_index.json, per-component configs and safetensors, a CLIP tokenizer
made from an in-memory vocabulary), so the same `from_pretrained` code that
loads a real checkpoint loads it. Deterministic by seed; builds in seconds.

    make_tiny_diffusion(out_dir, seed=0, kind="sd")   # 32x32 images by default
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import seeded_pipeline

KINDS = ("sd", "sd_inpaint", "dit", "ddpm")
"""What `make_tiny_diffusion` can build."""

_WORDS = (
    "a photo of a cat sitting on the red chair in the garden "
    "an oil painting of the sea at night with a small boat and stars"
)


def make_tiny_diffusion(out_dir: str | Path, seed: int = 0, kind: str = "sd") -> Path:
    """Write a tiny random-weight diffusers pipeline of `kind` to `out_dir`; return the folder."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny diffusion kind {kind!r}; expected one of {KINDS}")
    builders = {"sd": _stable_diffusion, "sd_inpaint": _inpaint, "dit": _dit, "ddpm": _ddpm}
    return seeded_pipeline(out_dir, seed, builders[kind])


def _vae() -> Any:
    from diffusers import AutoencoderKL

    # Two blocks: latents are 1/2 of the image side, so 32 px images use 16 px latents.
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=32,
    )


def make_tiny_sd_inpaint(out_dir: str | Path, seed: int = 0) -> Path:
    """A tiny Stable Diffusion inpainting pipeline (image + mask in, 32 px by default)."""
    return make_tiny_diffusion(out_dir, seed, kind="sd_inpaint")


def _inpaint() -> Any:
    from diffusers import StableDiffusionInpaintPipeline

    return StableDiffusionInpaintPipeline(**_stable_diffusion(unet_in=9).components)


def _stable_diffusion(unet_in: int = 4) -> Any:
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = _clip_tokenizer()
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            layer_norm_eps=1e-5,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=unet_in,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=_vae(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )


def _clip_tokenizer() -> Any:
    """A CLIP BPE tokenizer over the 256 byte symbols plus merges learned from a few words."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for tok in [*symbols, *(s + "</w>" for s in symbols)]:
        vocab.setdefault(tok, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in sorted(set(_WORDS.split())):
        # Merge each word left to right into one token ending in </w>.
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            merged = parts[0] + parts[1]
            if pair not in merges:
                merges.append(pair)
            vocab.setdefault(merged, len(vocab))
            parts = [merged, *parts[2:]]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=77,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def _dit() -> Any:
    from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    # DiT's null class for guidance is id 1000, so the label table is fixed at 1000.
    transformer = DiTTransformer2DModel(
        sample_size=16,
        patch_size=4,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        num_attention_heads=2,
        attention_head_dim=8,
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_zero",
    )
    id2label = {i: f"class {i}" for i in range(1000)}
    return DiTPipeline(
        transformer=transformer, vae=_vae(), scheduler=DDIMScheduler(), id2label=id2label
    )


def _ddpm() -> Any:
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    unet = UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=32,
    )
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000))
