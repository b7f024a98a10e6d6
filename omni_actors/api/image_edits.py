"""POST /v1/images/edits: OpenAI's image edit upload route (multipart/form-data) on edit, inpaint and layered pipelines.

Form fields: `image` (one file, repeated, or `image[]` as the openai SDK sends a
list), optional `mask`, `prompt`, and the generation fields of
/v1/images/generations as text (`n`, `size`, `seed`, `num_inference_steps`,
`guidance_scale`, `negative_prompt`, `response_format`, `output_format`,
`stream`, `partial_images`, `output_compression`, `background`; `layers` for a layered pipeline;
`strength` (0-1] for a pipeline that re-noises its input, e.g. an inpaint one; `stream_progress`
(this server's: step events while streaming, as /v1/images/generations takes it);
`quality`, `input_fidelity` and `moderation` are checked and have no effect; `user` and its successor
`safety_identifier` are taken and unused). Files are decoded
here, in a thread (upright by their EXIF orientation, unless it is unreadable; 16-bit greyscale
scaled to 8 bits; a colour-key transparency as alpha; at most chat_inputs.MAX_IMAGE_PIXELS,
checked before decoding), to uint8 arrays that cross the bus in shared memory:

    inputs  {"prompt", "negative_prompt", "image": [uint8 [H, W, 3|4], ...], "mask": uint8 [H, W]}

An OpenAI mask edits where it is transparent; a mask without alpha is taken as
diffusers takes it (white = repaint). Bad files and fields are 400s naming the
field; a model that cannot edit is a 400 saying what it does. Without `size`, a pipeline that takes one
edits at the input's size rounded down to its `size_multiple` (default_size).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    route_model,
)
from omni_actors.api.chat_inputs import open_image
from omni_actors.api.diffusion_caps import require_input, require_size, require_task, served_caps
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.image_upright import readable, upright
from omni_actors.api.images import (
    MAX_SIDE,
    answer_images,
    check_guidance,
    collect_images,
    parse_size,
    require_background,
    require_streamable,
)
from omni_actors.api.multipart import BodyBudget, form_parts, misplaced_part

ROUTE = "/v1/images/edits"
EDIT_TASKS = {"image-edit", "inpaint", "image-to-layers"}
MAX_INPUT_IMAGES = 16
TEXT_FIELDS = frozenset({
    "prompt", "model", "n", "size", "response_format", "output_format", "seed", "num_inference_steps",
    "guidance_scale", "negative_prompt", "stream", "partial_images", "quality", "background",
    "input_fidelity", "user", "output_compression", "moderation", "layers", "strength", "stream_progress",
    "safety_identifier",
})  # fmt: skip
FORMATS = ("png", "jpeg", "webp")
CHOICES = {
    "background": ("auto", "opaque", "transparent"),
    "quality": ("auto", "low", "medium", "high", "xhigh", "max", "standard", "hd"),  # no effect (docs/media.md)
    "input_fidelity": ("high", "low"),  # accepted, no effect: the pipelines read the whole input image
    "moderation": ("auto", "low"),  # accepted, no effect: this server runs no moderation model
}
"""Form fields with a fixed set of values (the schema's ImageRequest checks the JSON route's)."""


async def _read_form(request: web.Request, max_bytes: int) -> tuple[dict[str, str], list[bytes], bytes | None]:
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send multipart/form-data "
                       "with an `image` file", None, "unsupported_media_type")
    fields: dict[str, str] = {}
    images: list[bytes] = []
    mask: bytes | None = None
    budget = BodyBudget(max_bytes)
    async for part in form_parts(request):
        name = part.name or ""
        if name not in TEXT_FIELDS and name not in ("image", "image[]", "mask"):
            raise bad_request(f"unknown form field `{name}`", name, "unknown_parameter")
        if name in fields or (name == "mask" and mask is not None):
            raise bad_request(f"form field `{name}` is given twice", name)
        if (misplaced := misplaced_part(part, name, name not in TEXT_FIELDS)) is not None:
            raise misplaced
        data = await budget.read(part)
        if name in ("image", "image[]"):
            if len(images) >= MAX_INPUT_IMAGES:
                raise bad_request(f"at most {MAX_INPUT_IMAGES} images", "image")
            images.append(bytes(data))
        elif name == "mask":
            mask = bytes(data)
        else:
            fields[name] = data.decode("utf-8", errors="replace").strip()
    if not images:
        raise bad_request("form field `image` is required (the image to edit)", "image", "missing_required_parameter")
    return fields, images, mask


def _open(blob: bytes, what: str, param: str) -> Any:
    """`blob` opened (chat_inputs.open_image), upright and readable."""
    return readable(upright(open_image(blob, param, what)))


def _decode(blobs: list[bytes], mask: bytes | None) -> tuple[list[np.ndarray], np.ndarray | None]:
    out = []
    for i, blob in enumerate(blobs):
        img = _open(blob, f"image {i}", "image")
        out.append(np.asarray(img.convert("RGBA" if "A" in img.getbands() else "RGB")))
    if mask is None:
        return out, None
    m = _open(mask, "mask", "mask")
    # OpenAI: transparent = edit here; without alpha, white = repaint (diffusers' convention)
    arr = 255 - np.asarray(m.getchannel("A")) if "A" in m.getbands() else np.asarray(m.convert("L"))
    if arr.shape[:2] != out[0].shape[:2]:
        raise bad_request(f"mask is {arr.shape[1]}x{arr.shape[0]} but the image is "
                          f"{out[0].shape[1]}x{out[0].shape[0]}; they must match", "mask", "invalid_mask")
    return out, np.ascontiguousarray(arr, dtype=np.uint8)


def _number(fields: dict[str, str], name: str, cast: Callable[[str], Any], ok: Callable[[Any], bool],
            rule: str) -> Any:
    """Form field `name` through `cast` (int or float), passing `ok`; a 400 saying `rule` when it does not."""
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        v = cast(raw)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise bad_request(f"{name} must be {kind}, got {raw!r}", name) from None
    if not ok(v):
        raise bad_request(f"{name} must be {rule}, got {raw}", name)
    return v


def _int(fields: dict[str, str], name: str, lo: int, hi: int) -> int | None:
    return _number(fields, name, int, lambda v: lo <= v <= hi, f"in [{lo}, {hi}]")


def _float(fields: dict[str, str], name: str, ok: Callable[[float], bool], rule: str) -> float | None:
    return _number(fields, name, float, ok, rule)


def _flag(fields: dict[str, str], name: str) -> bool:
    """A boolean form field: "true" or "false" (any case; the SDK sends them lower case), absent is false."""
    raw = fields.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise bad_request(f"{name} must be true or false, got {fields[name]!r}", name)
    return raw == "true"


def _choices(fields: dict[str, str]) -> None:
    for name, allowed in CHOICES.items():
        if name in fields and fields[name] not in allowed:
            raise bad_request(f"{name} must be one of {list(allowed)}, got {fields[name]!r}", name)


def default_size(width: int, height: int, multiple: int) -> tuple[int, int]:
    """The size an edit without `size` is made at: the input's, scaled down to MAX_SIDE on its long side if
    larger (keeping the aspect), each side rounded down to the pipeline's multiple (at least one multiple).
    Left to the pipeline, a family whose call defaults to a square (Stable Diffusion inpaint) painted a
    1000x750 input at 512x512; the answer's `size` says what was made."""
    scale = min(1.0, MAX_SIDE / max(width, height))
    w, h = (max(multiple, int(side * scale) // multiple * multiple) for side in (width, height))
    return w, h


def _params(fields: dict[str, str]) -> dict[str, Any]:
    size = parse_size(fields.get("size"))
    g = check_guidance(_float(fields, "guidance_scale", lambda v: True, "a number"))
    return drop_none({
        "n": _int(fields, "n", 1, 10),
        "width": size[0] if size else None,
        "height": size[1] if size else None,
        "num_inference_steps": _int(fields, "num_inference_steps", 1, 1000),
        "guidance_scale": g,
        "seed": _int(fields, "seed", 0, (1 << 63) - 1),
        "layers": _int(fields, "layers", 1, 16),
        "strength": _float(fields, "strength", lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    })


async def image_edits(request: web.Request) -> web.StreamResponse:
    server = orchestrator(request).deploy.server  # (the same for every pipeline)
    max_bytes = int(server.max_body_mb * 1024 * 1024)
    try:
        async with asyncio.timeout(server.body_timeout_s):
            fields, blobs, mask_blob = await _read_form(request, max_bytes)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {server.body_timeout_s:g} s", None,
                       "body_timeout", close=True) from None
    orch, _ = route_model(request, fields.get("model") or None, {"image"})
    caps = served_caps(orch)
    require_task(orch, caps, EDIT_TASKS, ROUTE)
    if not fields.get("prompt"):
        raise bad_request("form field `prompt` is required", "prompt", "missing_required_parameter")
    fmt = fields.get("output_format") or "png"
    if fmt not in FORMATS:
        raise bad_request(f"output_format must be one of {list(FORMATS)}, got {fmt!r}", "output_format")
    response_format = fields.get("response_format") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise bad_request(f"response_format must be b64_json or url, got {response_format!r}", "response_format")
    _choices(fields)
    require_background(caps, fields.get("background"), fmt)
    compression = _int(fields, "output_compression", 0, 100)
    stream, progress = _flag(fields, "stream"), _flag(fields, "stream_progress")
    partial = _int(fields, "partial_images", 0, 3) or 0
    if progress and not stream:
        raise bad_request("stream_progress needs stream=true (progress comes as stream events)", "stream_progress")
    require_streamable(response_format, stream)
    params = _params(fields)
    if caps is not None and params.get("width") is not None and "size" not in caps.inputs:
        raise bad_request(f"size: {caps.pipeline_class} paints at a size of its own (from the input image); "
                          "leave size out", "size", "unsupported_parameter")
    require_size(caps, params.get("width"), params.get("height"))
    require_input(caps, "negative_prompt", fields.get("negative_prompt"))
    require_input(caps, "strength", params.get("strength"))
    if caps is not None and len(blobs) > max(caps.max_input_images, 1):
        raise bad_request(f"{caps.pipeline_class} takes at most {caps.max_input_images} image(s), got {len(blobs)}",
                          "image")
    if caps is not None and mask_blob is not None and "mask" not in caps.inputs:
        raise bad_request(f"{caps.pipeline_class} does not take a mask", "mask")
    if caps is not None and mask_blob is None and caps.mask_required:
        raise bad_request(f"{caps.pipeline_class} needs a mask (white where the image is to be painted)",
                          "mask", "missing_required_parameter")
    images, mask = await off_loop(_decode, blobs, mask_blob)
    if caps is not None and any(min(im.shape[:2]) < caps.min_image_side for im in images):
        side = caps.min_image_side
        raise bad_request(f"{caps.pipeline_class} needs input images of at least {side}x{side} pixels",
                          "image", "invalid_image")
    for im in images if caps is not None else ():
        if (why := caps.elongation_error(im.shape[1], im.shape[0])) is not None:
            raise bad_request(f"image: {why}", "image", "invalid_image")
    if "width" not in params and caps is not None and "size" in caps.inputs and not caps.image_multiple:
        h, w = images[0].shape[:2]  # (an image_multiple family's engine sizes it from the resized input)
        params["width"], params["height"] = default_size(w, h, caps.size_multiple)
    inputs = drop_none({"prompt": fields["prompt"], "negative_prompt": fields.get("negative_prompt"),
                        "image": images, "mask": mask})
    if stream:
        from omni_actors.api.image_stream import stream_images

        return await stream_images(request, ROUTE, inputs, params, fmt, partial, "image_edit", compression,
                                   progress)
    async with PipelineCall(request, ROUTE, inputs, params, {"image"}) as call:
        out = await collect_images(call)
    return await answer_images(request, out, fmt, response_format, compression)
