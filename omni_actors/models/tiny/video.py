"""Tiny random-weight video and audio diffusers checkpoints (Wan2.2, Stable Audio Open, ...) built offline.

Each builder makes the real pipeline class from tiny component configs (the real
text encoder and tokenizer classes, a tokenizer made from an in-memory
vocabulary) and writes it with `save_pretrained`, so the same
`DiffusionPipeline.from_pretrained` that loads a real checkpoint loads it.
Deterministic by seed; each builds in seconds on CPU.

    make_tiny_wan2_2(out_dir)       WanPipeline, text-to-video (Wan2.2 layout: two experts, boundary_ratio)
    make_tiny_wan2_2_i2v(out_dir)   WanImageToVideoPipeline (Wan2.2 TI2V layout: expand_timesteps, no image encoder)
    make_tiny_stable_audio(out_dir) StableAudioPipeline (T5 text encoder, Oobleck VAE)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

_WORDS = (
    "a cat walks on the beach at sunset the sea waves and a small boat drums "
    "piano birds rain city street night camera pans slowly over green hills"
)
T5_EXTRA_IDS = 8
"""Sentinel tokens of the tiny T5 tokenizers (the real ones have 100 or 300)."""


def _build(out_dir: str | Path, seed: int, make: Callable[[], Any]) -> Path:
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = make()
    pipe.save_pretrained(out, safe_serialization=True)
    return out


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

    return UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=d_model,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )


def _wan_vae() -> Any:
    from diffusers import AutoencoderKLWan

    # 8x spatial, 4x temporal like the real Wan2.1/2.2-A14B VAE, at a few channels.
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )


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
        rope_max_seq_len=32,
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


def _wan2_2_i2v() -> Any:
    from diffusers import WanImageToVideoPipeline

    tokenizer = t5_tokenizer()
    return WanImageToVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=_umt5(tokenizer),
        vae=_wan_vae(),
        scheduler=_flow_scheduler(),
        image_processor=None,
        image_encoder=None,
        transformer=_wan_transformer(),
        expand_timesteps=True,
    )


def make_tiny_wan2_2(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan2.2 text-to-video pipeline (WanPipeline) to `out_dir`."""
    return _build(out_dir, seed, _wan2_2)


def make_tiny_wan2_2_i2v(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan2.2 image-to-video pipeline (WanImageToVideoPipeline) to `out_dir`."""
    return _build(out_dir, seed, _wan2_2_i2v)


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
    from transformers import T5Config, T5EncoderModel

    tokenizer = t5_tokenizer()
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    # Hop 32 samples: 250 latent frames a second; sample_size 11888 caps a clip at 47.55 s,
    # as the real 1024 latents at hop 2048 / 44.1 kHz do.
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
        sample_size=11888,
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
    return _build(out_dir, seed, _stable_audio)
