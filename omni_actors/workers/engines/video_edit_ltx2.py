"""Video-to-video edits on LTX-2 (`LTX2Pipeline`): SDEdit through the pipeline's own arguments.

LTX2Pipeline's call already takes what an SDEdit needs: `latents` (a VAE's 5-D latents,
which it normalises), `noise_scale` (it noises them to noise_scale * noise + (1 -
noise_scale) * latents, the noise from the call's generator) and `sigmas` (the schedule,
which its scheduler shifts). An edit passes the encoded source, the last round(steps *
strength) of the schedule the call would make itself (np.linspace(1, 1 / steps, steps)),
and the first of those sigmas as the scheduler will shift it, so the source is noised to
exactly where the shortened schedule begins. Nothing is swapped on the pipeline.

Audio: LTX-2 denoises a video and its audio together at one timestep, so the audio stream
must start at the same noise level as the video. It starts from silence (the audio VAE's
latents of a log-mel spectrogram at LTX-2's floor, log 1e-5) noised to the edit's
strength. The source's own track is not encoded here (diffusers has no mel front-end for
the audio VAE's encoder, and one written here could not be checked against the real
checkpoint); the finished edit carries the source's track instead (api/video_jobs.py), so
what the model makes of that silence is not kept.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from omni_actors.workers.engines.video_edit import encode_raw, tail_steps

EDITABLE = ("LTX2Pipeline",)
"""Pipeline classes edited this way."""
LOG_MEL_FLOOR = math.log(1e-5)
"""LTX-2's log-mel spectrogram of silence (its front-end clamps magnitudes at 1e-5 before the log)."""


def can_edit(pipe: Any) -> bool:
    import inspect

    params = inspect.signature(type(pipe).__call__).parameters
    return (
        type(pipe).__name__ in EDITABLE
        and {"latents", "noise_scale", "sigmas", "audio_latents"} <= set(params)
        and getattr(pipe, "vae", None) is not None
        and getattr(pipe, "audio_vae", None) is not None
    )


def prepare(
    pipe: Any, frames: np.ndarray, strength: float, steps: int, fps: float
) -> dict[str, Any]:
    """The call's extra kwargs: the source's latents, the schedule's tail as `sigmas`, the
    `noise_scale` it begins at, and the audio stream's starting latents (silence)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    latents = encode_raw(pipe.vae, frames)
    tail = np.linspace(1.0, 1.0 / steps, steps)[steps - tail_steps(steps, strength) :]
    _, _, f, h, w = latents.shape
    tokens = (
        (f // pipe.transformer_temporal_patch_size)
        * (h // pipe.transformer_spatial_patch_size)
        * (w // pipe.transformer_spatial_patch_size)
    )
    cfg = pipe.scheduler.config  # the shift the call computes for this many tokens
    mu = calculate_shift(
        tokens,
        cfg.get("base_image_seq_len", 1024),
        cfg.get("max_image_seq_len", 4096),
        cfg.get("base_shift", 0.95),
        cfg.get("max_shift", 2.05),
    )
    probe = copy.deepcopy(pipe.scheduler)
    probe.set_timesteps(sigmas=tail, mu=mu)
    return {
        "latents": latents,
        "sigmas": tail,
        "noise_scale": float(probe.sigmas[0]),
        "audio_latents": _silence(pipe, frames.shape[0], fps, latents.device),
    }


def _silence(pipe: Any, num_frames: int, fps: float, device: Any) -> Any:
    """The audio VAE's latents [1, C, L, M] of silence as long as the call's audio stream
    (L as the call computes it from the frame count and rate)."""
    import torch

    vae = pipe.audio_vae
    length = round(
        num_frames
        / fps
        * pipe.audio_sampling_rate
        / pipe.audio_hop_length
        / float(pipe.audio_vae_temporal_compression_ratio)
    )
    mel = torch.full(
        (
            1,
            vae.config.in_channels,
            length * pipe.audio_vae_temporal_compression_ratio,
            vae.config.mel_bins,
        ),
        LOG_MEL_FLOOR,
        device=device,
        dtype=vae.dtype,
    )
    with torch.inference_mode():
        latents = vae.encode(mel).latent_dist.mode()
    if latents.shape[2] < length:  # a causal encoder may come out a step short: repeat its last
        latents = torch.cat(
            [latents, latents[:, :, -1:].expand(-1, -1, length - latents.shape[2], -1)], dim=2
        )
    return latents[:, :, :length]
