"""Tiny random-weight Qwen2.5-Omni checkpoint (thinker, talker, token2wav) in the real on-disk format.

Also home of the offline Qwen tokenizer builder that both Qwen-Omni builders use:
a byte-level BPE trained in milliseconds on a few sentences, padded with
pseudo-words to Qwen's real base vocabulary (151,643 entries) so that the
special tokens sit at their real ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN_BASE_VOCAB = 151643
"""Size of Qwen's byte-level BPE vocabulary; special tokens start at this id."""

QWEN2_5_OMNI_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
"""Qwen2.5-Omni's added tokens, in id order from 151643."""

QWEN2_5_OMNI_EXTRA = {
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
}  # fmt: skip

THINKER_TOKEN_IDS = {
    "audio_token_index": 151646, "image_token_index": 151655, "video_token_index": 151656,
    "audio_start_token_id": 151647, "audio_end_token_id": 151648,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "user_token_id": 872, "bos_token_id": 151644, "eos_token_id": 151645, "pad_token_id": 151643,
}  # fmt: skip
"""A Qwen2.5-Omni thinker config's special token ids, matching the tokenizer above."""

_CORPUS = (
    "Hello! How can I help you today? I am a small model made for tests.",
    "The quick brown fox jumps over the lazy dog. Speech, text and images in; text and speech out.",
    "What is in this picture? Please describe the sound you hear, and answer in one sentence.",
    "Numbers 0 1 2 3 4 5 6 7 8 9, punctuation .,;:!?'\"()[]{} and new\nlines.",
    "You are Qwen, a virtual human developed by the Qwen Team, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech.",
    *(["<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"] * 50),
)

QWEN_FIXED_IDS = {"Ċ": 198, "user": 872, "system": 8948, "assistant": 77091}
"""Base-vocabulary tokens whose real ids the models' code relies on (role markers, newline)."""

# A ChatML template that places audio/image/video markers the way Qwen-Omni's own does.
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' or 'image' in part %}{{ IMAGE_MARK }}"
    "{% elif part['type'] == 'audio' or 'audio' in part %}{{ AUDIO_MARK }}"
    "{% elif part['type'] == 'video' or 'video' in part %}{{ VIDEO_MARK }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_template(image: str, audio: str, video: str) -> str:
    """The ChatML template with this model's multimodal placeholder strings."""
    return (
        _CHAT_TEMPLATE.replace("IMAGE_MARK", repr(image))
        .replace("AUDIO_MARK", repr(audio))
        .replace("VIDEO_MARK", repr(video))
    )


def _filler_words(count: int, seed: int) -> list[str]:
    """Deterministic pseudo-words in the byte-level alphabet ("Ġ" is a leading space)."""
    import random

    rng = random.Random(seed)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        n = rng.randint(1, 4)
        word = "".join(rng.choice(cons) + rng.choice(vows) for _ in range(n))
        if rng.random() < 0.3:
            word += rng.choice(cons)
        word = "Ġ" + word if rng.random() < 0.8 else word
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def build_qwen_tokenizer(
    specials: tuple[str, ...], extra: dict[str, str], template: str, seed: int = 0
):
    """A Qwen2Tokenizer with Qwen's pre-tokenizer, a real-size vocabulary and specials at real ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(list(_CORPUS), trainer)
    state = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    for word in _filler_words(QWEN_BASE_VOCAB, seed):
        if len(vocab) >= QWEN_BASE_VOCAB:
            break
        vocab.setdefault(word, len(vocab))
    by_id = {i: w for w, i in vocab.items()}
    for word, want in QWEN_FIXED_IDS.items():  # swap so the role words sit at their real ids
        have = vocab[word]
        other = by_id[want]
        vocab[word], vocab[other] = want, have
        by_id[want], by_id[have] = word, other
    for name in specials:  # their ids are fixed here; the tokenizer marks them special below
        vocab[name] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        errors="replace",
        model_max_length=32768,
        extra_special_tokens=extra,
        chat_template=template,
    )
    tok.add_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    for i, name in enumerate(specials):
        got = tok.convert_tokens_to_ids(name)
        if got != QWEN_BASE_VOCAB + i:
            raise RuntimeError(f"special token {name} got id {got}, want {QWEN_BASE_VOCAB + i}")
    for word, want in QWEN_FIXED_IDS.items():
        if word != "Ċ" and tok.encode(word) != [want]:
            raise RuntimeError(f"{word!r} encodes to {tok.encode(word)}, want [{want}]")
    return tok


def _mrope(head_dim: int) -> dict[str, Any]:
    # Real models use [16, 24, 24] for head_dim 128: the same 1/4, 3/8, 3/8 split of head_dim / 2.
    half = head_dim // 2
    return {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [half // 4, half * 3 // 8, half * 3 // 8],
    }


def tiny_config(hidden: int = 64, head_dim: int = 32, layers: int = 2):
    """A tiny Qwen2_5OmniConfig: real vocabulary and token ids, small widths, head_dim 32."""
    from transformers import Qwen2_5OmniConfig

    heads = hidden // head_dim
    text = {
        "vocab_size": 152064, "hidden_size": hidden, "intermediate_size": hidden * 2,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 1,
        "max_position_embeddings": 32768, "rope_parameters": _mrope(head_dim),
        "tie_word_embeddings": False, "max_window_layers": layers,
    }  # fmt: skip
    thinker = {
        "text_config": text,
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128, "d_model": 64, "output_dim": hidden, "n_window": 100,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
            "out_hidden_size": hidden, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [0],
            "in_channels": 3,
        },
        **THINKER_TOKEN_IDS,
    }  # fmt: skip
    talker = {
        "vocab_size": 8448, "embedding_size": hidden, "hidden_size": hidden,
        "intermediate_size": hidden * 2, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": 1, "head_dim": head_dim, "rope_parameters": _mrope(head_dim),
        "max_window_layers": layers, "max_position_embeddings": 32768,
    }  # fmt: skip
    # num_embeds covers the talker's whole vocabulary (the real 8193 covers only speech
    # codes): a random talker emits control codes too, and transformers' generate would
    # index the DiT's code table with them.
    token2wav = {
        "dit_config": {
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 32,
            "ff_mult": 2, "emb_dim": 32, "num_embeds": 8448, "mel_dim": 80, "repeats": 2,
            "block_size": 24, "look_ahead_layers": [1], "look_backward_layers": [0],
            "enc_emb_dim": 32, "enc_dim": 32, "enc_channels": [32, 32, 32, 32, 96],
            "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 16, "enc_res2net_scale": 2, "enc_se_channels": 16,
            "dropout": 0.0,
        },
        "bigvgan_config": {
            "mel_dim": 80, "upsample_initial_channel": 256, "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]], "upsample_rates": [5, 3, 2, 2, 2, 2],
            "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
        },
    }  # fmt: skip
    return Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav,
        enable_audio_output=True,
    )  # fmt: skip


def save_processor(out: Path, tokenizer, *, merge_size: int = 2, patch_size: int = 14,
                   temporal_patch_size: int = 2, processor_class: str) -> None:  # fmt: skip
    """Save feature extractor, image processor, a video-processor config and the processor config.

    The video processor classes import torchvision, which cannot be installed beside
    CPU torch here, so its config is written as JSON (the same file transformers
    writes) instead of being built through its class.
    """
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor

    tokenizer.save_pretrained(out)
    WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
        return_attention_mask=True,
    ).save_pretrained(out)  # fmt: skip
    pixels = {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}
    image = Qwen2VLImageProcessor(
        patch_size=patch_size, merge_size=merge_size, temporal_patch_size=temporal_patch_size,
        size={"shortest_edge": pixels["min_pixels"], "longest_edge": pixels["max_pixels"]},
        **pixels,
    )  # fmt: skip
    image.save_pretrained(out)
    # preprocessor_config.json is shared by the feature extractor and the image
    # processor in real Qwen-Omni checkpoints: merge them the way the originals do.
    pre = json.loads((out / "preprocessor_config.json").read_text())
    for key, value in WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
        return_attention_mask=True,
    ).to_dict().items():  # fmt: skip
        if key not in ("mel_filters", "window"):
            pre.setdefault(key, value)
    pre["feature_extractor_type"] = "WhisperFeatureExtractor"
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, sort_keys=True) + "\n")
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor", "patch_size": patch_size,
        "merge_size": merge_size, "temporal_patch_size": temporal_patch_size,
        "size": {"shortest_edge": pixels["min_pixels"], "longest_edge": pixels["max_pixels"]},
        "min_pixels": pixels["min_pixels"], "max_pixels": pixels["max_pixels"],
        "image_mean": list(image.image_mean), "image_std": list(image.image_std),
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "rescale_factor": 1 / 255, "min_frames": 4, "max_frames": 768, "fps": 2.0,
        "do_sample_frames": False,
    }  # fmt: skip
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": processor_class}, indent=2) + "\n"
    )


def make_tiny_qwen2_5_omni(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen2.5-Omni checkpoint to `out_dir` and return the folder."""
    import torch
    from transformers import Qwen2_5OmniForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_config()
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    write_side_files(out, config, seed)
    return out


def write_side_files(out: Path, config: Any, seed: int, ref_mel_frames: int = 24) -> None:
    """Everything of a Qwen2.5-Omni folder besides the weights: generation config,
    tokenizer and processor, and `spk_dict.pt` (per speaker: a conditioning vector of the
    DiT's enc_emb_dim, a reference mel and the talker's text bos)."""
    import torch
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=151644, eos_token_id=[151645, 151643], pad_token_id=151643,
    ).save_pretrained(out)  # fmt: skip
    tok = build_qwen_tokenizer(
        QWEN2_5_OMNI_SPECIALS, QWEN2_5_OMNI_EXTRA,
        chat_template(
            "<|vision_bos|><|IMAGE|><|vision_eos|>",
            "<|audio_bos|><|AUDIO|><|audio_eos|>",
            "<|vision_bos|><|VIDEO|><|vision_eos|>",
        ),
        seed=seed,
    )  # fmt: skip
    save_processor(out, tok, processor_class="Qwen2_5OmniProcessor")
    gen = torch.Generator().manual_seed(seed + 1)
    dit = config.token2wav_config.dit_config
    speakers = {
        name: {
            "cond": torch.randn(dit.enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, ref_mel_frames, dit.mel_dim, generator=gen),
            "bos_token": config.talker_config.tts_text_start_token_id,
        }
        for name in ("Chelsie", "Ethan")
    }
    torch.save(speakers, out / "spk_dict.pt")
