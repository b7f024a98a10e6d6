"""Tiny random-weight Voxtral Realtime checkpoint (streaming ASR) in the real on-disk format.

`make_tiny_voxtral_realtime` writes what `VoxtralRealtimeForConditionalGeneration.from_pretrained`
and `VoxtralRealtimeProcessor.from_pretrained` read: `config.json` (model_type
"voxtral_realtime": a causal Whisper-style audio encoder, a Mistral decoder with
ada-RMS-norm delay conditioning), `model.safetensors`, `generation_config.json`,
the log-mel feature extractor's `preprocessor_config.json`, and a Tekken
`tekken.json` (mistral-common's tokenizer file) whose `audio` section is the real
model's streaming layout: 16 kHz, 12.5 tokens a second (80 ms a token), 128 mel
bins, hop 160, window 400, 480 ms transcription delay (6 tokens), 32 left-pad
tokens. The tiny vocabulary is every special token mistral-common names (in its
order, so [STREAMING_PAD] and [STREAMING_WORD] exist) padded to 64, then the 256
single bytes: any text is encodable, with no merges.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from omni_actors.models.tiny.common import peak

NUM_SPECIAL = 64
"""Special-token ranks of the tiny Tekken vocabulary (the real one reserves 1000)."""
AUDIO = {
    "sampling_rate": 16000, "frame_rate": 12.5,
    "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400},
    "transcription_format": "streaming", "transcription_delay_ms": 480,
    "streaming_look_ahead_ms": 2.5, "streaming_look_back_ms": 52.5, "streaming_n_left_pad_tokens": 32,
}  # fmt: skip


def tekken_json() -> dict:
    """A Tekken tokenizer file (version v13) with the realtime audio section."""
    from mistral_common.tokens.tokenizers.base import SpecialTokens

    names = [t.value for t in SpecialTokens]
    names += [f"<SPECIAL_{i}>" for i in range(len(names), NUM_SPECIAL)]
    specials = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(names)]
    vocab = [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": chr(b) if 32 <= b < 127
              else None} for b in range(256)]  # fmt: skip
    pattern = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    config = {"pattern": pattern, "num_vocab_tokens": len(vocab), "default_vocab_size": NUM_SPECIAL + len(vocab),
              "default_num_special_tokens": NUM_SPECIAL, "version": "v13"}
    return {"config": config, "vocab": vocab, "special_tokens": specials, "audio": dict(AUDIO)}


def make_tiny_voxtral_realtime(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Voxtral Realtime checkpoint into `out_dir` and return its path."""
    import torch
    from transformers import (
        GenerationConfig,
        VoxtralRealtimeConfig,
        VoxtralRealtimeForConditionalGeneration,
    )
    from transformers.models.voxtral_realtime import VoxtralRealtimeFeatureExtractor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tekken = tekken_json()
    (out / "tekken.json").write_text(json.dumps(tekken))
    vocab = tekken["config"]["default_vocab_size"]
    config = VoxtralRealtimeConfig(
        audio_config={
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "head_dim": 16, "num_mel_bins": AUDIO["audio_encoding_config"]["num_mel_bins"], "sliding_window": 750,
            "max_position_embeddings": 1500, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        text_config={
            "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 8192,
            "sliding_window": 8192, "bos_token_id": 1, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        audio_length_per_tok=8, default_num_delay_tokens=6, downsample_factor=4, dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VoxtralRealtimeForConditionalGeneration(config)
        peak(model, 0.2, skip="audio_tower")
        with torch.no_grad():
            # the output head is the (tied) embedding: shrink the rows of tokens that make no readable
            # text (control specials, bytes outside printable ASCII) so the transcripts are plain text
            rows = model.get_input_embeddings().weight
            keep = {_rank(tekken, "[STREAMING_PAD]"), _rank(tekken, "[STREAMING_WORD]")}
            keep |= {NUM_SPECIAL + b for b in range(32, 127)}
            rows[[i for i in range(vocab) if i not in keep]] *= 0.05
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=_rank(tekken, "<pad>"), do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    VoxtralRealtimeFeatureExtractor(feature_size=AUDIO["audio_encoding_config"]["num_mel_bins"]).save_pretrained(out)
    return out


def _rank(tekken: dict, name: str) -> int:
    return next(t["rank"] for t in tekken["special_tokens"] if t["token_str"] == name)
