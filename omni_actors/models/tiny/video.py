"""Tiny random-weight video and audio diffusers checkpoints (Wan2.2, Stable Audio Open, ...) built offline.

Each builder makes the real pipeline class from tiny component configs (the real
text encoder and tokenizer classes, a tokenizer made from an in-memory
vocabulary) and writes it with `save_pretrained`, so the same
`DiffusionPipeline.from_pretrained` that loads a real checkpoint loads it.
Deterministic by seed; each builds in seconds on CPU.

    make_tiny_wan2_2(out_dir)       WanPipeline, text-to-video (Wan2.2 layout: two experts, boundary_ratio)
    make_tiny_wan2_2_i2v(out_dir)   WanImageToVideoPipeline (Wan2.2 TI2V layout: expand_timesteps, no image encoder)
    make_tiny_wan2_2_i2v_a14b(...)  the same class in Wan2.2-I2V-A14B's layout (two experts, concatenated condition)
    make_tiny_stable_audio(out_dir) StableAudioPipeline (T5 text encoder, Oobleck VAE)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import seeded_pipeline
from omni_actors.models.tiny.text_encoders import t5_encoder, t5_fields

_WORDS = (
    "a cat walks on the beach at sunset the sea waves and a small boat drums "
    "piano birds rain city street night camera pans slowly over green hills"
)
T5_EXTRA_IDS = 8
"""Sentinel tokens of the tiny T5 tokenizers (the real ones have 100 or 300)."""


def t5_tokenizer() -> Any:
    """A T5 (Unigram) tokenizer over single characters and a few whole words."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    seen = {p for p, _ in pieces}
    chars = sorted(set(_WORDS.replace(" ", ""))) + list("0123456789.,!?'-")
    for word in sorted(set(_WORDS.split())):
        for piece in ("\u2581" + word, word):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -2.0))
    for ch in ["\u2581", *chars]:
        if ch not in seen:
            seen.add(ch)
            pieces.append((ch, -8.0))
    return T5Tokenizer(vocab=pieces, extra_ids=T5_EXTRA_IDS, model_max_length=512)


def _umt5(tokenizer: Any, d_model: int = 32) -> Any:
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(**t5_fields(tokenizer, d_model)))


def _wan_vae() -> Any:
    import torch
    from diffusers import AutoencoderKLWan

    # 8x spatial, 4x temporal like the real Wan2.1/2.2-A14B VAE, at a few channels. Without biases: random
    # ones drowned the picture (two sources that differed after the first frame encoded to latents 0.1%
    # apart, so a video edit's source could not be seen in what it made).
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
    return vae


def _wan_transformer(in_channels: int = 16) -> Any:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=in_channels,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024,  # the real checkpoints' (a table of positions: any size a request may ask)
    )


def _flow_scheduler() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=5.0)


def _wan2_2() -> Any:
    from diffusers import WanPipeline

    tokenizer = t5_tokenizer()
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=_umt5(tokenizer),
        vae=_wan_vae(),
        scheduler=_flow_scheduler(),
        transformer=_wan_transformer(),
        transformer_2=_wan_transformer(),
        boundary_ratio=0.875,
    )


def _wan2_2_i2v(a14b: bool = False) -> Any:
    from diffusers import WanImageToVideoPipeline

    tokenizer = t5_tokenizer()
    # TI2V-5B: the first frame's latents replace the video's first (expand_timesteps). A14B: two experts
    # over 36 channels (the latents, a 4-channel frame mask, the encoded first frame), boundary_ratio 0.9.
    layout = ({"transformer": _wan_transformer(36), "transformer_2": _wan_transformer(36), "boundary_ratio": 0.9}
              if a14b else {"transformer": _wan_transformer(), "expand_timesteps": True})
    return WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=_umt5(tokenizer), vae=_wan_vae(),
                                   scheduler=_flow_scheduler(), image_processor=None, image_encoder=None, **layout)


def make_tiny_wan2_2(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan2.2 text-to-video pipeline (WanPipeline) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, _wan2_2)


def make_tiny_wan2_2_i2v(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan2.2 image-to-video pipeline (WanImageToVideoPipeline) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, _wan2_2_i2v)


def make_tiny_wan2_2_i2v_a14b(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan2.2-I2V-A14B-layout pipeline (WanImageToVideoPipeline, two experts) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, lambda: _wan2_2_i2v(a14b=True))


STABLE_AUDIO_RATE_HZ = 8000
"""Sampling rate of the tiny Stable Audio VAE (the real one runs at 44.1 kHz)."""


def _stable_audio() -> Any:
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel

    tokenizer = t5_tokenizer()
    text_encoder = t5_encoder(tokenizer)
    # Hop 32 samples: 250 latent frames a second; sample_size 512 caps a clip at 2.048 s (the real
    # 1024 latents at hop 2048 / 44.1 kHz hold 47.55 s). Every call fills the whole window, so a
    # real-length one (11888 latents) would cost seconds of attention a step on a CPU.
    vae = AutoencoderOobleck(
        encoder_hidden_size=8,
        downsampling_ratios=[4, 8],
        channel_multiples=[1, 2],
        decoder_channels=8,
        decoder_input_channels=4,
        audio_channels=2,
        sampling_rate=STABLE_AUDIO_RATE_HZ,
    )
    transformer = StableAudioDiTModel(
        sample_size=512,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=4,
        cross_attention_dim=16,
        time_proj_dim=16,
        global_states_input_dim=16,
        cross_attention_input_dim=8,
    )
    projection = StableAudioProjectionModel(
        text_encoder_dim=32, conditioning_dim=8, min_value=0, max_value=512
    )
    # The real checkpoint names CosineDPMSolverMultistepScheduler, which needs torchsde (not
    # installed here); the EDM DPM-Solver is the other scheduler this pipeline is typed for.
    scheduler = EDMDPMSolverMultistepScheduler(
        sigma_min=0.3,
        sigma_max=500.0,
        solver_order=2,
        prediction_type="v_prediction",
        sigma_data=1.0,
        sigma_schedule="exponential",
    )
    return StableAudioPipeline(
        vae=vae,
        text_encoder=text_encoder,
        projection_model=projection,
        tokenizer=tokenizer,
        transformer=transformer,
        scheduler=scheduler,
    )


def make_tiny_stable_audio(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Stable Audio Open pipeline (StableAudioPipeline) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, _stable_audio)


def gemma_tokenizer() -> Any:
    """A Gemma (byte-fallback BPE) tokenizer: specials, the 256 byte tokens, characters, no merges."""
    from transformers import GemmaTokenizer

    vocab: dict[str, int] = {}
    for tok in ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"):
        vocab[tok] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["\u2581", *sorted(set(_WORDS.replace(" ", ""))), *"0123456789.,!?'-"]:
        vocab.setdefault(ch, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=1024, padding_side="left")


def _gemma3(tokenizer: Any) -> Any:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {
        "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 1024,
        "sliding_window": 64, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=tokenizer.unk_token_id)
    return Gemma3ForConditionalGeneration(config)


LTX2_AUDIO_RATE_HZ = 16000


def _ltx2() -> Any:
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    tokenizer = gemma_tokenizer()
    text_encoder = _gemma3(tokenizer)
    hidden = text_encoder.config.text_config.hidden_size
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
        attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
        audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
        qk_norm="rms_norm_across_heads", caption_channels=hidden, rope_double_precision=False, rope_type="split",
    )
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=text_encoder.config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
        causal_temporal_positioning=False, rope_type="split",
    )
    # One down block: 2x spatial, 2x temporal (the real VAE is 32x / 8x), in the encoder too (a spatial-only
    # encoder made 9 latent frames of 9 where the pipeline expects 5: an edit's source did not fit).
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
        decoder_block_out_channels=(8,), layers_per_block=(1,), decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatiotemporal",), upsample_residual=(False,),
        upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False,
    )
    # Three levels: 4x in time and mel bins, the factor the pipeline assumes (one level encoded none).
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1, attn_resolutions=None,
        in_channels=2, resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height",
        dropout=0.0, mid_block_add_attention=False, sample_rate=LTX2_AUDIO_RATE_HZ, mel_hop_length=160,
        is_causal=True, mel_bins=8,
    )
    vocoder = LTX2Vocoder(
        # Upsampling by 4 * 4 * 10 = the 160-sample mel hop, so the track lasts as long as the video.
        in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[8, 8, 20],
        upsample_factors=[4, 4, 10], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1, output_sampling_rate=LTX2_AUDIO_RATE_HZ,
    )
    return LTX2Pipeline(
        scheduler=_flow_scheduler(), vae=vae, audio_vae=audio_vae, text_encoder=text_encoder,
        tokenizer=tokenizer, connectors=connectors, transformer=transformer, vocoder=vocoder,
    )


def make_tiny_ltx2(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny LTX-2 pipeline (LTX2Pipeline: video with its audio track) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, _ltx2)


QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen2_tokenizer() -> Any:
    """A byte-level Qwen2 tokenizer (one token per byte, no merges) with Qwen's chat markers and template."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {sym: i for i, sym in enumerate(bytes_to_unicode().values())}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], model_max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def _hunyuan_video_1_5() -> Any:
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    tokenizer = qwen2_tokenizer()
    text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, rope_theta=1000000.0,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
    ))
    tokenizer_2 = ByT5Tokenizer()
    text_encoder_2 = t5_encoder(tokenizer_2)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
        text_embed_2_dim=32, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v",
    )
    # 4x spatial / 2x temporal (the real VAE is 16x / 4x).
    vae = AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
        spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
        upsample_match_channel=False,
    )
    return HunyuanVideo15Pipeline(
        text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2, guider=ClassifierFreeGuidance(guidance_scale=1.0),
    )


def make_tiny_hunyuan_video_1_5(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny HunyuanVideo-1.5 pipeline (HunyuanVideo15Pipeline) to `out_dir`."""
    return seeded_pipeline(out_dir, seed, _hunyuan_video_1_5)
