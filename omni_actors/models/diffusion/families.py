"""Per-class facts about diffusers pipelines that their `__call__` signature does not show.

Every image family this server knows by name; a class missing here gets the
defaults (image optional if its call takes one, sides a multiple of 8).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyFacts:
    image_required: bool = False
    """Its call fails without `image` (an edit-only pipeline)."""
    max_input_images: int = 1
    min_image_side: int = 0
    """Input images need at least this many pixels on each side."""
    image_input: bool = True
    """False where the call takes `image` but that path fails with the installed libraries (not offered)."""
    one_prompt: bool = False
    """Its call takes one prompt and one generator (an AR prior seeded from it): each request runs alone."""
    image_list: bool = False
    """Its call takes `image` as a list even when it holds one image."""
    image_mode: str = "RGB"
    """The PIL mode input images are converted to (Qwen-Image-Layered's VAE reads RGBA; the others
    take RGB, and some fail on an RGBA or grayscale file as it is)."""
    mask_required: bool = False
    """Its call fails without `mask_image` (an inpainting pipeline)."""
    own_size: bool = False
    """Its call takes `width`/`height` but overrides them with a size of its own (the input image's,
    or about a megapixel at its aspect): `size` is not offered, and the output has that size."""
    image_multiple: int = 0
    """Input images are resized to the nearest sides that are multiples of this, and a request with
    no size gets the resized input's (GLM-Image: its prior and its DiT read a condition image at
    scales that agree only then, and its call needs the size before it looks at the image); 0:
    input images are taken as they are."""
    max_image_aspect: float = 0.0
    """Input images whose long side is more than this many times the short one are refused; 0: any."""
    size_multiple: int = 8
    """Latent side times patch size: width and height must be multiples of it."""
    guidance_param: str = "guidance_scale"
    """The call argument a request's `guidance_scale` sets (Qwen-Image's classifier-free
    guidance is `true_cfg_scale`; its `guidance_scale` is for guidance-distilled weights)."""
    preview: str = "auto"
    """How streamed previews decode mid-run latents, as the pipeline's own `__call__` decodes its
    final ones (a recipe of workers/engines/diffusion_preview.py): "auto" picks by the latents'
    layout; "packed_scaled" (LongCat), "packed_bn" (FLUX.2), "mean_std" (GLM-Image), "layered"
    (Qwen-Image-Layered), "none"."""


_DEFAULT = FamilyFacts()
VL_ASPECT = 100.0
"""The edit families whose prompt encoder reads the image through Qwen2-VL's processor: it refuses
an image more than 200 x longer than wide once the pipeline has rounded its sides (a 1x500 input
is 1:268 by then); half of that leaves room for the rounding."""
_FACTS: dict[str, FamilyFacts] = {
    "QwenImagePipeline": FamilyFacts(guidance_param="true_cfg_scale", size_multiple=16),
    "QwenImageEditPipeline": FamilyFacts(guidance_param="true_cfg_scale", image_required=True, size_multiple=16,
                                         max_image_aspect=VL_ASPECT),
    # Qwen-Image-Edit-2509 ("Plus") composes up to three reference images.
    "QwenImageEditPlusPipeline": FamilyFacts(guidance_param="true_cfg_scale", image_required=True, max_input_images=3,
                                             size_multiple=16, max_image_aspect=VL_ASPECT),
    "QwenImageLayeredPipeline": FamilyFacts(guidance_param="true_cfg_scale", image_required=True, size_multiple=16,
                                            image_mode="RGBA", preview="layered", max_image_aspect=VL_ASPECT),
    "Flux2Pipeline": FamilyFacts(max_input_images=10, size_multiple=16, min_image_side=64, preview="packed_bn"),
    "Flux2KleinPipeline": FamilyFacts(max_input_images=10, size_multiple=16, min_image_side=64,
                                      preview="packed_bn"),
    "ZImagePipeline": FamilyFacts(size_multiple=16),
    "HunyuanImagePipeline": FamilyFacts(size_multiple=32),
    # Image-to-image takes one condition image (diffusers concatenates the images' prior features, so
    # several would have to share a size); it needs fixes.py's work-around for diffusers 0.42.1.
    "GlmImagePipeline": FamilyFacts(size_multiple=32, one_prompt=True, image_list=True, image_multiple=32,
                                    max_image_aspect=4.0, preview="mean_std"),
    "LongCatImagePipeline": FamilyFacts(size_multiple=16, preview="packed_scaled"),
    "StableDiffusionInpaintPipeline": FamilyFacts(image_required=True, mask_required=True),
    # The inpainting families (diffusers 0.42): the image and the mask are required (their call
    # reads `image.size` or raises without them); their `strength` keeps its default (Qwen 0.6, Klein 0.8).
    "QwenImageInpaintPipeline": FamilyFacts(guidance_param="true_cfg_scale", image_required=True,
                                            mask_required=True, size_multiple=16),
    # Paints at about a megapixel at the input's aspect (sides multiples of 16), whatever size is asked.
    "QwenImageEditInpaintPipeline": FamilyFacts(guidance_param="true_cfg_scale", image_required=True,
                                                mask_required=True, size_multiple=16, own_size=True,
                                                max_image_aspect=VL_ASPECT),
    # Paints at the input's size, each side rounded down to a multiple of 16 (at most a megapixel);
    # extra references go to `image_reference`, not offered here, so one image.
    "Flux2KleinInpaintPipeline": FamilyFacts(image_required=True, mask_required=True, size_multiple=16,
                                             min_image_side=16, own_size=True, preview="packed_bn"),
    "LongCatImageEditPipeline": FamilyFacts(image_required=True, size_multiple=16, preview="packed_scaled",
                                            max_image_aspect=VL_ASPECT),
}


def family_facts(class_name: str) -> FamilyFacts:
    return _FACTS.get(class_name, _DEFAULT)


def known_classes() -> list[str]:
    """The pipeline classes this module has facts about (named in errors as examples)."""
    return sorted(_FACTS)
