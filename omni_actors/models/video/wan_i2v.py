"""Wan image-to-video requests in one batch: each request's first frame prepared on its own.

`WanImageToVideoPipeline` (diffusers 0.42) takes one image a call: given a batch of B first
frames, `prepare_latents` encodes them once per generator and so makes B x B conditions, and a
list of images is refused. `batch_first_frames(pipe)` wraps the pipeline's own
`prepare_latents` so that a batch of B images is B calls of it, each with its own image,
generator and latents, whose outputs are stacked: a request's latents and condition are the
ones it gets alone. It returns how to make the pipeline's `image` for such a batch
(`first_frames`): one [B, 3, H, W] tensor in [0, 1], each image resized as the pipeline
resizes a single PIL image (its video processor's resize, Lanczos) and turned into numbers the
same way, so the pipeline's own preprocessing (a same-size resize, then [-1, 1]) sees what it
sees for a PIL image alone.

Only the layouts without an image encoder batch: TI2V-5B's (`expand_timesteps`) and
I2V-A14B's (`boundary_ratio`). Wan2.1-style I2V also embeds the image with CLIP and repeats
that embedding by the batch size; for it `batch_first_frames` returns None and each request
runs alone (the engine's default for image input).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

FirstFrames = Callable[[list[np.ndarray], int, int], torch.Tensor]


def batch_first_frames(pipe: Any) -> FirstFrames | None:
    """Make `pipe` take several first frames in one call; None if its layout cannot."""
    cfg = pipe.config
    if cfg.get("boundary_ratio") is None and not cfg.get("expand_timesteps", False):
        return None
    original = pipe.prepare_latents

    def prepare(image: torch.Tensor, batch_size: int, *args: Any) -> tuple[torch.Tensor, ...]:
        # args: num_channels_latents, height, width, num_frames, dtype, device, generator, latents, last_image
        if image.shape[0] == 1 or image.shape[0] != batch_size:
            return original(image, batch_size, *args)
        *fixed, generator, latents, last_image = args
        gens = generator if isinstance(generator, list) else [generator] * batch_size
        parts = [
            original(image[i : i + 1], 1, *fixed, [gens[i]], None if latents is None else latents[i : i + 1],
                     None if last_image is None else last_image[i : i + 1])
            for i in range(batch_size)
        ]
        # (latents, condition) per request; TI2V-5B adds its first-frame mask, the same for all
        return (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), *parts[0][2:])

    pipe.prepare_latents = prepare
    processor = pipe.video_processor

    def first_frames(images: list[np.ndarray], width: int, height: int) -> torch.Tensor:
        from PIL import Image

        resized = [processor.resize(Image.fromarray(a), height, width) for a in images]
        return processor.numpy_to_pt(processor.pil_to_numpy(resized))

    return first_frames
