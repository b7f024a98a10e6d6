"""What a finished diffusion batch's pipeline output becomes: one converter per output kind.

A converter takes the pipeline's return value and gives arrays whose first
axis is the batch's rows (one per generated item, in call order); the engine
slices them per request and sends them as the request's final payload.

    "image"  {"images": uint8 [rows, H, W, 3]}, or [rows, layers, H, W, 4] for a layered pipeline
             (the engine asks for output_type "pt": rounded to uint8 on the pipeline's device)

Other kinds (video, audio) register a "module:function" in `CONVERTERS`; each
lives in its own module, imported only by a worker that serves that kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

Converter = Callable[[Any], dict[str, np.ndarray]]

CONVERTERS: dict[str, str] = {
    "image": "omni_actors.workers.engines.diffusion_outputs:image_arrays",
}


def converter(kind: str) -> Converter:
    """The converter for `kind`; ValueError naming the kinds there are."""
    ref = CONVERTERS.get(kind)
    if ref is None:
        raise ValueError(f"no output converter for {kind!r} outputs; known: {sorted(CONVERTERS)}")
    module, _, fn = ref.partition(":")
    return getattr(importlib.import_module(module), fn)


def image_arrays(result: Any) -> dict[str, np.ndarray]:
    """`result.images` (numpy float, torch, PIL, or per-row lists of PIL layers) as uint8 arrays."""
    images = result.images
    if isinstance(images, list) and images and isinstance(images[0], list | tuple):
        # Rows of layers. diffusers 0.42.1's QwenImageLayeredPipeline cuts its flat list of
        # layers into rows one layer too long (it counts the input frame it dropped), so at
        # n > 1 the rows come back uneven; the flat order is right: cut it into equal rows.
        flat = [_rgba(im) for row in images for im in row]
        if len(flat) % len(images):
            raise ValueError(f"{len(flat)} layers do not split into {len(images)} images")
        per = len(flat) // len(images)
        return {"images": np.stack([np.stack(flat[i : i + per]) for i in range(0, len(flat), per)])}
    return {"images": to_uint8(images)}


def _rgba(image: Any) -> np.ndarray:
    arr = np.asarray(image.convert("RGBA") if hasattr(image, "convert") else image)
    return to_uint8(arr[None])[0] if arr.dtype != np.uint8 else arr


def to_uint8(images: Any) -> np.ndarray:
    """Pipeline images (float [0, 1] numpy NHWC, torch NCHW, or PIL) as uint8 [n, H, W, 3]."""
    if isinstance(images, list):
        images = np.stack([np.asarray(im.convert("RGB") if hasattr(im, "convert") else im) for im in images])
    elif not isinstance(images, np.ndarray):
        images = _tensor_to_numpy(images)
    if images.dtype != np.uint8:
        images = (np.clip(images, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    return images


def _tensor_to_numpy(images: Any) -> np.ndarray:
    """A torch batch on the host. output_type "pt" gives float [0, 1] NCHW on the pipeline's device:
    on a GPU it is rounded to uint8 NHWC there, so a quarter of the bytes cross to the host and no
    float work is left for one CPU thread; the values are those numpy's rounding (to_uint8) gives
    for "np" (float32 clip, x255, round half to even), which still does it for a CPU batch.
    Other tensors are taken as NHWC."""
    if images.ndim == 4 and images.shape[1] in (1, 3, 4) and images.is_floating_point():
        if images.device.type == "cpu":  # numpy rounds a CPU batch ~3x faster than torch on one thread
            return images.detach().permute(0, 2, 3, 1).float().numpy()
        images = rounded_uint8(images)
    elif images.is_floating_point():
        images = images.float()
    return images.contiguous().cpu().numpy()


def rounded_uint8(images: Any) -> Any:
    """Float [0, 1] NCHW torch images as uint8 NHWC on their own device, rounded as to_uint8 rounds."""
    import torch

    return images.float().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8).permute(0, 2, 3, 1)
