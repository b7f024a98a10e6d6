"""Tiny random-weight Qwen3-Omni-MoE checkpoint (thinker, talker + code predictor, code2wav)."""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.tiny.qwen2_5_omni import (
    _mrope,
    build_qwen_tokenizer,
    chat_template,
    save_processor,
)

QWEN3_OMNI_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
"""Qwen3-Omni's added tokens, in id order from 151643 (<|audio_pad|> is 151675)."""

QWEN3_OMNI_EXTRA = {
    "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}  # fmt: skip

SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}


def tiny_config(hidden: int = 64, head_dim: int = 32, layers: int = 2):
    """A tiny Qwen3OmniMoeConfig with the real vocabularies and special ids, head_dim 32."""
    from transformers import Qwen3OmniMoeConfig

    heads = hidden // head_dim
    rope = {**_mrope(head_dim), "interleaved": True, "mrope_interleaved": True}
    text = {
        "vocab_size": 152064, "hidden_size": hidden, "intermediate_size": hidden * 2,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 1,
        "head_dim": head_dim, "rope_parameters": rope, "moe_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "max_position_embeddings": 32768,
    }  # fmt: skip
    thinker = {
        "text_config": text,
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128, "d_model": 64, "output_dim": hidden, "n_window": 50,
            "n_window_infer": 800, "conv_chunksize": 500, "downsample_hidden_size": 32,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
            "out_hidden_size": hidden, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [0], "image_size": 768, "apply_vit_abs_pos_embed": True,
        },
        "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
        "audio_start_token_id": 151669, "vision_start_token_id": 151652, "user_token_id": 872,
        "position_id_per_seconds": 13,
    }  # fmt: skip
    talker = {
        "text_config": {
            "vocab_size": 3072, "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 1,
            "head_dim": head_dim, "rope_parameters": rope, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
        },
        "code_predictor_config": {
            "vocab_size": 2048, "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": 1,
            "head_dim": head_dim, "num_code_groups": 16, "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        "num_code_groups": 16, "thinker_hidden_size": hidden, "accept_hidden_layer": 1,
        "codec_eos_token_id": 2150, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
        "vision_start_token_id": 151652, "audio_start_token_id": 151669,
        "position_id_per_seconds": 13, "speaker_id": dict(SPEAKERS), "spatial_merge_size": 2,
        "audio_config": None,
    }  # fmt: skip
    code2wav = {
        "codebook_size": 2048, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "intermediate_size": 128, "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 64,
        "sliding_window": 72, "max_position_embeddings": 8000,
    }  # fmt: skip
    talker["audio_config"] = thinker["audio_config"]  # `generate` with audio input reads it here
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
        enable_audio_output=True,
    )  # fmt: skip


def make_tiny_qwen3_omni_moe(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen3-Omni-MoE checkpoint to `out_dir` and return the folder."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_config()).eval()
    # transformers leaves the talker's fused expert tensors uninitialised (torch.empty):
    # draw them from the seed like every other weight.
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("talker.") and ".experts." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    model.save_pretrained(out, safe_serialization=True)
    write_side_files(out, seed)
    return out


def write_side_files(out: Path, seed: int) -> None:
    """Generation config, offline tokenizer with the chat template, and processor configs
    of a Qwen3-Omni folder (the tiny builder's and the sized script's)."""
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
    ).save_pretrained(out)  # fmt: skip
    tok = build_qwen_tokenizer(
        QWEN3_OMNI_SPECIALS, QWEN3_OMNI_EXTRA,
        chat_template(
            "<|vision_start|><|image_pad|><|vision_end|>",
            "<|audio_start|><|audio_pad|><|audio_end|>",
            "<|vision_start|><|video_pad|><|vision_end|>",
        ),
        seed=seed,
    )  # fmt: skip
    save_processor(out, tok, patch_size=16, processor_class="Qwen3OmniMoeProcessor")
