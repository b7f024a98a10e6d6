"""Tiny random-weight VibeVoice checkpoints (Qwen2 LM, diffusion head, acoustic + semantic tokenizers) in the real format.

`make_tiny_vibevoice` writes what `VibeVoiceForConditionalGeneration.from_pretrained`
and `VibeVoiceProcessor` read from vibevoice/VibeVoice-1.5B-hf: `config.json`
(model_type "vibevoice" with `text_config` (qwen2), `audio_config` (the acoustic
tokenizer), `semantic_model_config` and `diffusion_head_config`), `model.safetensors`,
`generation_config.json` (guidance, diffusion steps, the DPM-Solver scheduler by name,
a frame budget), a Qwen2 fast tokenizer whose `<|vision_start|>` / `<|vision_end|>` /
`<|vision_pad|>` are the audio bos / eos / placeholder ids the config names, and the
acoustic tokenizer's feature extractor (24 kHz, 3200 samples a latent).

The tokenizers keep the real downsampling (7.5 latents a second at 24 kHz) with narrow
layers. Random LM weights would end the audio at once or never; the tiny weights make
the LM pick the audio placeholder (the `lm_head` row of `<|vision_pad|>` reads a large
constant feature the audio-bos embedding and the audio connectors put into the
residual stream), so a request makes audio until its frame budget, and the diffusion
head (its noise from the request's seed) decides what the audio is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_VOCAB - 8, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0], unk_token=None,
        model_max_length=32768,
    )  # fmt: skip


def _tokenizer_config(hidden: int, filters: int, depth: int) -> dict[str, Any]:
    return {
        "hidden_size": hidden, "num_filters": filters, "kernel_size": 7,
        "downsampling_ratios": [2, 2, 4, 5, 5, 8], "depths": [depth] * 7,
    }  # fmt: skip


def make_tiny_vibevoice(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny VibeVoice checkpoint into `out_dir` and return its path."""
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
    hidden, latent = 64, 8
    config = VibeVoiceConfig(
        text_config={
            "model_type": "qwen2", "vocab_size": max(TEXT_VOCAB, len(tok)), "hidden_size": hidden,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        },
        audio_config={"model_type": "vibevoice_acoustic_tokenizer", **_tokenizer_config(latent, 4, 1)},
        semantic_model_config={"model_type": "vibevoice_acoustic_tokenizer_encoder", **_tokenizer_config(16, 4, 1)},
        diffusion_head_config={"hidden_size": hidden, "latent_size": latent, "num_hidden_layers": 2,
                               "intermediate_size": 128},
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
        max_new_tokens=TINY_MAX_FRAMES, guidance_scale=1.3, num_diffusion_steps=10,
        noise_scheduler_class="DPMSolverMultistepScheduler",
        noise_scheduler_config={"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction"},
        bos_token_id=None, eos_token_id=[ids["<|endoftext|>"], ids["<|vision_end|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    VibeVoiceAcousticTokenizerFeatureExtractor(sampling_rate=24000, pad_to_multiple_of=3200).save_pretrained(out)
    return out


if __name__ == "__main__":
    import sys

    print(make_tiny_vibevoice(sys.argv[1] if len(sys.argv) > 1 else "tiny-vibevoice"))
