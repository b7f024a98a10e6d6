"""The inpainting classes of the installed diffusers get their own facts, not defaults read off their `__call__`.

Defaults gave them text-to-image (their call needs an image), an optional mask, sides in multiples of 8
and, for Qwen, a request's guidance sent to `guidance_scale` (ignored there: its CFG is `true_cfg_scale`).
"""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")  # the class's __call__ is read from the installed diffusers' source

from omni_actors.models.diffusion.capabilities import call_params, caps_from_params

CASES = [  # class, guidance parameter, whether a request's size is taken
    ("QwenImageInpaintPipeline", "true_cfg_scale", True),
    ("QwenImageEditInpaintPipeline", "true_cfg_scale", False),  # about a megapixel at the input's aspect
    ("Flux2KleinInpaintPipeline", "guidance_scale", False),  # the input's size
]


@pytest.mark.parametrize(("class_name", "guidance", "sized"), CASES)
def test_an_inpaint_class_needs_image_and_mask_and_guides_through_its_own_parameter(
    class_name: str, guidance: str, sized: bool
) -> None:
    params = call_params(class_name)
    assert guidance in params and "mask_image" in params
    caps = caps_from_params(class_name, params)
    assert caps.tasks == ("image-edit", "inpaint")
    assert (caps.image_input, caps.mask_required, caps.max_input_images) == ("required", True, 1)
    assert caps.size_multiple == 16
    assert caps.guidance_param == guidance
    assert ("size" in caps.inputs) is sized
    assert {"prompt", "image", "mask", "guidance_scale"} <= set(caps.inputs)
