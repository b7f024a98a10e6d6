"""Write a Stable-Diffusion-1.5-sized diffusers pipeline with random weights (for GPU timing).

Same architecture and sizes as SD 1.5, built from configs with random weights:
UNet2DConditionModel (block_out_channels 320/640/1280/1280, 2 layers per block,
cross-attention 768, ~860M params), CLIPTextModel at ViT-L/14 text size (12
layers, width 768, 77 positions, vocab 49408, ~123M params), AutoencoderKL at
SD size (128/256/512/512, ~84M params), DDIM scheduler, and the offline CLIP
tokenizer of the tiny builder. Nothing downloads. Weights are saved in --dtype.

    python scripts/make_sized_diffusion.py OUT_DIR [--device cuda] [--dtype float16]

Prints one JSON line with the parameter counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(out: Path, device: str, dtype: str, seed: int = 0) -> dict:
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from omni_actors.models.tiny.diffusion import _clip_tokenizer

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    tokenizer = _clip_tokenizer()
    with torch.device(device):
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=49408, hidden_size=768, intermediate_size=3072,
                num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                hidden_act="quick_gelu", projection_dim=768,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )  # fmt: skip
        unet = UNet2DConditionModel(
            sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(320, 640, 1280, 1280),
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                              "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                            "CrossAttnUpBlock2D"),
            cross_attention_dim=768, attention_head_dim=8,
        )  # fmt: skip
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            sample_size=512, scaling_factor=0.18215,
        )  # fmt: skip
    scheduler = DDIMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        clip_sample=False, set_alpha_to_one=False, steps_offset=1,
    )  # fmt: skip
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
        scheduler=scheduler, safety_checker=None, feature_extractor=None,
        image_encoder=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.to(dtype=getattr(torch, dtype))
    built = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    return {
        "out": str(out),
        "dtype": dtype,
        "params": {
            "unet": count(unet),
            "text_encoder": count(text_encoder),
            "vae": count(vae),
        },
        "build_s": round(built, 2),
        "total_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu", help="where to initialise the weights")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps({"made": "sd15-sized", **build(args.out, args.device, args.dtype, args.seed)}))


if __name__ == "__main__":
    main()
