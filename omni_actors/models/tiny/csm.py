"""Tiny random-weight CSM checkpoints (backbone + depth decoder + Mimi codec) in the real on-disk format.

`make_tiny_csm` writes what `CsmForConditionalGeneration.from_pretrained` and
`AutoProcessor.from_pretrained` read from sesame/csm-1b: `config.json` (model_type
"csm" with `depth_decoder_config` and a Mimi `codec_config`), `model.safetensors`
(backbone, depth decoder and `codec_model.*` weights in one state dict),
`generation_config.json`, a fast tokenizer with CSM's special tokens
(`<|begin_of_text|>`, `<|end_of_text|>`, `<|AUDIO|>`, `<|audio_eos|>`; bos/eos added
around every text as Llama 3's post-processor does) and the processor files
(`preprocessor_config.json`, chat template). The vocabulary is small, so token ids
differ from the real 128k table; the config names them, as the real one does.

`make_csm_1b_sized` writes the same layout at CSM-1B's real sizes (random weights,
~1.6 B parameters with the codec): for GPU benchmarks, never built by tests.

The Mimi codec keeps the real frame rate (12.5 Hz at 24 kHz: 1920 samples a frame)
with narrow layers, so tiny audio has the real sample rate and timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import build_device, byte_bpe

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|begin_of_text|>[' + message['role'] + ']' }}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{{ '<|end_of_text|>' }}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' %}{{ '<|AUDIO|><|audio_eos|>' }}{% endif %}"
    "{% endfor %}{% endfor %}"
)
_CORPUS = [
    "[0]Hello from Sesame. [1]How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog. Speech, text and images in.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? : ; ' \" , .",
]
TEXT_VOCAB = 384
TINY_MAX_FRAMES = 20
"""generation_config max_new_tokens of the tiny checkpoint: 20 frames, 1.6 s of audio."""


def _tokenizer(out: Path):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(_CORPUS, TEXT_VOCAB - 8, SPECIALS)
    bos, eos = tok.token_to_id(SPECIALS[0]), tok.token_to_id(SPECIALS[1])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A {SPECIALS[1]}",
        special_tokens=[(SPECIALS[0], bos), (SPECIALS[1], eos)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
        pad_token=SPECIALS[2], unk_token=None, model_max_length=2048,
        extra_special_tokens={"audio_token": SPECIALS[2], "audio_eos_token": SPECIALS[3]},
    )  # fmt: skip
    return fast


def _codec(sizes: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": "mimi", "sampling_rate": 24000, "frame_rate": 12.5,
        "upsampling_ratios": [8, 6, 5, 4], "codebook_size": sizes["codebook_size"],
        "num_quantizers": sizes["codebooks"], "num_semantic_quantizers": 1,
        "codebook_dim": sizes["codec_dim"], "vector_quantization_hidden_dimension": sizes["codec_dim"],
        "hidden_size": sizes["codec_hidden"], "num_filters": sizes["codec_filters"],
        "upsample_groups": sizes["codec_hidden"], "num_hidden_layers": sizes["codec_layers"],
        "intermediate_size": sizes["codec_hidden"] * 4, "num_attention_heads": sizes["codec_heads"],
        "num_key_value_heads": sizes["codec_heads"], "head_dim": sizes["codec_hidden"] // sizes["codec_heads"],
        "sliding_window": 250, "use_cache": False,
    }  # fmt: skip


TINY = {
    "hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128,
    "depth_hidden": 32, "depth_layers": 1, "depth_heads": 2, "depth_intermediate": 64,
    "codebooks": 4, "codebook_size": 64, "codec_dim": 16, "codec_hidden": 32,
    "codec_filters": 4, "codec_layers": 1, "codec_heads": 2, "rope_original": 1024, "depth_rope_original": 4,
}  # fmt: skip
CSM_1B = {
    "hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "intermediate": 8192,
    "depth_hidden": 1024, "depth_layers": 4, "depth_heads": 8, "depth_intermediate": 8192,
    "codebooks": 32, "codebook_size": 2048, "codec_dim": 256, "codec_hidden": 512,
    "codec_filters": 64, "codec_layers": 8, "codec_heads": 8, "rope_original": 8192, "depth_rope_original": 16,
}  # fmt: skip
"""sesame/csm-1b's sizes (config.json of the public checkpoint)."""
CSM_1B_MAX_FRAMES = 125
"""max_new_tokens of the CSM-1B-sized folder: random weights rarely say "end", so each request
makes 10 s of audio, a benchmark's fixed length."""


def _write(out_dir: str | Path, seed: int, sizes: dict[str, Any], max_frames: int, std: float) -> Path:
    import torch
    from transformers import CsmConfig, CsmForConditionalGeneration, CsmProcessor, GenerationConfig
    from transformers.models.encodec import EncodecFeatureExtractor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(out)
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    vocab = sizes["codebook_size"] + 3  # as the real 2051 = 2048 codes + pad and two spares
    s = sizes
    config = CsmConfig(
        num_codebooks=s["codebooks"], vocab_size=vocab, text_vocab_size=max(TEXT_VOCAB, len(tok)),
        hidden_size=s["hidden"], intermediate_size=s["intermediate"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], max_position_embeddings=2048,
        bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|end_of_text|>"],
        pad_token_id=ids["<|AUDIO|>"], audio_token_id=ids["<|AUDIO|>"],
        audio_eos_token_id=ids["<|audio_eos|>"], codebook_pad_token_id=vocab - 1,
        codebook_eos_token_id=0, tie_codebooks_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": s["rope_original"]},
        depth_decoder_config={
            "num_codebooks": s["codebooks"], "backbone_hidden_size": s["hidden"], "vocab_size": vocab,
            "hidden_size": s["depth_hidden"], "intermediate_size": s["depth_intermediate"],
            "num_hidden_layers": s["depth_layers"], "num_attention_heads": s["depth_heads"],
            "num_key_value_heads": max(1, s["depth_heads"] // 4), "max_position_embeddings": s["codebooks"] + 1,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": s["depth_rope_original"]},
        },
        codec_config=_codec(s),
        dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with build_device(sizes is CSM_1B):
            model = CsmForConditionalGeneration(config)
        with torch.no_grad():
            for name, buf in model.named_buffers():  # Mimi's codebooks start all zero
                if name.endswith("codebook.embed_sum"):
                    buf.normal_(0.0, 1.0)
            if std:  # peaked random logits: seed-dependent, varied codes
                for name, p in model.named_parameters():
                    if p.dim() > 1 and not name.startswith("codec_model."):
                        p.normal_(0.0, std)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.9, top_k=50, max_new_tokens=max_frames,
        depth_decoder_do_sample=True, depth_decoder_temperature=0.9, depth_decoder_top_k=50,
    )  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=CHAT_TEMPLATE).save_pretrained(out)
    return out


def make_tiny_csm(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny CSM checkpoint into `out_dir` and return its path."""
    return _write(out_dir, seed, TINY, TINY_MAX_FRAMES, 0.2)


def make_csm_1b_sized(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight checkpoint of CSM-1B's real sizes (benchmarks on a GPU)."""
    return _write(out_dir, seed, CSM_1B, CSM_1B_MAX_FRAMES, 0.0)


if __name__ == "__main__":
    import sys

    print(make_tiny_csm(sys.argv[1] if len(sys.argv) > 1 else "tiny-csm"))
