"""Tiny random-weight Qwen3-TTS (CustomVoice) checkpoints in the public on-disk layout.

`make_tiny_qwen3_tts` writes what a Qwen3-TTS-12Hz CustomVoice folder holds
(`make_tiny_qwen3_tts_voice_design` the VoiceDesign variant: no named speakers;
`make_tiny_qwen3_tts_base` the Base variant: no speakers, `speaker_encoder.*` weights):
`config.json` (model_type "qwen3_tts", tts_model_type "custom_voice", a
`talker_config` with its `code_predictor_config`, the codec control ids, the
named speakers `spk_id` / `spk_is_dialect` and `codec_language_id`, a
`speaker_encoder_config`), `model.safetensors` with the `talker.*` weights,
`generation_config.json`, a Qwen2 tokenizer (byte-level vocabulary with
`<|im_start|>`, `<|im_end|>` and the tts pad/bos/eos specials) and the codec in
`speech_tokenizer/` (config.json model_type "qwen3_tts_tokenizer_12hz" with a
Mimi `encoder_config` and the `decoder_config`, `model.safetensors` with
`encoder.*` / `decoder.*`). The codec keeps the real timing (12.5 frames a
second at 24 kHz: 1920 samples a frame) with narrow layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
"""The CustomVoice checkpoints' speakers (the public model card's list)."""
DIALECTS = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
LANGUAGES = ("chinese", "english", "japanese", "korean", "beijing_dialect", "sichuan_dialect")
TTS_SPECIALS = ("<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>")
GROUPS = 4
CODEBOOK = 64
TINY_MAX_FRAMES = 20
CODEC_GAIN = 0.7
"""Weight std times sqrt(fan-in) in the tiny codec decoder: distinct codes give distinct, unclipped audio."""


def _config(tok: Any, speakers: tuple[str, ...], kind: str) -> dict[str, Any]:
    ids = iter(range(CODEBOOK, 10_000))
    codec = {
        name: next(ids)
        for name in ("pad", "bos", "eos", "think", "nothink", "think_bos", "think_eos")
    }
    spk = {name: next(ids) for name in speakers}
    lang = {name: next(ids) for name in LANGUAGES}
    vocab = next(ids) + 3
    special = {
        t: tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", *TTS_SPECIALS)
    }
    talker = {
        "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
        "attention_bias": False, "num_code_groups": GROUPS, "text_hidden_size": 48, "text_vocab_size": len(tok) + 8,
        "codec_pad_id": codec["pad"], "codec_bos_id": codec["bos"], "codec_eos_token_id": codec["eos"],
        "codec_think_id": codec["think"], "codec_nothink_id": codec["nothink"],
        "codec_think_bos_id": codec["think_bos"], "codec_think_eos_id": codec["think_eos"],
        "spk_id": spk, "spk_is_dialect": {s: DIALECTS.get(s, False) for s in speakers}, "codec_language_id": lang,
        "code_predictor_config": {
            "vocab_size": CODEBOOK, "hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12, "hidden_act": "silu",
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "num_code_groups": GROUPS, "model_type": "qwen3_tts_talker_code_predictor",
        },
        "model_type": "qwen3_tts_talker",
    }  # fmt: skip
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tts_model_type": kind, "tts_model_size": "tiny", "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "im_start_token_id": special["<|im_start|>"], "im_end_token_id": special["<|im_end|>"],
        "tts_pad_token_id": special[TTS_SPECIALS[0]], "tts_bos_token_id": special[TTS_SPECIALS[1]],
        "tts_eos_token_id": special[TTS_SPECIALS[2]],
        "talker_config": talker,
        "speaker_encoder_config": {"mel_dim": 128, "enc_dim": 32, "enc_channels": [16, 16, 16, 16, 48],
                                   "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                                   "enc_attention_channels": 8, "enc_res2net_scale": 4, "enc_se_channels": 8,
                                   "sample_rate": 24000},
        "dtype": "float32",
    }  # fmt: skip


def _codec_config() -> dict[str, Any]:
    encoder = {
        "model_type": "mimi", "sampling_rate": 24000, "frame_rate": 12.5, "upsampling_ratios": [8, 6, 5, 4],
        "codebook_size": CODEBOOK, "num_quantizers": GROUPS, "num_semantic_quantizers": 1, "codebook_dim": 16,
        "vector_quantization_hidden_dimension": 16, "hidden_size": 32, "num_filters": 4, "upsample_groups": 32,
        "num_hidden_layers": 1, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 16, "sliding_window": 250, "use_cache": False,
    }  # fmt: skip
    decoder = {
        "codebook_size": CODEBOOK, "codebook_dim": 16, "hidden_size": 32, "latent_dim": 32,
        "max_position_embeddings": 8000, "rope_theta": 10000, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 8, "num_semantic_quantizers": 1, "attention_bias": False, "sliding_window": 72,
        "intermediate_size": 64, "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5, "num_hidden_layers": 1, "num_quantizers": GROUPS,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 32, "attention_dropout": 0.0,
    }  # fmt: skip
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": encoder, "decoder_config": decoder, "encoder_valid_num_quantizers": GROUPS,
        "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
    }  # fmt: skip


def _tokenizer() -> Any:
    from omni_actors.models.tiny.video import qwen2_tokenizer

    tok = qwen2_tokenizer()
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *TTS_SPECIALS]}
    )
    return tok


def make_tiny_qwen3_tts(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen3-TTS CustomVoice checkpoint into `out_dir` and return its path."""
    return _write(Path(out_dir), seed, SPEAKERS, "custom_voice")


def make_tiny_qwen3_tts_voice_design(out_dir: str | Path, seed: int = 0) -> Path:
    """The VoiceDesign variant: no named speakers (`spk_id` empty); the voice comes from the instructions."""
    return _write(Path(out_dir), seed, (), "voice_design")


def make_tiny_qwen3_tts_base(out_dir: str | Path, seed: int = 0) -> Path:
    """The Base (voice cloning) variant: no named speakers, plus the `speaker_encoder.*` ECAPA-TDNN weights."""
    return _write(Path(out_dir), seed, (), "base")


def _write(out: Path, seed: int, speakers: tuple[str, ...], kind: str) -> Path:
    import torch
    from safetensors.torch import save_file

    from omni_actors.models.qwen3_tts.codec_model import CodecDecoder, mimi_encoder
    from omni_actors.models.qwen3_tts.modules import Talker, speaker_encoder, talker_state

    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    tok.save_pretrained(out)
    config, codec = _config(tok, speakers, kind), _codec_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        talker = Talker(config["talker_config"])
        decoder = CodecDecoder(codec["decoder_config"])
        encoder = mimi_encoder(codec["encoder_config"])
        spk = speaker_encoder(config["speaker_encoder_config"]) if kind == "base" else None
        with torch.no_grad():
            for _name, p in talker.named_parameters():
                if p.dim() > 1:  # peaked random logits: seed-dependent, varied codes
                    p.normal_(0.0, 0.2)
            # Spread code logits, the stop code's at 0: a tiny utterance rarely stops in its first frames.
            talker.codec_head.weight.normal_(0.0, 0.5)
            talker.codec_head.weight[config["talker_config"]["codec_eos_token_id"]] = 0.0
            for name, p in decoder.named_parameters():
                if name.endswith("embedding_sum"):
                    p.normal_(0.0, 1.0)
                elif (
                    p.dim() > 1
                ):  # default init leaves the deep conv stack near-silent; this gain is audible
                    p.normal_(0.0, CODEC_GAIN / p[0].numel() ** 0.5)
            for name, buf in encoder.named_buffers():
                if name.endswith("codebook.embed_sum"):
                    buf.normal_(0.0, 1.0)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = talker_state(talker)
    if spk is not None:
        weights.update({f"speaker_encoder.{k}": v for k, v in spk.state_dict().items()})
    save_file(
        {k: v.contiguous() for k, v in weights.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    gen = {
        "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
        "max_new_tokens": TINY_MAX_FRAMES,
    }  # fmt: skip
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    (out / "speech_tokenizer" / "config.json").write_text(json.dumps(codec, indent=2))
    weights = {f"decoder.{k}": v for k, v in decoder.state_dict().items()}
    weights.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "speech_tokenizer" / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    (out / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": 24000,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True}, indent=2))  # fmt: skip
    return out
