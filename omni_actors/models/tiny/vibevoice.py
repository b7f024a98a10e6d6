"""Tiny random-weight VibeVoice checkpoints (Qwen2 LM, diffusion head, acoustic + semantic tokenizers) in the real format.

`make_tiny_vibevoice` writes what `VibeVoiceForConditionalGeneration.from_pretrained`
and `VibeVoiceProcessor` read from vibevoice/VibeVoice-1.5B-hf: `config.json`
(model_type "vibevoice" with `text_config` (qwen2), `audio_config` (the acoustic
tokenizer), `semantic_model_config` and `diffusion_head_config`), `model.safetensors`,
`generation_config.json` (guidance, diffusion steps, the DPM-Solver scheduler by name,
a frame budget), a small Qwen2-style fast tokenizer whose `<|vision_start|>` / `<|vision_end|>` /
`<|vision_pad|>` are the audio bos / eos / placeholder ids the config names, and the
acoustic tokenizer's feature extractor (24 kHz, 3200 samples a latent).

The tokenizers keep the real downsampling (7.5 latents a second at 24 kHz) with narrow
layers. Random LM weights would end the audio at once or never; the tiny weights make
the LM pick the audio placeholder (the `lm_head` row of `<|vision_pad|>` reads a large
constant feature the audio-bos embedding and the audio connectors put into the
residual stream), so a request makes audio until its frame budget, and the diffusion
head (its noise from the request's seed) decides what the audio is.

`make_vibevoice_1_5b_sized` writes VibeVoice-1.5B's sizes with the same steering (random
weights, GPU benchmarks only; the tokenizer stays small, its ids below the real vocabulary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import byte_bpe

SPECIALS = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]
_CORPUS = [
    " Transform the text provided by various speakers into speech output, utilizing the distinct "
    "voice of each respective speaker.\n Voice input:\n Speaker 0: Text input:\n Speech output:\n",
    "Hello there, how are you today? I am fine, thank you. The quick brown fox jumps over the lazy dog.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? : ; ' \" , .",
]
TEXT_VOCAB = 512
TINY_MAX_FRAMES = 6
"""Latents (7.5 a second) a tiny request makes: 0.8 s of audio."""
CONSTANT = 8.0
"""Size of the constant feature (hidden dim 0) that steers the tiny LM to the audio placeholder."""


def _tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(_CORPUS, TEXT_VOCAB - 8, SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0], unk_token=None,
        model_max_length=32768,
    )  # fmt: skip


TINY = {
    "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": TEXT_VOCAB,
    "latent": 8, "acoustic_filters": 4, "acoustic_depth": [1] * 7, "semantic": 16, "semantic_filters": 4,
    "semantic_depth": [1] * 7, "head_layers": 2, "head_intermediate": 128,
}  # fmt: skip
VIBEVOICE_1_5B = {
    "hidden": 1536, "layers": 28, "heads": 12, "kv_heads": 2, "intermediate": 8960, "vocab": 151936,
    "latent": 64, "acoustic_filters": 32, "acoustic_depth": [3, 3, 3, 3, 3, 3, 8], "semantic": 128,
    "semantic_filters": 32, "semantic_depth": [3, 3, 3, 3, 3, 3, 8], "head_layers": 4, "head_intermediate": 4608,
}  # fmt: skip
"""VibeVoice-1.5B's sizes (Qwen2.5-1.5B LM, 64-dim acoustic and 128-dim semantic tokenizers, 4-layer head).
The LM head stays untied from the embeddings (the steering needs its own row), so the folder has 2.94 B
parameters where the real one has 2.70 B; per-step compute is the same."""
SIZED_MAX_FRAMES = 75
"""Latents (10 s) a request of the sized folder makes."""


def _tokenizer_config(hidden: int, filters: int, depths: list[int]) -> dict[str, Any]:
    return {
        "hidden_size": hidden, "num_filters": filters, "kernel_size": 7,
        "downsampling_ratios": [2, 2, 4, 5, 5, 8], "depths": depths,
    }  # fmt: skip


def _write(out_dir: str | Path, seed: int, s: dict[str, Any], max_frames: int) -> Path:
    import torch
    from transformers import (
        GenerationConfig,
        VibeVoiceAcousticTokenizerFeatureExtractor,
        VibeVoiceConfig,
        VibeVoiceForConditionalGeneration,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    config = VibeVoiceConfig(
        text_config={
            "model_type": "qwen2", "vocab_size": max(s["vocab"], len(tok)), "hidden_size": s["hidden"],
            "intermediate_size": s["intermediate"], "num_hidden_layers": s["layers"],
            "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
            "max_position_embeddings": 65536, "tie_word_embeddings": False,
        },
        audio_config={"model_type": "vibevoice_acoustic_tokenizer",
                      **_tokenizer_config(s["latent"], s["acoustic_filters"], s["acoustic_depth"])},
        semantic_model_config={"model_type": "vibevoice_acoustic_tokenizer_encoder",
                               **_tokenizer_config(s["semantic"], s["semantic_filters"], s["semantic_depth"])},
        diffusion_head_config={"hidden_size": s["hidden"], "latent_size": s["latent"],
                               "num_hidden_layers": s["head_layers"], "intermediate_size": s["head_intermediate"]},
        pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        audio_bos_token_id=ids["<|vision_start|>"], audio_eos_token_id=ids["<|vision_end|>"],
        audio_token_id=ids["<|vision_pad|>"], dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VibeVoiceForConditionalGeneration(config)
        with torch.no_grad():  # see the module docstring: a constant feature picks the audio placeholder
            m = model.model
            m.language_model.embed_tokens.weight[ids["<|vision_start|>"], 0] = CONSTANT
            m.multi_modal_projector.linear_2.bias[0] = CONSTANT
            m.semantic_connector.linear_2.bias[0] = 0.0
            model.lm_head.weight[ids["<|vision_pad|>"]] = 0.0
            model.lm_head.weight[ids["<|vision_pad|>"], 0] = 1.0
            for p in m.diffusion_head.parameters():  # a head whose output varies with its noise
                if p.dim() > 1:
                    p.normal_(0.0, p.shape[1] ** -0.5)
            for part in (m.audio_tower.decoder, m.semantic_tokenizer_encoder):
                for p in part.parameters():
                    if p.dim() > 1:
                        p.normal_(0.0, 0.7 * p[0].numel() ** -0.5)
    model.generation_config = GenerationConfig(
        max_new_tokens=max_frames, guidance_scale=1.3, num_diffusion_steps=10,
        noise_scheduler_class="DPMSolverMultistepScheduler",
        noise_scheduler_config={"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction"},
        bos_token_id=None, eos_token_id=[ids["<|endoftext|>"], ids["<|vision_end|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    VibeVoiceAcousticTokenizerFeatureExtractor(sampling_rate=24000, pad_to_multiple_of=3200).save_pretrained(out)
    return out


def make_tiny_vibevoice(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny VibeVoice checkpoint into `out_dir` and return its path."""
    return _write(out_dir, seed, TINY, TINY_MAX_FRAMES)


def make_vibevoice_1_5b_sized(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight checkpoint of VibeVoice-1.5B's sizes (benchmarks on a GPU)."""
    return _write(out_dir, seed, VIBEVOICE_1_5B, SIZED_MAX_FRAMES)


if __name__ == "__main__":
    import sys

    print(make_tiny_vibevoice(sys.argv[1] if len(sys.argv) > 1 else "tiny-vibevoice"))
