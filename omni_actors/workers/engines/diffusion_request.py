"""One diffusion request, validated: what the engine's `add` turns inputs and params into.

Request fields (from `inputs` or `params`; `inputs` win for prompt and images):
    prompt, negative_prompt   text (prompt-conditioned pipelines)
    class_label               int (class-conditional pipelines)
    image                     uint8 [H, W, C] array, or a list of them (edit / layered pipelines)
    mask                      uint8 [H, W] or [H, W, C] array, the input image's size (inpainting)
    n                         outputs for this request (num_images_per_prompt)
    width, height | size      ints, or "WxH"
    num_inference_steps, guidance_scale, seed, layers
    strength                  how far an input image is re-noised, (0, 1] (pipelines that take one)
    partial_images            previews to send mid-run (0-3)

Arrays arrive mapped from shared memory whose lease the worker gives back
after `add`; the job keeps its own copy.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.models.diffusion.capabilities import DiffusionCaps

MAX_IMAGES_PER_REQUEST = 16
MAX_SIDE_PX = 4096
MAX_INFERENCE_STEPS = 1000
MAX_LAYERS = 16
MAX_PREVIEWS = 3
SEED_BITS = 63


@dataclass(frozen=True)
class DiffusionJob:
    """One validated request."""

    request_id: str
    prompt: str | None
    negative_prompt: str | None
    class_label: int | None
    n: int
    width: int | None
    height: int | None
    steps: int
    guidance: float | None
    seed: int
    images: tuple[np.ndarray, ...] = ()
    mask: np.ndarray | None = None
    layers: int | None = None
    strength: float | None = None
    """The call's `strength` (None: the pipeline's default)."""
    previews: int = 0
    """Partial images to send mid-run (decoded from the latents); 0 for none."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Call arguments of other output kinds (video frames, audio seconds); part of the batch key."""

    @property
    def batch_key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one batch; one with input images runs alone."""
        return (
            self.width,
            self.height,
            self.steps,
            self.guidance,
            self.negative_prompt is not None,
            self.layers,
            self.strength,
            tuple(sorted(self.extras.items())),
            self.request_id if self.images else None,
        )


def parse_job(
    request_id: str,
    inputs: dict[str, Any],
    p: dict[str, Any],
    caps: DiffusionCaps,
    accepts: frozenset[str],
    defaults: dict[str, Any],
) -> DiffusionJob:
    """Validate one request against what the pipeline takes; ValueError naming the field."""
    cls = caps.pipeline_class
    prompt = inputs.get("prompt", p.get("prompt"))
    negative = inputs.get("negative_prompt", p.get("negative_prompt"))
    label = inputs.get("class_label", p.get("class_label"))
    if "prompt" in accepts:
        if not isinstance(prompt, str):
            raise ValueError("prompt: a string is required")
        if negative is not None and not isinstance(negative, str):
            raise ValueError("negative_prompt: expected a string")
        if negative is not None and "negative_prompt" not in accepts:
            raise ValueError(f"negative_prompt: {cls} does not take one")
    else:
        prompt = negative = None
    if "prompt" not in accepts and "class_labels" in accepts:
        label = int_in(label if label is not None else 0, "class_label", 0, 1 << 31)
    else:
        label = None
    images = _images(inputs.get("image"), caps)
    mask = _mask(inputs.get("mask"), images, cls, accepts)
    if mask is None and caps.mask_required and images:
        raise ValueError(f"mask: {cls} needs a mask (white where the image is to be painted)")
    width, height = _size(p, caps.size_multiple)
    if caps.image_multiple and images:
        images = tuple(_to_multiple(im, caps, i) for i, im in enumerate(images))
        if width is None and {"width", "height"} <= accepts:
            height, width = images[0].shape[:2]  # the resized input's size
    if width is not None and "width" not in accepts:
        raise ValueError(f"size: {cls} does not take a size (it makes one size, or the input image's)")
    layers = p.get("layers")
    if layers is not None:
        if "layers" not in accepts:
            raise ValueError(f"layers: {cls} does not make layers")
        layers = int_in(layers, "layers", 1, MAX_LAYERS)
    guidance = p.get("guidance_scale")
    if guidance is not None:
        if "guidance_scale" not in accepts:
            raise ValueError(f"guidance_scale: {cls} does not take one")
        if (
            isinstance(guidance, bool)
            or not isinstance(guidance, int | float)
            or not math.isfinite(guidance)
            or guidance < 0
        ):
            raise ValueError(f"guidance_scale: expected a number >= 0, got {guidance!r}")
        guidance = float(guidance)
    else:
        guidance = defaults.get("guidance_scale")
    strength = p.get("strength")
    if strength is not None:
        if "strength" not in accepts:
            raise ValueError(f"strength: {cls} does not take one")
        if isinstance(strength, bool) or not isinstance(strength, int | float) or not 0 < strength <= 1:
            raise ValueError(f"strength: expected a number in (0, 1], got {strength!r}")
        if not images:
            raise ValueError("strength: only an edit (an input image) takes one")
        strength = float(strength)
    seed = p.get("seed")
    return DiffusionJob(
        request_id=request_id,
        prompt=prompt,
        negative_prompt=negative,
        class_label=label,
        n=int_in(p.get("n", 1), "n", 1, MAX_IMAGES_PER_REQUEST),
        width=width,
        height=height,
        steps=int_in(
            p.get("num_inference_steps", defaults.get("num_inference_steps", 50)),
            "num_inference_steps",
            1,
            MAX_INFERENCE_STEPS,
        ),
        guidance=guidance,
        seed=secrets.randbits(SEED_BITS) if seed is None else int_in(seed, "seed", 0, (1 << SEED_BITS) - 1),
        images=images,
        mask=mask,
        layers=layers,
        strength=strength,
        previews=int_in(p.get("partial_images", 0), "partial_images", 0, MAX_PREVIEWS),
    )


def _images(value: Any, caps: DiffusionCaps) -> tuple[np.ndarray, ...]:
    items = [] if value is None else list(value) if isinstance(value, list | tuple) else [value]
    if caps.image_input == "none":
        if items:
            raise ValueError(f"image: {caps.pipeline_class} takes no input image")
        return ()
    if not items and caps.image_input == "required":
        raise ValueError(f"image: {caps.pipeline_class} needs an input image")
    if len(items) > caps.max_input_images:
        raise ValueError(f"image: {caps.pipeline_class} takes at most {caps.max_input_images}, got {len(items)}")
    out = []
    for i, img in enumerate(items):
        arr = np.asarray(img)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (1, 3, 4) or 0 in arr.shape:
            raise ValueError(f"image[{i}]: expected uint8 [H, W, 1|3|4], got {arr.dtype} {list(arr.shape)}")
        h, w = arr.shape[:2]
        if (why := caps.elongation_error(w, h)) is not None:
            raise ValueError(f"image[{i}]: {why}")
        out.append(np.array(arr))  # our copy: the shared-memory lease goes back after add
    return tuple(out)


def _to_multiple(arr: np.ndarray, caps: DiffusionCaps, i: int) -> np.ndarray:
    """`arr` resized (bicubic) to the size the pipeline takes it at (caps.taken_size)."""
    from PIL import Image

    h, w = arr.shape[:2]
    size = caps.taken_size(w, h)
    if max(size) > MAX_SIDE_PX:
        raise ValueError(f"image[{i}]: {w}x{h} is larger than {MAX_SIDE_PX} px a side")
    if size == (w, h):
        return arr
    squeeze = arr.shape[2] == 1
    image = Image.fromarray(arr[:, :, 0] if squeeze else arr).resize(size, Image.Resampling.BICUBIC)
    out = np.asarray(image)
    return out[:, :, None] if squeeze else out


def _mask(value: Any, images: tuple[np.ndarray, ...], cls: str, accepts: frozenset[str]) -> np.ndarray | None:
    if value is None:
        return None
    if "mask_image" not in accepts:
        raise ValueError(f"mask: {cls} does not take a mask")
    arr = np.asarray(value)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3):
        raise ValueError(f"mask: expected uint8 [H, W] or [H, W, C], got {arr.dtype} {list(arr.shape)}")
    if not images or arr.shape[:2] != images[0].shape[:2]:
        have = f"{images[0].shape[1]}x{images[0].shape[0]}" if images else "no image"
        raise ValueError(f"mask: {arr.shape[1]}x{arr.shape[0]} does not match the image ({have})")
    return np.array(arr)


def int_in(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _size(p: dict[str, Any], multiple: int) -> tuple[int | None, int | None]:
    width, height = p.get("width"), p.get("height")
    size = p.get("size")
    if size is not None and (width is not None or height is not None):
        raise ValueError("give either size or width/height, not both")
    if size is not None:
        parts = size.lower().split("x") if isinstance(size, str) else []
        if len(parts) != 2 or not all(s.strip().isdigit() for s in parts):
            raise ValueError(f"size: expected 'WxH', got {size!r}")
        width, height = int(parts[0]), int(parts[1])
    if width is None and height is None:
        return None, None
    if width is None or height is None:
        raise ValueError("width and height go together")
    for name, v in (("width", width), ("height", height)):
        int_in(v, name, multiple, MAX_SIDE_PX)
        if v % multiple:
            raise ValueError(f"size: {name} must be a multiple of {multiple} for this model, got {v}")
    return width, height
