"""Preview images decoded from a batch's latents mid-run (streamed `partial_images`).

Decoded on the runner thread, inside the step callback, with the pipeline's own
VAE and the same scaling its `__call__` applies before its final decode. Which
recipe a class needs is a family fact (`FamilyFacts.preview` in
models/diffusion/families.py); "auto" picks by the latents' layout:

- "scaled": [batch, channels, h, w] divided by the VAE's `scaling_factor`, plus
  `shift_factor` (Stable Diffusion, Z-Image, HunyuanImage);
- "packed_mean_std": [batch, patches, channels] unpacked by the pipeline's own
  `_unpack_latents`, denormalised by a video-style VAE's per-channel
  `latents_mean` / `latents_std`, first frame kept (Qwen-Image, Edit, Edit-Plus);
- "packed_scaled": unpacked the same way, then "scaled" (LongCat-Image, -Edit);
- "packed_bn": FLUX.2's patch tokens, denormalised by its VAE's batch-norm
  statistics and unpatchified by the pipeline's `_unpatchify_latents`;
- "mean_std": 4-D latents times `latents_std` plus `latents_mean` (GLM-Image);
- "layered": Qwen-Image-Layered's frames, the input frame dropped, each layer
  decoded to RGBA and the layers composited in order (an RGBA preview of the stack);
- "none": no preview.

Packed latents carry no size: the token grid is taken from the call's
`width`/`height` when they fit, else from the input image's aspect (the pipeline
sized the output from it), else square. A recipe that raises (a new diffusers,
an odd layout) never fails the request: `preview` logs `diffusion.preview_failed`
once for that pipeline and sends no more previews from it.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.models.diffusion.families import family_facts
from omni_actors.workers.engines.diffusion_outputs import to_uint8

log = logs.get(__name__)

_failed: weakref.WeakSet[Any] = weakref.WeakSet()
"""Pipelines (one per engine) whose preview raised once: no more previews are tried for them."""


def preview(pipe: Any, latents: Any, call: dict[str, Any]) -> np.ndarray | None:
    """`decode_preview`, or None (logged once per pipeline) where it raises: a preview never fails a batch."""
    if pipe in _failed:
        return None
    try:
        return decode_preview(pipe, latents, call)
    except Exception as err:  # the step callback's boundary: previews stop, the batch goes on
        _failed.add(pipe)
        log.warning("diffusion.preview_failed", pipeline=type(pipe).__name__, error=repr(err))
        return None


def decode_preview(pipe: Any, latents: Any, call: dict[str, Any]) -> np.ndarray | None:
    """uint8 [batch, H, W, 3|4] from `latents` given the pipeline call's kwargs, or None where this
    pipeline's latents are not previewable."""
    import torch

    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae, "decode"):
        return None
    recipe = family_facts(type(pipe).__name__).preview
    if recipe == "auto":
        recipe = _auto(pipe, latents)
    decode = _RECIPES.get(recipe)
    if decode is None:
        return None
    with torch.no_grad():
        image = decode(pipe, latents, call)
    return to_uint8((image.float() / 2 + 0.5).clamp(0, 1))  # NCHW: rounded to uint8 on the device


def _auto(pipe: Any, latents: Any) -> str:
    if latents.ndim == 4:
        return "scaled"
    if latents.ndim == 3 and hasattr(pipe, "_unpack_latents") and getattr(pipe.vae.config, "latents_mean", None):
        return "packed_mean_std"
    return "none"


def _scaled(pipe: Any, lat: Any, _call: dict[str, Any]) -> Any:
    vae = pipe.vae
    scale = getattr(vae.config, "scaling_factor", None) or 1.0
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    return vae.decode(lat.to(vae.dtype) / scale + shift, return_dict=False)[0]


def _packed_mean_std(pipe: Any, latents: Any, call: dict[str, Any]) -> Any:
    vae, cfg = pipe.vae, pipe.vae.config
    h, w = _grid(latents.shape[1], call)
    side = 2 * pipe.vae_scale_factor
    lat = pipe._unpack_latents(latents, h * side, w * side, pipe.vae_scale_factor).to(vae.dtype)
    return vae.decode(_denormalise(lat, cfg, cfg.z_dim), return_dict=False)[0][:, :, 0]


def _packed_scaled(pipe: Any, latents: Any, call: dict[str, Any]) -> Any:
    h, w = _grid(latents.shape[1], call)
    side = 2 * pipe.vae_scale_factor
    return _scaled(pipe, pipe._unpack_latents(latents, h * side, w * side, pipe.vae_scale_factor), call)


def _packed_bn(pipe: Any, latents: Any, call: dict[str, Any]) -> Any:
    import torch

    vae = pipe.vae
    b, n, c = latents.shape
    h, w = _grid(n, call)
    lat = latents.permute(0, 2, 1).reshape(b, c, h, w)  # the inverse of Flux2Pipeline._pack_latents
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(lat.device, lat.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(lat.device, lat.dtype)
    lat = pipe._unpatchify_latents(lat * std + mean)
    return vae.decode(lat.to(vae.dtype), return_dict=False)[0]


def _mean_std(pipe: Any, lat: Any, _call: dict[str, Any]) -> Any:
    vae = pipe.vae
    return vae.decode(_denormalise(lat.to(vae.dtype), vae.config, vae.config.latent_channels), return_dict=False)[0]


def _layered(pipe: Any, latents: Any, call: dict[str, Any]) -> Any:
    import torch

    vae = pipe.vae
    layers = int(call.get("layers") or 4)  # QwenImageLayeredPipeline's default
    h, w = _layered_size(pipe, call)
    lat = pipe._unpack_latents(latents, h, w, layers, pipe.vae_scale_factor).to(vae.dtype)
    lat = _denormalise(lat, vae.config, vae.config.z_dim)[:, :, 1:]  # frame 0 is the input image
    b, c, f, lh, lw = lat.shape
    frames = vae.decode(lat.permute(0, 2, 1, 3, 4).reshape(b * f, c, 1, lh, lw), return_dict=False)[0][:, :, 0]
    rgba = (frames.float() / 2 + 0.5).clamp(0, 1).view(b, f, *frames.shape[1:])
    color, alpha = rgba[:, 0, :3] * rgba[:, 0, 3:], rgba[:, 0, 3:]
    for k in range(1, f):  # each layer over the ones before it (premultiplied "over")
        a = rgba[:, k, 3:]
        color, alpha = rgba[:, k, :3] * a + color * (1 - a), a + alpha * (1 - a)
    out = (color / alpha.clamp_min(1e-6)).where(alpha > 0, color)
    return torch.cat([out, alpha], dim=1) * 2 - 1  # back to [-1, 1], as every recipe returns


def _layered_size(pipe: Any, call: dict[str, Any]) -> tuple[int, int]:
    """The (height, width) QwenImageLayeredPipeline computes from its input image and `resolution`."""
    image = call["image"]
    iw, ih = (image[0] if isinstance(image, list) else image).size
    resolution = int(call.get("resolution") or 640)
    width, height = sys.modules[type(pipe).__module__].calculate_dimensions(resolution * resolution, iw / ih)
    multiple = pipe.vae_scale_factor * 2
    return int(height) // multiple * multiple, int(width) // multiple * multiple


def _denormalise(lat: Any, cfg: Any, channels: int) -> Any:
    import torch

    view = (1, channels) + (1,) * (lat.ndim - 2)
    mean = torch.tensor(cfg.latents_mean, dtype=lat.dtype, device=lat.device).view(view)
    std = torch.tensor(cfg.latents_std, dtype=lat.dtype, device=lat.device).view(view)
    return lat * std + mean


def _grid(tokens: int, call: dict[str, Any]) -> tuple[int, int]:
    """(rows, columns) of a 2x2-patch token grid holding `tokens`: the call's size when it fits, else
    the factor pair closest to the input image's aspect (the pipeline sized its output from it), else square."""
    width, height = call.get("width"), call.get("height")
    aspect = 1.0
    if width and height:
        aspect = width / height
    elif call.get("image") is not None:
        image = call["image"]
        first = image[0] if isinstance(image, list) else image
        if hasattr(first, "size") and not callable(first.size):
            aspect = first.size[0] / first.size[1]
    pairs = [(r, tokens // r) for r in range(1, tokens + 1) if tokens % r == 0]
    return min(pairs, key=lambda rc: abs(math.log(rc[1] / rc[0] / aspect)))


_RECIPES: dict[str, Callable[[Any, Any, dict[str, Any]], Any]] = {
    "scaled": _scaled,
    "packed_mean_std": _packed_mean_std,
    "packed_scaled": _packed_scaled,
    "packed_bn": _packed_bn,
    "mean_std": _mean_std,
    "layered": _layered,
}
