"""POST /v1/images/generations: text to image, answered as base64 or as URLs this server serves (PNG, JPEG, WebP).

What goes into the pipeline:

    inputs  {"prompt", "negative_prompt"}
    params  {n, width, height, num_inference_steps, guidance_scale, seed}   (only those given;
            width/height from `size` "WxH"; diffusion fields at the top level or in `extra_body`,
            top level wins)
    stages  planner's choice, else pipeline.stages_for_outputs({"image"})

Image chunks come back as StageChunk(output_type="image", data={"images": uint8
[n, H, W, C] (or one [H, W, C])}); progress chunks without "images" are skipped.
A diffusion model that only edits is a 400 pointing at /v1/images/edits. `output_compression` is the
JPEG / WebP quality; `background: "transparent"` is a 400 unless the model makes layers; `quality` and
`style` are accepted without effect (docs/media.md).
Images are encoded in the thread pool, each on its own (PNG by png.py, 2-3x faster than PIL);
`response_format: "url"` links go to image_files.py.
`answer_images` is shared with the edits route (image_edits.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import re
import time
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    route_model,
)
from omni_actors.api.diffusion_caps import (
    MAX_GUIDANCE_SCALE,
    require_input,
    require_size,
    require_task,
    served_caps,
)
from omni_actors.api.errors import bad_request
from omni_actors.api.image_files import FILES_KEY
from omni_actors.api.png import encode_png
from omni_actors.api.schemas import ImageData, ImageRequest, ImagesResponse, read_body
from omni_actors.orchestrator.outputs import ImageOutput

ROUTE = "/v1/images/generations"
MAX_SIDE = 4096
"""Largest width or height accepted in `size`."""
GENERATION_TASKS = {"text-to-image", "class-to-image", "unconditional-image"}
_SIZE = re.compile(r"([0-9]+)x([0-9]+)")
r"""WIDTHxHEIGHT in ASCII digits (`\d` would take other scripts' digits)."""


def size_sides(size: str) -> tuple[int, int] | None:
    """(width, height) of a "WIDTHxHEIGHT" size, any case; None if it is not one. A side past nine
    digits reads as MAX_SIDE + 1 (past every bound; int() refuses 4,300 digits)."""
    found = _SIZE.fullmatch(size.lower())
    if found is None:
        return None
    w, h = (int(side) if len(side) <= 9 else MAX_SIDE + 1 for side in found.groups())
    return w, h


def parse_size(size: str | None) -> tuple[int, int] | None:
    if size is None or size == "auto":
        return None
    sides = size_sides(size)
    if sides is None:
        raise bad_request(f"size {size!r} is not WIDTHxHEIGHT (e.g. 512x512) or auto", "size")
    w, h = sides
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise bad_request(f"size {size!r}: width and height must be in 1..{MAX_SIDE}", "size")
    return w, h


def require_background(caps: Any, background: str | None, fmt: str = "png") -> None:
    """`background`: "auto" / "opaque" are what every model makes; "transparent" only a layered one's RGBA layers.
    JPEG has no alpha: on a layered model `output_format: "jpeg"` is a 400 naming output_format, as OpenAI
    answers "transparent" with "jpeg" (before 2026-12-05 the layers came back with their alpha dropped)."""
    layered = caps is not None and "image-to-layers" in caps.tasks
    if background == "transparent" and not layered:
        raise bad_request("background 'transparent' cannot be produced: this model makes opaque images "
                          "(use 'auto' or 'opaque')", "background")
    if fmt == "jpeg" and layered:
        raise bad_request("output_format 'jpeg' has no alpha channel and this model's layers are RGBA: "
                          "use 'png' or 'webp'", "output_format", "unsupported_value")


def encode_image(img: np.ndarray, fmt: str, compression: int | None = None) -> bytes:
    """`fmt` bytes; `compression` (OpenAI's `output_compression`, 0-100) is the JPEG / WebP quality
    (None: PIL's default); PNG is lossless and takes none."""
    from PIL import Image

    arr = np.ascontiguousarray(img, dtype=np.uint8)
    if fmt == "png" and (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (1, 3, 4))):
        return encode_png(arr)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    pil = Image.fromarray(arr)
    if fmt == "jpeg" and pil.mode == "RGBA":
        pil = pil.convert("RGB")  # JPEG has no alpha
    buf = io.BytesIO()
    pil.save(buf, format=fmt.upper(), **({"quality": compression} if compression is not None else {}))
    return buf.getvalue()


def encode_b64(img: np.ndarray, fmt: str, compression: int | None = None) -> str:
    return base64.b64encode(encode_image(img, fmt, compression)).decode()


async def encode_images(images: list[np.ndarray], fmt: str, b64: bool = False,
                        compression: int | None = None) -> list[Any]:
    """Each image encoded (as base64 text with `b64`) in the loop's thread pool, all at once:
    the codecs release the GIL, so n images take about as long as one."""
    fn = encode_b64 if b64 else encode_image
    return list(await asyncio.gather(*(off_loop(fn, img, fmt, compression) for img in images)))


async def collect_images(call: PipelineCall) -> list[np.ndarray]:
    images: list[np.ndarray] = []
    async for chunk in call:
        if isinstance(chunk.output, ImageOutput) and chunk.output.images is not None:
            arr = chunk.output.images
            images.extend(arr if arr.ndim == 4 else [arr])
    return images


async def answer_images(request: web.Request, images: list[np.ndarray], fmt: str,
                        response_format: str | None, compression: int | None = None) -> web.Response:
    """The OpenAI images answer: base64 data, or links served by this server for a while."""
    h, w = (images[0].shape[0], images[0].shape[1]) if images else (0, 0)
    expires: int | None = None
    if response_format == "url":
        names, expires = request.app[FILES_KEY].put_all(await encode_images(images, fmt, compression=compression), fmt)
        data = [ImageData(url=f"{request.scheme}://{request.host}/v1/files/images/{name}") for name in names]
    else:
        data = [ImageData(b64_json=text) for text in await encode_images(images, fmt, True, compression)]
    body = ImagesResponse(created=int(time.time()), data=data, output_format=fmt, size=f"{w}x{h}",
                          expires_at=expires)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def check_guidance(value: float | None) -> float | None:
    """`value` unless it is outside [0, MAX_GUIDANCE_SCALE]: then a 400 naming guidance_scale with OpenAI's
    bound code (decimal_below_min_value / decimal_above_max_value), for generations and edits alike. A NaN
    (a form's "nan") is above nothing: `invalid_value` (it was `decimal_above_max_value` before 2026-12-05)."""
    if value is not None and math.isnan(value):
        raise bad_request("guidance_scale must be a number, got NaN", "guidance_scale", "invalid_value")
    if value is not None and not 0.0 <= value <= MAX_GUIDANCE_SCALE:
        code = "decimal_below_min_value" if value < 0 else "decimal_above_max_value"
        raise bad_request(f"guidance_scale must be a number in [0, {MAX_GUIDANCE_SCALE:g}], got {value:g}",
                          "guidance_scale", code)
    return value


def require_streamable(response_format: str | None, stream: bool) -> None:
    """`stream` with `response_format: "url"` is a 400 naming response_format: OpenAI's stream events
    (the SDK's ImageGenStreamEvent / ImageEditStreamEvent) carry `b64_json` and have no place for a URL
    (before 2026-12-05 the stream went out as base64 regardless)."""
    if stream and response_format == "url":
        raise bad_request("response_format 'url' cannot be streamed: stream events carry the image as b64_json; "
                          "leave response_format out (or b64_json), or drop stream", "response_format",
                          "unsupported_value")


def diffusion_params(req: Any, size: tuple[int, int] | None) -> dict[str, Any]:
    extra = req.extra_body

    def pick(name: str) -> Any:
        top = getattr(req, name)
        return top if top is not None else (getattr(extra, name) if extra else None)

    return drop_none({
        "n": req.n,
        "width": size[0] if size else None,
        "height": size[1] if size else None,
        "num_inference_steps": pick("num_inference_steps"),
        "guidance_scale": check_guidance(pick("guidance_scale")),
        "seed": pick("seed"),
    })


async def generations(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, ImageRequest)
    if not req.prompt.strip():  # (as /v1/images/edits answers it)
        raise bad_request("`prompt` is blank", "prompt", "invalid_value")
    orch, _ = route_model(request, req.model, {"image"})
    caps = served_caps(orch)
    require_task(orch, caps, GENERATION_TASKS, ROUTE)
    size = parse_size(req.size)
    require_size(caps, *(size or (None, None)))
    fmt = req.output_format or "png"
    require_background(caps, req.background, fmt)
    params = diffusion_params(req, size)
    negative = req.negative_prompt if req.negative_prompt is not None else (
        req.extra_body.negative_prompt if req.extra_body else None)
    require_input(caps, "negative_prompt", negative)
    inputs = drop_none({"prompt": req.prompt, "negative_prompt": negative})
    if req.stream_progress and not req.stream:
        raise bad_request("stream_progress needs stream: true (progress comes as stream events)", "stream_progress")
    require_streamable(req.response_format, req.stream)
    if req.stream:
        from omni_actors.api.image_stream import stream_images

        return await stream_images(request, ROUTE, inputs, params, fmt, req.partial_images or 0,
                                   "image_generation", req.output_compression, req.stream_progress)
    async with PipelineCall(request, ROUTE, inputs, params, {"image"}) as call:
        images = await collect_images(call)
    return await answer_images(request, images, fmt, req.response_format, req.output_compression)
