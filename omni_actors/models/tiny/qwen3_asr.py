"""Tiny random-weight Qwen3-ASR checkpoint (audio encoder + Qwen3 decoder) in the real on-disk format.

`make_tiny_qwen3_asr` writes what `Qwen3ASRForConditionalGeneration.from_pretrained`
and `AutoProcessor.from_pretrained` read: `config.json` (model_type "qwen3_asr", an
audio encoder and a Qwen3 text config), `model.safetensors`, `generation_config.json`,
a Qwen tokenizer with Qwen's base vocabulary size and the speech specials
(`<|audio_start|>`, `<|audio_end|>`, `<|audio_pad|>`, `<asr_text>`), and the processor
files (128-bin log-mel feature extractor at 16 kHz, a chat template with the audio
placeholder). The specials' ids follow the real layout where the config names them
(audio 151676, timestamp 151705); the ids in between are reserved fillers.
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.tiny.common import peak
from omni_actors.models.tiny.qwen2_5_omni import build_qwen_tokenizer

_BASE = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
AUDIO_START, AUDIO_END, AUDIO_PAD, ASR_TEXT = "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>"
TIMESTAMP = "<timestamp>"


def _specials() -> tuple[str, ...]:
    """151643.. : Qwen's base specials, fillers, audio markers at their ids, <asr_text>, timestamp."""
    names = list(_BASE)
    fixed = {151669: AUDIO_START, 151670: AUDIO_END, 151676: AUDIO_PAD, 151704: ASR_TEXT, 151705: TIMESTAMP}
    for i in range(151643 + len(names), 151706):
        names.append(fixed.get(i, f"<|reserved_{i}|>"))
    return tuple(names)


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if not (loop.last and continue_final_message) %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_tiny_qwen3_asr(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen3-ASR checkpoint into `out_dir` and return its path."""
    import torch
    from transformers import GenerationConfig, Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
    from transformers.models.qwen3_asr import Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"audio_token": AUDIO_PAD, "audio_bos_token": AUDIO_START, "audio_eos_token": AUDIO_END}
    tok = build_qwen_tokenizer(_specials(), extra, CHAT_TEMPLATE, seed=seed)
    hidden = 64
    config = Qwen3ASRConfig(
        audio_config={
            "num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
            "d_model": 32, "output_dim": hidden, "downsample_hidden_size": 8, "n_window": 50,
            "n_window_infer": 800, "max_position_embeddings": 13,
        },
        text_config={
            "vocab_size": 151936, "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 4096,
            "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        audio_token_id=tok.convert_tokens_to_ids(AUDIO_PAD), timestamp_token_id=tok.convert_tokens_to_ids(TIMESTAMP),
        pad_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        eos_token_id=[tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")],
        dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ASRForConditionalGeneration(config)
        peak(model, 0.2, skip="audio_tower")
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, max_new_tokens=16, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    Qwen3ASRProcessor(Qwen3ASRFeatureExtractor(), tok, chat_template=CHAT_TEMPLATE).save_pretrained(out)
    return out
