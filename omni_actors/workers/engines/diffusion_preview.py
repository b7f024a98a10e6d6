"""Preview images decoded from a batch's latents mid-run (streamed `partial_images`).

Decoded on the runner thread, inside the step callback, with the pipeline's
own VAE: latents shaped [batch, channels, h, w] (UNet and DiT families such as
Stable Diffusion and Z-Image) are scaled back by the VAE's `scaling_factor` /
`shift_factor` and decoded. Packed sequence latents (Qwen-Image, FLUX) need the
pipeline's own unpacking and are not previewed: the stream then carries the
completed images only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni_actors.workers.engines.diffusion_outputs import to_uint8


def decode_preview(pipe: Any, latents: Any) -> np.ndarray | None:
    """uint8 [batch, H, W, 3] from `latents`, or None where this pipeline's latents are not previewable."""
    import torch

    vae = getattr(pipe, "vae", None)
    if vae is None or latents.ndim != 4 or not hasattr(vae, "decode"):
        return None
    cfg = vae.config
    scale = getattr(cfg, "scaling_factor", 1.0) or 1.0
    shift = getattr(cfg, "shift_factor", None) or 0.0
    with torch.no_grad():
        image = vae.decode(latents.to(vae.dtype) / scale + shift, return_dict=False)[0]
    return to_uint8(((image.float() / 2 + 0.5).clamp(0, 1)).permute(0, 2, 3, 1))
