"""The image converter on real pipeline outputs: output_type "pt" rounded on the device gives the very
pixels that diffusers' "np" output gives through numpy's rounding (the engine's path before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("diffusers")

from omni_actors.models.tiny import make_tiny
from omni_actors.models.tiny.diffusion import make_tiny_diffusion
from omni_actors.workers.engines.diffusion_loading import load_pipeline
from omni_actors.workers.engines.diffusion_outputs import image_arrays, rounded_uint8

CALLS: dict[str, dict[str, Any]] = {
    "sd": {"prompt": ["a cat", "a dog"], "width": 32, "height": 48, "num_inference_steps": 2},
    "dit": {"class_labels": [1, 2], "num_inference_steps": 2},
    "ddpm": {"batch_size": 2, "num_inference_steps": 2},
    "qwen_image": {"prompt": ["a cat", "a dog"], "width": 32, "height": 32, "num_inference_steps": 2},
    "flux2": {"prompt": ["a cat", "a dog"], "width": 32, "height": 32, "num_inference_steps": 2},
}


def _numpy_rounding(images: np.ndarray) -> np.ndarray:
    return (np.clip(images, 0.0, 1.0) * 255.0).round().astype(np.uint8)


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_pt_output_rounded_on_the_device_equals_the_numpy_path(kind: str, tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    folder = (make_tiny_diffusion(tmp_path / kind, seed=0, kind=kind) if kind in ("sd", "dit", "ddpm")
              else make_tiny(kind, tmp_path / kind, seed=0))
    pipe = load_pipeline(folder, "cpu", "auto")

    def call(output_type: str) -> Any:
        gens = [torch.Generator("cpu").manual_seed(7 + i) for i in range(2)]
        return pipe(**CALLS[kind], generator=gens, output_type=output_type)

    want = np.asarray(call("np").images)
    pt = call("pt")
    got = image_arrays(pt)["images"]
    assert got.dtype == np.uint8 and got.shape[0] == 2 and got.shape[-1] == 3
    if want.dtype != np.uint8:
        want = _numpy_rounding(want)
    assert np.array_equal(got, want)
    if isinstance(pt.images, torch.Tensor):  # what a GPU batch goes through (here on the CPU)
        assert np.array_equal(rounded_uint8(pt.images).numpy(), want)
    assert not np.array_equal(got[0], got[1])  # two seeds: the rows are not one image twice
