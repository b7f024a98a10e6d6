"""A tiny random-weight MoshiForConditionalGeneration checkpoint in real Hugging Face format, built offline.

`config.json` (model_type "moshi", with its Mimi `audio_encoder_config` and
`depth_decoder_config`), `model.safetensors`, `generation_config.json` and a
fast tokenizer. Mimi keeps its real frame layout (24 kHz, 12.5 Hz frames of
1920 samples: upsampling ratios 8, 6, 5, 4 and a 2x downsample) with a few
channels; the temporal and depth transformers are two and one layers wide.
`make_sized_moshi` builds the same architecture at any size (random weights),
e.g. Moshi-7B's for benchmarks: `python -m omni_actors.models.tiny.moshi DIR --size 7b`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 16, "ffn_dim": 64, "num_codebooks": 4,
    "depth": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "ffn_dim": 32},
    "mimi": {"hidden_size": 16, "num_filters": 4, "codebook_size": 64, "codebook_dim": 8, "num_quantizers": 8,
             "vector_quantization_hidden_dimension": 8, "upsample_groups": 16, "num_hidden_layers": 1,
             "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8},
}
MOSHI_7B = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 128, "ffn_dim": 22528, "num_codebooks": 8, "vocab_size": 32000,
    "depth": {"hidden_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 16, "ffn_dim": 5632},
    "mimi": {},  # transformers' MimiConfig defaults are Mimi's real sizes
}
SIZES = {"tiny": TINY, "7b": MOSHI_7B}
LM_INIT_STD = 0.5


def _config(size: dict[str, Any], text_vocab: int):
    from transformers import MimiConfig, MoshiConfig

    mimi = MimiConfig(upsampling_ratios=[8, 6, 5, 4], **size["mimi"]).to_dict()
    k = size["num_codebooks"]
    depth = {**size["depth"], "num_key_value_heads": size["depth"]["num_attention_heads"],
             "max_position_embeddings": k + 1, "sliding_window": k}
    return MoshiConfig(
        vocab_size=size.get("vocab_size", text_vocab), hidden_size=size["hidden_size"],
        num_hidden_layers=size["num_hidden_layers"], num_attention_heads=size["num_attention_heads"],
        num_key_value_heads=size["num_key_value_heads"], head_dim=size["head_dim"], ffn_dim=size["ffn_dim"],
        num_codebooks=k, max_position_embeddings=3000, sliding_window=3000,
        audio_encoder_config=mimi, depth_decoder_config=depth, dtype="float32",
    )  # fmt: skip


def _random_codebooks(mimi) -> None:
    """Spread Mimi's codebooks (transformers initialises them all to zero: every frame would be code 0)."""
    import torch
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    with torch.no_grad():
        for module in mimi.modules():
            if isinstance(module, MimiEuclideanCodebook):
                module.embed_sum.normal_(0.0, 1.0)
                module._embed = None


def make_sized_moshi(out_dir: str | Path, size: str = "tiny", seed: int = 0, dtype: str = "float32") -> Path:
    """Write a random-weight Moshi checkpoint of `size` ("tiny" or "7b") into `out_dir`."""
    import torch
    from transformers import GenerationConfig, MoshiForConditionalGeneration

    from omni_actors.models.tiny.llama import _build_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(out)
    config = _config(SIZES[size], (len(tokenizer) + 63) // 64 * 64)
    config.dtype = dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if size == "tiny":
            model = MoshiForConditionalGeneration(config)
            # Peakier than the default init, so the random LM's tokens follow its input (the user's
            # audio) and the seed rather than being near-uniform draws. Mimi keeps its init.
            with torch.no_grad():
                for part in (model.embed_tokens, model.decoder, model.depth_decoder):
                    for p in part.parameters():
                        if p.dim() > 1:
                            p.normal_(0.0, LM_INIT_STD)
                _random_codebooks(model.audio_encoder)
        else:  # build on the meta device, then fill in the target dtype: no fp32 7B copy in memory
            with torch.device("meta"):
                model = MoshiForConditionalGeneration(config)
            model = model.to_empty(device="cpu").to(getattr(torch, dtype))
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0.0, 0.02)
            _random_codebooks(model.audio_encoder)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig().save_pretrained(out)
    return out


def make_tiny_moshi(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tiny Moshi checkpoint into `out_dir` and return its path."""
    return make_sized_moshi(out_dir, "tiny", seed)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    print(make_sized_moshi(args.out_dir, args.size, dtype=args.dtype))
