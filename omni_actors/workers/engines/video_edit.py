"""Video-to-video edits on a Wan pipeline: the source re-made under a new prompt (SDEdit).

The source frames are encoded by the pipeline's own VAE into normalised latents, noised
to the schedule's sigma at `strength` (flow matching: sigma * noise + (1 - sigma) *
latents), and the pipeline's own call then denoises only the schedule's tail from there:
its scheduler is swapped, for that call, for a copy whose `set_timesteps` keeps the last
round(steps * strength) timesteps and begins its step index there (as diffusers'
image-to-image pipelines do). Everything else is the pipeline's own loop, so a Wan2.2
A14B checkpoint still hands the low-noise steps to its second expert at its boundary.
strength 1.0 starts from pure noise (nothing of the source is left but an image-to-video
pipeline's first frame); lower keeps more of it.

Which pipelines: `EDITABLE` (a call that takes `latents`, a VAE with Wan's latent
normalisation, a flow-matching schedule with `sigmas` and `set_begin_index`), and LTX-2's,
whose call does the same through its own arguments (video_edit_ltx2.py). The noise is drawn
on the CPU from the request's seed, so an edit repeats exactly.

Image-to-video (`WanImageToVideoPipeline`) also takes a first frame, its `image`, which
`first_frame` gives it: the source's own, or an `input_reference` that replaces the
source's first frame (so the condition and the encoded source agree). Its call uses
`latents` passed in as they are in both of its layouts: Wan2.2-I2V-A14B's concatenates a
mask and the encoded condition to them on channels and denoises every frame (the first
too, under that condition); TI2V-5B's (`expand_timesteps`) puts the condition's latent
over the first latent frame at every step and at the end, and denoises the rest. Either
way the rest of the video comes from the noised source, so the same SDEdit serves both.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

EDITABLE = ("WanPipeline", "WanImageToVideoPipeline")
"""Pipeline classes whose call edits a video this way."""
DEFAULT_STRENGTH = 0.7
"""How much of the schedule an edit runs when the request does not say (1.0: all of it)."""


def can_edit(pipe: Any) -> bool:
    from omni_actors.workers.engines import video_edit_ltx2

    if type(pipe).__name__ in video_edit_ltx2.EDITABLE:
        return video_edit_ltx2.can_edit(pipe)
    vae_cfg = getattr(getattr(pipe, "vae", None), "config", None)
    scheduler = getattr(pipe, "scheduler", None)
    return (type(pipe).__name__ in EDITABLE and vae_cfg is not None
            and getattr(vae_cfg, "latents_mean", None) is not None
            and hasattr(scheduler, "set_begin_index") and hasattr(scheduler, "sigmas"))


def tail_steps(steps: int, strength: float) -> int:
    """Denoising steps an edit runs of a `steps`-step schedule."""
    return min(steps, max(1, round(steps * strength)))


def first_frame(frames: np.ndarray, image: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(the source frames, the first frame an image-to-video edit is conditioned on): the source's own
    first frame, or `image` resized to the source's size as the pipeline resizes one (Lanczos), which
    then also becomes the source's first frame. `frames` is changed in place when it is writable."""
    if image is None:
        return frames, frames[0]
    h, w = frames.shape[1:3]
    if image.shape[:2] != (h, w):
        from PIL import Image

        image = np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.LANCZOS))
    if not frames.flags.writeable:
        frames = frames.copy()
    frames[0] = image
    return frames, image


def prepare(pipe: Any, frames: np.ndarray, strength: float, steps: int, seed: int,
            fps: float) -> tuple[dict[str, Any], Callable[[], None]]:
    """(the call's extra kwargs: the noised `latents`; a function that puts the pipeline's scheduler back).
    Runs on the thread that then calls the pipeline; the scheduler stays swapped until then. `fps`: the
    frame rate the call makes (LTX-2's audio stream is as long as the video at it)."""
    import torch

    from omni_actors.workers.engines import video_edit_ltx2

    if type(pipe).__name__ in video_edit_ltx2.EDITABLE:
        return video_edit_ltx2.prepare(pipe, frames, strength, steps, fps), _nothing
    latents = encode(pipe, frames)
    original = pipe.scheduler
    tail = _tail_scheduler(original, strength)
    tail.set_timesteps(steps, device=latents.device)  # (the pipeline's call sets the same again)
    sigma = float(tail.sigmas[tail.begin_index])
    noise = torch.randn(latents.shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    noised = sigma * noise.to(latents.device) + (1.0 - sigma) * latents.float()
    pipe.scheduler = tail

    def restore() -> None:
        pipe.scheduler = original

    return {"latents": noised.to(latents.dtype)}, restore


def _nothing() -> None:
    pass


def encode(pipe: Any, frames: np.ndarray) -> Any:
    """uint8 [F, H, W, 3] frames as the pipeline's normalised latents [1, C, F', H', W'] (its VAE's mode)."""
    import torch

    vae = pipe.vae
    device = next(vae.parameters()).device
    latents = encode_raw(vae, frames)
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=device, dtype=latents.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=device, dtype=latents.dtype).view(shape)
    return (latents - mean) / std


def encode_raw(vae: Any, frames: np.ndarray) -> Any:
    """uint8 [F, H, W, 3] frames as `vae`'s latents [1, C, F', H', W'] (the mode of its distribution)."""
    import torch

    device = next(vae.parameters()).device
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(device)
    x = x.permute(3, 0, 1, 2)[None].to(vae.dtype) / 127.5 - 1.0  # [1, 3, F, H, W] in [-1, 1]
    with torch.inference_mode():
        return vae.encode(x).latent_dist.mode()


def _tail_scheduler(scheduler: Any, strength: float) -> Any:
    """A copy of `scheduler` whose schedule is the last `tail_steps` of what it would set."""
    tail = copy.deepcopy(scheduler)
    set_full = tail.set_timesteps

    def set_timesteps(num_inference_steps: int, *args: Any, **kwargs: Any) -> None:
        set_full(num_inference_steps, *args, **kwargs)
        start = num_inference_steps - tail_steps(num_inference_steps, strength)
        tail.timesteps = tail.timesteps[start * tail.order:]
        tail.set_begin_index(start * tail.order)

    tail.set_timesteps = set_timesteps
    return tail
