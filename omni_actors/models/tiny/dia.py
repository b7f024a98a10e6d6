"""Tiny random-weight Dia checkpoints (text encoder + audio decoder, DAC codec) in the real on-disk format.

`make_tiny_dia` writes what `DiaForConditionalGeneration.from_pretrained` and
`DiaProcessor` read from nari-labs/Dia-1.6B-0626: `config.json` (model_type "dia"
with `encoder_config`, `decoder_config` and the `delay_pattern`), `model.safetensors`,
`generation_config.json` (classifier-free guidance, temperature, top-k/top-p as the
real one), the byte-level `DiaTokenizer` files (`[S1]`/`[S2]` at ids 1 and 2), the
`DiaFeatureExtractor` and `processor_config.json`. The real processor names its
codec by hub id ("descript/dac_44khz"); here the DAC folder is written beside the
weights in `dac/` and `processor_config.json` names that folder (models/dia/loading.py
resolves either).

The DAC keeps the real 44.1 kHz rate and hop of 512 samples (86 frames a second) with
narrow layers, and the decoder keeps 9 channels of 1024 codes with Dia's real delay
pattern, so tiny audio has the real sample rate and timing.

`make_dia_1_6b_sized` writes Dia-1.6B's sizes (random weights, GPU benchmarks only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DELAY_PATTERN = [0, 8, 9, 10, 11, 12, 13, 14, 15]
TINY = {
    "enc_hidden": 32, "enc_layers": 1, "enc_heads": 2, "enc_head_dim": 16, "enc_intermediate": 64,
    "dec_hidden": 64, "dec_layers": 2, "dec_heads": 4, "dec_kv_heads": 2, "dec_head_dim": 16,
    "dec_intermediate": 128, "cross_heads": 2, "cross_head_dim": 16,
    "dac_encoder": 8, "dac_decoder": 64, "dac_codebook_dim": 4,
}  # fmt: skip
DIA_1_6B = {
    "enc_hidden": 1024, "enc_layers": 12, "enc_heads": 16, "enc_head_dim": 128, "enc_intermediate": 4096,
    "dec_hidden": 2048, "dec_layers": 18, "dec_heads": 16, "dec_kv_heads": 4, "dec_head_dim": 128,
    "dec_intermediate": 8192, "cross_heads": 16, "cross_head_dim": 128,
    "dac_encoder": 64, "dac_decoder": 1536, "dac_codebook_dim": 8,
}  # fmt: skip
"""nari-labs/Dia-1.6B's sizes (its config.json) and descript/dac_44khz's."""
TINY_MAX_FRAMES = 64
"""Frames the tiny checkpoint makes at most (generation_config max_length): 0.73 s of audio."""
SIZED_MAX_FRAMES = 860
"""Frames (10 s) a request of the sized folder makes: random weights rarely say "end"."""


def _dac(sizes: dict[str, Any]):
    from transformers import DacConfig, DacModel

    config = DacConfig(
        encoder_hidden_size=sizes["dac_encoder"], downsampling_ratios=[2, 4, 8, 8],
        decoder_hidden_size=sizes["dac_decoder"], n_codebooks=9, codebook_size=1024,
        codebook_dim=sizes["dac_codebook_dim"], sampling_rate=44100,
    )  # fmt: skip
    return DacModel(config)


def _write(out_dir: str | Path, seed: int, sizes: dict[str, Any], max_frames: int, std: float) -> Path:
    import torch
    from transformers import (
        DiaConfig,
        DiaFeatureExtractor,
        DiaForConditionalGeneration,
        DiaTokenizer,
        GenerationConfig,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = sizes
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    config = DiaConfig(
        encoder_config={
            "hidden_size": s["enc_hidden"], "num_hidden_layers": s["enc_layers"],
            "num_attention_heads": s["enc_heads"], "num_key_value_heads": s["enc_heads"],
            "head_dim": s["enc_head_dim"], "intermediate_size": s["enc_intermediate"],
            "vocab_size": 256, "max_position_embeddings": 1024, "rope_parameters": rope,
        },
        decoder_config={
            "hidden_size": s["dec_hidden"], "num_hidden_layers": s["dec_layers"],
            "num_attention_heads": s["dec_heads"], "num_key_value_heads": s["dec_kv_heads"],
            "head_dim": s["dec_head_dim"], "intermediate_size": s["dec_intermediate"],
            "cross_num_attention_heads": s["cross_heads"], "cross_num_key_value_heads": s["cross_heads"],
            "cross_head_dim": s["cross_head_dim"], "cross_hidden_size": s["enc_hidden"],
            "vocab_size": 1028, "num_channels": len(DELAY_PATTERN), "max_position_embeddings": 3072,
            "rope_parameters": rope, "eos_token_id": 1024, "pad_token_id": 1025, "bos_token_id": 1026,
        },
        delay_pattern=DELAY_PATTERN,
        dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DiaForConditionalGeneration(config)
        dac = _dac(s)
        with torch.no_grad():
            for name, p in dac.named_parameters():  # the default init is too small for the audio to
                if name.endswith("codebook.weight"):  # depend on the codes: unit codebooks, fan-in scaled
                    p.normal_(0.0, 1.0)
                elif p.dim() > 1:  # 0.7: audio that varies with the codes and stays inside [-1, 1]
                    p.normal_(0.0, 0.7 * p[0].numel() ** -0.5)
            if std:  # peaked random logits: seed-dependent, varied codes
                for p in model.parameters():
                    if p.dim() > 1:
                        p.normal_(0.0, std)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=1.8, top_k=50, top_p=0.9, guidance_scale=3.0,
        max_length=max_frames, bos_token_id=1026, eos_token_id=1024, pad_token_id=1025,
    )  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    dac.save_pretrained(out / "dac", safe_serialization=True)
    DiaTokenizer().save_pretrained(out)
    fe = DiaFeatureExtractor(feature_size=1, sampling_rate=44100, padding_value=0.0, hop_length=512)
    fe.save_pretrained(out)
    processor = {
        "processor_class": "DiaProcessor",
        "audio_tokenizer": {"audio_tokenizer_class": "DacModel", "audio_tokenizer_name_or_path": "dac"},
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return out


def make_tiny_dia(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Dia checkpoint (and its DAC in `dac/`) into `out_dir`; return the folder."""
    return _write(out_dir, seed, TINY, TINY_MAX_FRAMES, 0.3)


def make_dia_1_6b_sized(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight checkpoint of Dia-1.6B's real sizes (benchmarks on a GPU)."""
    return _write(out_dir, seed, DIA_1_6B, SIZED_MAX_FRAMES, 0.0)


if __name__ == "__main__":
    import sys

    print(make_tiny_dia(sys.argv[1] if len(sys.argv) > 1 else "tiny-dia"))
