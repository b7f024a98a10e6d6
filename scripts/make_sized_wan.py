"""Write a Wan2.2-TI2V-5B-sized WanPipeline with random weights (for GPU timing of /v1/videos).

Same architecture and sizes as Wan2.2-TI2V-5B, from configs, random weights, nothing
downloaded: WanTransformer3DModel (30 layers, 24 heads x 128, ffn 14336, 48 latent
channels, ~5B params), the Wan2.2 VAE (z_dim 48, residual, 2x2 patches: 16x spatial,
4x temporal), a UMT5-XXL-sized encoder (24 layers, d_model 4096, ~5.7B params with its
256384-row vocabulary), `expand_timesteps=True` as the TI2V model index has it. The
tokenizer is the tiny builder's offline T5 tokenizer (its ids fit the big vocabulary).
Weights are made on --device (cuda: seconds; cpu needs ~50 GB RAM) and saved in --dtype.

    python scripts/make_sized_wan.py OUT_DIR --device cuda --dtype bfloat16
    omni-run --model OUT_DIR    # then e.g. scripts/bench_video.py --model OUT_DIR --device cuda

Prints one JSON line with the parameter counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Z_DIM = 48


def build(out: Path, device: str, dtype: str, seed: int = 0) -> dict:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from omni_actors.models.tiny.video import t5_tokenizer

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    tokenizer = t5_tokenizer()
    with torch.device(device):
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
            relative_attention_num_buckets=32, feed_forward_proj="gated-gelu",
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        ))  # fmt: skip
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=Z_DIM,
            out_channels=Z_DIM, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
        )  # fmt: skip
        vae = AutoencoderKLWan(
            base_dim=160, decoder_base_dim=256, z_dim=Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
            temperal_downsample=[False, True, True], latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM,
            is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_temporal=4,
            scale_factor_spatial=16,
        )  # fmt: skip
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), transformer=transformer,
                       expand_timesteps=True)
    pipe.to(dtype=getattr(torch, dtype))
    built = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    return {
        "out": str(out), "dtype": dtype,
        "params": {"transformer": count(transformer), "text_encoder": count(text_encoder), "vae": count(vae)},
        "build_s": round(built, 2), "total_s": round(time.perf_counter() - t0, 2),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda", help="where to initialise the weights")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps({"made": "wan2_2-ti2v-5b-sized", **build(args.out, args.device, args.dtype, args.seed)}))


if __name__ == "__main__":
    main()
