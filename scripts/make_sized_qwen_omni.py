"""Write a Qwen2.5-Omni-3B-sized checkpoint with random weights (for GPU timing), in the real format.

Same on-disk format as the tiny builder (omni_actors/models/tiny/qwen2_5_omni.py:
one config.json with thinker/talker/token2wav parts, safetensors, the offline
Qwen tokenizer at real vocabulary size, processor files, spk_dict.pt), but with
model dimensions like Qwen2.5-Omni-3B:

    thinker text   hidden 2048, 36 layers, 16 heads / 2 KV heads, head_dim 128,
                   MLP 11008, vocab 151936, mrope [16, 24, 24]
    audio encoder  Whisper-large-sized: d_model 1280, 32 layers, 20 heads, FFN 5120
    vision encoder 32 layers, width 1280, MLP 3420, 16 heads
    talker         hidden 896, embedding 2048, 24 layers, 14 heads / 2 KV heads,
                   head_dim 64, MLP 4864, codec vocab 8448
    token2wav      transformers' defaults (the released model's): DiT 1024 x 22
                   layers, BigVGAN 1536 initial channels, upsample 5*3*2*2*2*2

`--model qwen3_omni_moe` writes a Qwen3-Omni-30B-A3B-wide checkpoint instead
(real widths, from memory of the released config, not checked against it):

    thinker text   hidden 2048, 48 layers, 32 heads / 4 KV heads, head_dim 128,
                   MoE 128 experts x 768, 8 per token, vocab 152064
    audio encoder  d_model 1280, 32 layers, 20 heads, FFN 5120
    vision encoder 27 layers, width 1152, MLP 4304, 16 heads
    talker         hidden 1024, 20 layers, 16 heads / 2 KV heads, head_dim 128,
                   MoE 128 experts x 384 (+ shared 768), 6 per token, codec vocab 3072
    code predictor hidden 1024, 5 layers, 16 heads / 8 KV heads, 16 code groups
    code2wav       hidden 1024, 8 layers, decoder 1536

`--layers-scale` divides every layer count (for a quick CPU smoke run, or a
reduced-layer real-width model; the code predictor keeps its 5 layers).
Weights are initialised on --device and saved in --dtype. Prints one JSON line.

    python scripts/make_sized_qwen_omni.py OUT_DIR --device cuda --dtype bfloat16
    python scripts/make_sized_qwen_omni.py OUT_DIR --model qwen3_omni_moe --layers-scale 4 --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REF_MEL_FRAMES = 300
"""Length of each speaker's reference mel (frames of 80 bins)."""


def sized_config(scale: int = 1):
    from transformers import Qwen2_5OmniConfig

    from omni_actors.models.tiny.qwen2_5_omni import THINKER_TOKEN_IDS, _mrope

    def n(layers: int) -> int:
        return max(1, layers // scale)

    hidden = 2048
    text = {
        "vocab_size": 151936, "hidden_size": hidden, "intermediate_size": 11008,
        "num_hidden_layers": n(36), "num_attention_heads": 16, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rope_parameters": _mrope(128),
        "tie_word_embeddings": False, "max_window_layers": n(36), "rms_norm_eps": 1e-6,
    }  # fmt: skip
    thinker = {
        "text_config": text,
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": n(32), "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120, "d_model": 1280, "output_dim": hidden, "n_window": 100,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": n(32), "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "out_hidden_size": hidden, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112,
            "fullatt_block_indexes": [i for i in (7, 15, 23, 31) if i < n(32)] or [0],
            "in_channels": 3,
        },
        **THINKER_TOKEN_IDS,
    }  # fmt: skip
    talker = {
        "vocab_size": 8448, "embedding_size": hidden, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": n(24), "num_attention_heads": 14,
        "num_key_value_heads": 2, "head_dim": 64, "rope_parameters": _mrope(64),
        "max_window_layers": n(24), "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    }  # fmt: skip
    config = Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, enable_audio_output=True
    )
    if scale > 1:
        dit = config.token2wav_config.dit_config
        dit.num_hidden_layers = n(dit.num_hidden_layers)
        dit.look_ahead_layers = [min(i, dit.num_hidden_layers - 1) for i in dit.look_ahead_layers]
        dit.look_backward_layers = [
            min(i, dit.num_hidden_layers - 1) for i in dit.look_backward_layers
        ]
    return config


def sized_config_qwen3(scale: int = 1):
    from omni_actors.models.tiny.qwen3_omni_moe import tiny_config

    def n(layers: int) -> int:
        return max(1, layers // scale)

    config = tiny_config()
    rope = config.thinker_config.text_config.rope_parameters
    text = config.thinker_config.text_config
    for key, value in {
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": n(48),
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "rope_parameters": {**rope, "mrope_section": [24, 20, 20]},
    }.items():  # fmt: skip
        setattr(text, key, value)
    text.layer_types = ["full_attention"] * text.num_hidden_layers
    audio = config.thinker_config.audio_config
    for key, value in {
        "encoder_layers": n(32), "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
        "d_model": 1280, "output_dim": 2048, "downsample_hidden_size": 480,
    }.items():  # fmt: skip
        setattr(audio, key, value)
    vision = config.thinker_config.vision_config
    depth = n(27)
    for key, value in {
        "depth": depth, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "out_hidden_size": 2048,
        "deepstack_visual_indexes": sorted({min(i // scale, depth - 1) for i in (8, 16, 24)}),
    }.items():  # fmt: skip
        setattr(vision, key, value)
    talker = config.talker_config
    ttext = talker.text_config
    for key, value in {
        "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": n(20),
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
        "moe_intermediate_size": 384, "shared_expert_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 6,
        "rope_parameters": {**rope, "mrope_section": [24, 20, 20]},
    }.items():  # fmt: skip
        setattr(ttext, key, value)
    ttext.layer_types = ["full_attention"] * ttext.num_hidden_layers
    pred = talker.code_predictor_config
    for key, value in {
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    }.items():  # fmt: skip
        setattr(pred, key, value)
    pred.layer_types = ["full_attention"] * pred.num_hidden_layers
    talker.thinker_hidden_size = 2048
    talker.accept_hidden_layer = n(24)
    wav = config.code2wav_config
    for key, value in {
        "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
        "num_hidden_layers": n(8), "intermediate_size": 3072, "decoder_dim": 1536,
    }.items():  # fmt: skip
        setattr(wav, key, value)
    return config


def build(out: Path, device: str, dtype: str, seed: int, scale: int, model: str) -> dict:
    """Build the sized `model` on `device`, save it in the real format, and report its sizes."""
    import torch
    from transformers import (
        Qwen2_5OmniForConditionalGeneration,
        Qwen3OmniMoeForConditionalGeneration,
    )

    from omni_actors.models.tiny import qwen2_5_omni, qwen3_omni_moe

    qwen3 = model == "qwen3_omni_moe"
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = sized_config_qwen3(scale) if qwen3 else sized_config(scale)
    cls = Qwen3OmniMoeForConditionalGeneration if qwen3 else Qwen2_5OmniForConditionalGeneration
    with torch.device(device):
        # Built straight in `dtype`: a full-depth 30B-A3B in float32 would not fit one GPU.
        net = cls._from_config(config, dtype=getattr(torch, dtype)).eval()
        if qwen3:
            with torch.no_grad():  # transformers leaves fused expert tensors uninitialised
                for name, param in net.named_parameters():
                    if ".experts." in name:
                        param.normal_(0.0, 0.02)
    net.to(getattr(torch, dtype))
    built = time.perf_counter() - t0

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    params = {
        "thinker_text": count(net.thinker.model) + count(net.thinker.lm_head),
        "thinker_audio": count(net.thinker.audio_tower),
        "thinker_vision": count(net.thinker.visual),
        "talker": count(net.talker),
    }
    if qwen3:
        params["code2wav"] = count(net.code2wav)
    else:
        params["token2wav"] = count(net.token2wav)
    net.save_pretrained(out, safe_serialization=True)
    del net
    if qwen3:
        qwen3_omni_moe.write_side_files(out, seed)
    else:
        qwen2_5_omni.write_side_files(out, config, seed, ref_mel_frames=REF_MEL_FRAMES)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {
        "out": str(out),
        "dtype": dtype,
        "layers_scale": scale,
        "params": params,
        "params_total": sum(params.values()),
        "weights_gb": round(size / 1e9, 2),
        "build_s": round(built, 2),
        "total_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu", help="where to initialise the weights")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers-scale", type=int, default=1)
    ap.add_argument("--model", choices=("qwen2_5_omni", "qwen3_omni_moe"), default="qwen2_5_omni")
    args = ap.parse_args()
    res = build(args.out, args.device, args.dtype, args.seed, args.layers_scale, args.model)
    made = {
        "qwen3_omni_moe": "qwen3_omni_moe-30b-a3b-wide",
        "qwen2_5_omni": "qwen2_5_omni-3b-sized",
    }
    print(json.dumps({"made": made[args.model], **res}))


if __name__ == "__main__":
    main()
