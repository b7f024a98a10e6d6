"""POST /v1/images/generations: text to image, answered as base64 PNG (or JPEG / WebP).

What goes into the pipeline:

    inputs  {"prompt", "negative_prompt"}
    params  {n, width, height, num_inference_steps, guidance_scale, seed}   (only those given;
            width/height from `size` "WxH"; diffusion fields at the top level or in `extra_body`,
            top level wins)
    stages  planner's choice, else pipeline.stages_for_outputs({"image"})

Image chunks come back as StageChunk(output_type="image", data={"images": uint8
[n, H, W, 3] (or one [H, W, 3])}); progress chunks without "images" are skipped.
Images are encoded in a thread. `response_format: "url"` is refused (400): this
server stores nothing to link to.
"""

from __future__ import annotations

import base64
import io
import re
import time

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    orchestrator,
    require_model,
    require_outputs,
)
from omni_actors.api.errors import bad_request
from omni_actors.api.schemas import ImageData, ImageRequest, ImagesResponse, read_body

ROUTE = "/v1/images/generations"
MAX_SIDE = 4096
"""Largest width or height accepted in `size`."""
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def parse_size(size: str | None) -> tuple[int, int] | None:
    if size is None or size == "auto":
        return None
    found = _SIZE.match(size)
    if not found:
        raise bad_request(f"size {size!r} is not WIDTHxHEIGHT (e.g. 512x512) or auto", "size")
    w, h = int(found.group(1)), int(found.group(2))
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise bad_request(f"size {size!r}: width and height must be in 1..{MAX_SIDE}", "size")
    return w, h


def encode_images(images: list[np.ndarray], fmt: str) -> list[str]:
    from PIL import Image

    out = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8)).save(buf, format=fmt.upper())
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


async def generations(request: web.Request) -> web.Response:
    orch = orchestrator(request)
    req = await read_body(request, ImageRequest)
    require_model(orch, req.model)
    require_outputs(orch, {"image"}, "model")
    if req.response_format == "url":
        raise bad_request("response_format 'url' is not supported; use 'b64_json'", "response_format",
                          "unsupported_value")
    size = parse_size(req.size)
    extra = req.extra_body
    params = drop_none({
        "n": req.n,
        "width": size[0] if size else None,
        "height": size[1] if size else None,
        "num_inference_steps": req.num_inference_steps if req.num_inference_steps is not None
        else (extra.num_inference_steps if extra else None),
        "guidance_scale": req.guidance_scale if req.guidance_scale is not None
        else (extra.guidance_scale if extra else None),
        "seed": req.seed if req.seed is not None else (extra.seed if extra else None),
    })
    negative = req.negative_prompt if req.negative_prompt is not None else (extra.negative_prompt if extra else None)
    inputs = drop_none({"prompt": req.prompt, "negative_prompt": negative})
    images: list[np.ndarray] = []
    async with PipelineCall(request, ROUTE, inputs, params, {"image"}) as call:
        async for chunk in call:
            if chunk.output_type == "image" and "images" in chunk.data:
                arr = np.asarray(chunk.data["images"])
                images.extend(arr if arr.ndim == 4 else [arr])
    fmt = req.output_format or "png"
    encoded = await off_loop(encode_images, images, fmt)
    h, w = (images[0].shape[0], images[0].shape[1]) if images else (0, 0)
    body = ImagesResponse(created=int(time.time()), data=[ImageData(b64_json=b) for b in encoded],
                          output_format=fmt, size=f"{w}x{h}")
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
