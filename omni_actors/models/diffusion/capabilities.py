"""What a diffusers pipeline class can do (tasks, inputs, output kind), read from its `__call__` signature.

Two readers, one rule. The worker has the class and passes its real signature
(`caps_from_params`); the API process must not import torch, so it finds the
class's source file inside the installed diffusers and reads the `__call__`
parameter names with `ast` (`folder_caps`). Facts a signature cannot show
(an edit pipeline whose `image` is required, how many images it takes, the
side multiple its latents need) live per class in `families.py`.

Output kinds: "image" here; a pipeline whose call takes `num_frames` is
"video", one taking `audio_end_in_s` / `audio_length_in_s` is "audio" (served
by other routes; the engine converts each kind in diffusion_outputs.py).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from omni_actors.errors import ConfigError
from omni_actors.models.diffusion.families import family_facts, known_classes

VIDEO_PARAMS = frozenset({"num_frames"})
AUDIO_PARAMS = frozenset({"audio_end_in_s", "audio_length_in_s"})
CONDITIONING = ("prompt", "class_labels", "batch_size")
"""How a pipeline is asked for output: by prompt, class label or batch size."""
SUPPORTED = (
    "supported: diffusers pipelines whose __call__ takes prompt, class_labels or batch_size, "
    f"e.g. {', '.join(known_classes())}"
)


class VideoFacts(msgspec.Struct, frozen=True):
    """What a video family makes, as its routes check it (its engine_defaults, the deploy's
    engine_extras on top): frames per second, at most `max_frames` frames, counts of
    k * frame_multiple + 1."""

    fps: float
    max_frames: int
    frame_multiple: int


class DiffusionCaps(msgspec.Struct, frozen=True):
    """What one diffusers pipeline class serves; `/v1/models` shows it as `capabilities`."""

    pipeline_class: str
    output_kind: str
    """"image", "video" or "audio"."""
    tasks: tuple[str, ...]
    """"text-to-image", "image-edit", "inpaint", "image-to-layers", "image-to-video", ..."""
    inputs: tuple[str, ...]
    """Request fields it accepts: "prompt", "negative_prompt", "image", "mask", "size", ..."""
    image_input: str = "none"
    """"none", "optional" or "required"."""
    max_input_images: int = 0
    min_image_side: int = 0
    """Input images smaller than this on either side are refused (FLUX.2: 64)."""
    size_multiple: int = 8
    """Width and height must be multiples of this."""
    layered: bool = False
    """Each output is a stack of RGBA layers, returned as separate images."""
    guidance_param: str = "guidance_scale"
    """The call argument a request's `guidance_scale` sets."""
    one_prompt: bool = False
    """Each request runs alone with one prompt and one generator (GLM-Image's AR prior)."""
    image_list: bool = False
    """The call takes `image` as a list even for one image (GLM-Image)."""
    image_mode: str = "RGB"
    """The PIL mode input images are converted to before the call."""
    mask_required: bool = False
    """An edit without a mask is refused (inpainting)."""
    image_multiple: int = 0
    """Input images are resized to sides that are multiples of this (0: as they are); without a
    size, the output takes the resized input's."""
    max_image_aspect: float = 0.0
    """Input images more elongated than this (long side / short side) are refused (0: any)."""
    video: VideoFacts | None = None
    """A video family's frame facts (None for images and audio)."""

    def taken_size(self, width: int, height: int) -> tuple[int, int]:
        """The size an input image of width x height goes to the pipeline at (see image_multiple)."""
        m = self.image_multiple
        if not m:
            return width, height
        return max(m, round(width / m) * m), max(m, round(height / m) * m)

    def elongation_error(self, width: int, height: int) -> str | None:
        """Why an input image of this size is refused (max_image_aspect, at its taken size); None: it is not."""
        w, h = self.taken_size(width, height)
        if not self.max_image_aspect or max(w, h) <= self.max_image_aspect * min(w, h):
            return None
        m = f" once its sides are rounded to multiples of {self.image_multiple} px" if self.image_multiple else ""
        return (f"{width}x{height} is more elongated than {self.pipeline_class} takes{m} "
                f"(its long side may be at most {self.max_image_aspect:g} x the short one)")  # fmt: skip


def caps_from_params(class_name: str, params: Iterable[str]) -> DiffusionCaps:
    """The capabilities of `class_name` given its `__call__` parameter names."""
    names = frozenset(params)
    facts = family_facts(class_name)
    if not any(c in names for c in CONDITIONING):
        raise ConfigError(
            f"{class_name}: not a pipeline this server can call (its __call__ takes none of "
            f"{', '.join(CONDITIONING)}); {SUPPORTED}"
        )
    kind = "video" if names & VIDEO_PARAMS else "audio" if names & AUDIO_PARAMS else "image"
    takes_image = "image" in names and facts.image_input
    image_input = "none"
    if takes_image:
        image_input = "required" if facts.image_required else "optional"
    layered = "layers" in names
    tasks: list[str] = []
    if "prompt" in names and image_input != "required":
        tasks.append(f"text-to-{kind}")
    elif "prompt" not in names:
        tasks.append(f"class-to-{kind}" if "class_labels" in names else f"unconditional-{kind}")
    if takes_image:
        if layered:
            tasks.append("image-to-layers")
        elif kind == "image":
            tasks.append("image-edit")
        else:
            tasks.append(f"image-to-{kind}")
    if "mask_image" in names:
        tasks.append("inpaint")
    inputs = [n for n in ("prompt", "negative_prompt") if n in names]
    if takes_image:
        inputs.append("image")
    if "mask_image" in names:
        inputs.append("mask")
    if {"width", "height"} <= names and not facts.own_size:
        inputs.append("size")
    inputs += [n for n in ("num_inference_steps", "guidance_scale", "layers") if n in names]
    if takes_image and "strength" in names:
        inputs.append("strength")
    return DiffusionCaps(
        pipeline_class=class_name,
        output_kind=kind,
        tasks=tuple(tasks),
        inputs=tuple(inputs),
        image_input=image_input,
        max_input_images=(facts.max_input_images if takes_image else 0),
        min_image_side=facts.min_image_side if takes_image else 0,
        size_multiple=facts.size_multiple,
        layered=layered,
        guidance_param=facts.guidance_param if facts.guidance_param in names else "guidance_scale",
        one_prompt=facts.one_prompt,
        image_list=facts.image_list and takes_image,
        image_mode=facts.image_mode,
        mask_required=facts.mask_required and "mask_image" in names,
        image_multiple=facts.image_multiple if takes_image else 0,
        max_image_aspect=facts.max_image_aspect if takes_image else 0.0,
    )


def folder_class(folder: str | Path) -> str:
    """The pipeline class a diffusers folder names in its model_index.json."""
    index = Path(folder) / "model_index.json"
    try:
        name = json.loads(index.read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"{index}: cannot read _class_name: {err}") from None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{index}: no _class_name string")
    return name


def folder_caps(folder: str | Path) -> DiffusionCaps:
    """Capabilities of the pipeline in a diffusers folder, read without importing torch."""
    name = folder_class(folder)
    return caps_from_params(name, call_params(name))


@functools.cache
def call_params(class_name: str) -> tuple[str, ...]:
    """`__call__` parameter names of a diffusers pipeline class, from its source (following bases)."""
    node = _class_node(class_name)
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "__call__":
            a = item.args
            return tuple(p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs][1:])
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id not in ("DiffusionPipeline", "object"):
            try:
                return call_params(base.id)
            except ConfigError:
                continue
    raise ConfigError(f"{class_name}: no __call__ found in diffusers; it is not a pipeline this server serves")


def _class_node(class_name: str) -> ast.ClassDef:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", class_name):
        raise ConfigError(f"{class_name!r} is not a class name")
    path = _pipeline_files().get(class_name)
    if path is None:
        raise ConfigError(f"{class_name} is not a pipeline class of the installed diffusers "
                          f"{importlib.metadata.version('diffusers')}; {SUPPORTED}")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node
    raise ConfigError(f"{class_name}: not found in {path}")


@functools.cache
def _pipeline_files() -> dict[str, Path]:
    spec = importlib.util.find_spec("diffusers")  # top level: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("diffusers is not installed")
    root = Path(next(iter(spec.submodule_search_locations))) / "pipelines"
    found: dict[str, Path] = {}
    pattern = re.compile(r"^class (\w+)\(", re.M)
    for path in sorted(root.rglob("*.py")):
        for name in pattern.findall(path.read_text(errors="replace")):
            found.setdefault(name, path)
    return found
