"""Preview images decoded from a batch's latents mid-run (streamed `partial_images`).

Decoded on the runner thread, inside the step callback, with the pipeline's
own VAE, chosen by the latents' layout rather than by family name:

- [batch, channels, h, w] (Stable Diffusion, Z-Image, HunyuanImage): scaled
  back by the VAE's `scaling_factor` / `shift_factor` and decoded;
- [batch, patches, channels] packed sequences, unpacked by the pipeline's own
  `_unpack_latents`, for a video-style VAE with per-channel `latents_mean` /
  `latents_std` (Qwen-Image): denormalised and decoded, first frame kept.

Anything else gets no preview (the stream then carries the completed images only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni_actors.workers.engines.diffusion_outputs import to_uint8


def decode_preview(pipe: Any, latents: Any, height: int | None, width: int | None) -> np.ndarray | None:
    """uint8 [batch, H, W, 3] from `latents`, or None where this pipeline's latents are not previewable."""
    import torch

    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae, "decode"):
        return None
    cfg = vae.config
    with torch.no_grad():
        if latents.ndim == 4:
            scale = getattr(cfg, "scaling_factor", 1.0) or 1.0
            shift = getattr(cfg, "shift_factor", None) or 0.0
            image = vae.decode(latents.to(vae.dtype) / scale + shift, return_dict=False)[0]
        elif latents.ndim == 3 and hasattr(pipe, "_unpack_latents") and getattr(cfg, "latents_mean", None):
            if height is None or width is None:
                height = width = pipe.default_sample_size * pipe.vae_scale_factor
            lat = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor).to(vae.dtype)
            view = (1, cfg.z_dim, 1, 1, 1)
            mean = torch.tensor(cfg.latents_mean, dtype=lat.dtype).view(view)
            std = torch.tensor(cfg.latents_std, dtype=lat.dtype).view(view)
            image = vae.decode(lat * std + mean, return_dict=False)[0][:, :, 0]
        else:
            return None
    return to_uint8((image.float() / 2 + 0.5).clamp(0, 1))  # NCHW: rounded to uint8 on the device
