"""Write a Qwen-Image-sized diffusers pipeline (20B MMDiT) with random weights, for GPU timing.

The real QwenImagePipeline architecture at its published sizes, built from
configs, nothing downloaded: QwenImageTransformer2DModel (60 layers, 24 heads of
128, joint attention 3584, ~20B params), AutoencoderKLQwenImage at its default
(real) config, a Qwen2.5-VL-7B-sized text encoder (28 layers, width 3584; fewer
with --text-layers to save disk: the benchmark times the denoiser), and the
offline Qwen tokenizer of the tiny builder. Weights are made on --device in
--dtype and saved as safetensors (about 41 GB for the transformer in bf16).

    python scripts/make_sized_qwen_image.py OUT_DIR --device cuda [--dtype bfloat16] [--text-layers 28]

Serve it with `omni-run --model OUT_DIR` and time it with
`scripts/bench_diffusion.py --model OUT_DIR --device cuda --dtype bfloat16 --size 1024 --steps 6 --images 4
--repeats 1` (docs/benchmarks.md, end of "Video: tiny Wan2.2 served vs direct").
Prints one JSON line with the parameter counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(out: Path, device: str, dtype: str, text_layers: int, seed: int = 0) -> dict:
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omni_actors.models.tiny.qwen_image import qwen_vl_tokenizer

    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    start = time.perf_counter()
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch_dtype)
        try:
            transformer = QwenImageTransformer2DModel(
                patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56),
            )  # fmt: skip
            vae = AutoencoderKLQwenImage()
            text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
                text_config={
                    "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                    "num_hidden_layers": text_layers, "num_attention_heads": 28, "num_key_value_heads": 4,
                    "max_position_embeddings": 128000, "max_window_layers": text_layers,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                        "mrope_section": [16, 24, 24]},
                },
                vision_config={"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                               "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31]},
                image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                vision_end_token_id=151653, vision_token_id=151654,
            ))  # fmt: skip
        finally:
            torch.set_default_dtype(prev)
    pipe = QwenImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(
            base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, shift_terminal=0.02,
            use_dynamic_shifting=True, time_shift_type="exponential"),
        text_encoder=text_encoder, tokenizer=qwen_vl_tokenizer(seed),
    )  # fmt: skip
    built_s = time.perf_counter() - start
    pipe.save_pretrained(out, safe_serialization=True)

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    return {
        "out": str(out), "dtype": dtype, "device": device, "text_layers": text_layers,
        "transformer_params": count(transformer), "vae_params": count(vae),
        "text_encoder_params": count(text_encoder), "build_s": round(built_s, 1),
        "total_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu", help="where to initialise the weights")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--text-layers", type=int, default=28, help="text encoder layers (real: 28)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(build(a.out, a.device, a.dtype, a.text_layers, a.seed)))


if __name__ == "__main__":
    main()
