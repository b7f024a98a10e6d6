"""Streamed previews decode latents as each pipeline's own `__call__` decodes them: the preview of the
last step's latents is the pipeline's output image. A recipe that raises gives no preview, logged once."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("diffusers")

from structlog.testing import capture_logs

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engines.diffusion_loading import load_pipeline
from omni_actors.workers.engines.diffusion_outputs import image_arrays
from omni_actors.workers.engines.diffusion_preview import decode_preview, preview

STEPS = 2
CALLS: dict[str, dict[str, Any]] = {
    "qwen_image": {"prompt": ["a cat", "a dog"], "width": 48, "height": 32},
    "flux2": {"prompt": ["a cat", "a dog"], "width": 48, "height": 32},
    "longcat_image": {"prompt": ["a cat", "a dog"], "width": 48, "height": 32},
    "glm_image": {"prompt": "a cat", "width": 64, "height": 32},
}


def _rgba(seed: int = 0) -> Any:
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 4), dtype=np.uint8))


def _run(pipe: Any, call: dict[str, Any], output_type: str) -> tuple[Any, Any]:
    """The pipeline's output and its latents after the last step."""
    import torch

    seen: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:

        def on_step_end(_pipe: Any, i: int, _t: Any, kw: dict[str, Any]) -> dict[str, Any]:
            seen["latents"] = kw["latents"].clone()
            return {}

        extra["callback_on_step_end"] = on_step_end
    else:  # as the engine does for such a pipeline (LongCat): the scheduler step's new latents
        step = pipe.scheduler.step

        def step_and_keep(*args: Any, **kw: Any) -> Any:
            out = step(*args, **kw)
            seen["latents"] = (out[0] if isinstance(out, tuple) else out.prev_sample).clone()
            return out

        pipe.scheduler.step = step_and_keep
    n = len(call["prompt"]) if isinstance(call["prompt"], list) else 1
    gens = [torch.Generator("cpu").manual_seed(3 + i) for i in range(n)]
    out = pipe(**call, num_inference_steps=STEPS, generator=gens if n > 1 else gens[0], output_type=output_type,
               **extra)
    return out, seen["latents"]


@pytest.mark.parametrize("kind", [
    "qwen_image", "flux2", "longcat_image", "glm_image",
])
def test_the_last_steps_preview_is_the_pipelines_image(kind: str, tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    pipe = load_pipeline(make_tiny(kind, tmp_path / kind, seed=0), "cpu", "auto")
    call = CALLS[kind]
    out, latents = _run(pipe, call, "pt")
    want = image_arrays(out)["images"]
    got = decode_preview(pipe, latents, call)
    assert got is not None and got.shape == want.shape, (None if got is None else got.shape, want.shape)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert want.std() > 0  # an image, not a constant


def test_layered_preview_is_its_layers_composited(tmp_path: Path) -> None:
    """QwenImageLayeredPipeline's `_unpack_latents` takes `layers`: the shared recipe raised TypeError
    inside the step callback and failed the whole batch."""
    import torch

    torch.set_num_threads(1)
    pipe = load_pipeline(make_tiny("qwen_image_layered", tmp_path / "layered", seed=0), "cpu", "auto")
    call = {"prompt": "x", "image": _rgba(), "layers": 2}
    out, latents = _run(pipe, call, "pil")
    stacks = out.images
    got = decode_preview(pipe, latents, call)
    layers = np.stack([np.asarray(im, np.float64) / 255 for im in stacks[0]])  # [layers, H, W, 4]
    assert got is not None and got.shape == (1, *layers.shape[1:3], 4)
    color, alpha = layers[0, ..., :3] * layers[0, ..., 3:], layers[0, ..., 3:]
    for layer in layers[1:]:
        a = layer[..., 3:]
        color, alpha = layer[..., :3] * a + color * (1 - a), a + alpha * (1 - a)
    want = np.concatenate([np.where(alpha > 0, color / np.maximum(alpha, 1e-6), color), alpha], -1)
    assert np.abs(got[0] / 255 - want).max() <= 3 / 255


def test_a_preview_that_raises_is_none_and_logged_once(tmp_path: Path) -> None:
    import torch

    pipe = load_pipeline(make_tiny("qwen_image", tmp_path / "q", seed=0), "cpu", "auto")
    odd = torch.zeros(1, 4, 6)  # packed latents whose channels do not unpack
    with capture_logs() as logs:
        assert preview(pipe, odd, {"width": 32, "height": 32}) is None
        assert preview(pipe, odd, {"width": 32, "height": 32}) is None
    failed = [e for e in logs if e["event"] == "diffusion.preview_failed"]
    assert len(failed) == 1 and failed[0]["pipeline"] == "QwenImagePipeline"
    good = torch.zeros(1, 4, 64)  # previews stay off for this pipeline once one has failed
    assert preview(pipe, good, {"width": 32, "height": 32}) is None
