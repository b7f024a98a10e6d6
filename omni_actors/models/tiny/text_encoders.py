"""Tiny text encoders that several diffusers builders share: the T5 / UMT5 encoder, the ByT5 glyph encoder, Qwen3.

One config each, so that two families meant to carry the same encoder cannot
drift apart. Builders call these inside their seeded block (the weights are
drawn in the order the caller builds its parts). Imported by the builders only
(transformers is imported lazily).
"""

from __future__ import annotations

from typing import Any

QWEN3_TEXT_HIDDEN = 16
"""Width of the tiny Qwen3 text encoders (Z-Image's cap_feat_dim; FLUX.2 [klein] stacks three layers of it)."""


def t5_fields(tokenizer: Any, d_model: int = 32) -> dict[str, Any]:
    """The tiny T5 text encoder's config fields, sized to `tokenizer` (T5Config and UMT5Config take the same)."""
    return {
        "vocab_size": len(tokenizer), "d_model": d_model, "d_kv": 8, "d_ff": 37, "num_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 8, "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id, "decoder_start_token_id": tokenizer.pad_token_id,
    }  # fmt: skip


def t5_encoder(tokenizer: Any) -> Any:
    """A tiny T5EncoderModel over `tokenizer` (Stable Audio's text encoder, HunyuanVideo-1.5's ByT5 one)."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**t5_fields(tokenizer)))


def byt5_glyph_encoder() -> Any:
    """The tiny ByT5 glyph encoder (T5EncoderModel over ByT5Tokenizer's 384 ids) of GLM-Image and HunyuanImage."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        d_model=32, d_kv=8, d_ff=32, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=32, vocab_size=384, feed_forward_proj="gated-gelu",
        dense_act_fn="gelu_new", is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False,
    ))  # fmt: skip


def qwen3_config(num_layers: int, **extra: Any) -> Any:
    """A tiny Qwen3Config (Qwen's real vocabulary size, QWEN3_TEXT_HIDDEN wide) of `num_layers`, `extra` fields added."""
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=QWEN3_TEXT_HIDDEN, intermediate_size=32, num_hidden_layers=num_layers, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=151936, max_position_embeddings=4096, **extra,
    )  # fmt: skip
