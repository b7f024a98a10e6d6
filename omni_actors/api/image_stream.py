"""Streamed image answers (`stream: true`): OpenAI's `<prefix>.partial_image` events, then one `<prefix>.completed` per image.

The prefix is `image_generation` for /v1/images/generations and `image_edit`
for /v1/images/edits. Partial images are the engine's previews (params
`partial_images`: how many, decoded from the latents mid-run; progress chunks
carry them as {"preview": uint8 [n, H, W, C]}); the first image of each
preview is sent, numbered from 0. With `progress` (the request's `stream_progress`,
this server's extension) each progress chunk is also a `<prefix>.progress` event
{step, total, progress, phase}, so a client can draw a bar before any preview. Errors
after the headers end the stream with an in-band error event.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import PipelineCall
from omni_actors.api.errors import from_exception
from omni_actors.api.images import encode_b64
from omni_actors.api.schemas import ImageProgressEvent, ImageStreamEvent
from omni_actors.api.sse import SSEWriter
from omni_actors.errors import RequestError
from omni_actors.orchestrator.outputs import ImageOutput


async def stream_images(request: web.Request, route: str, inputs: dict[str, Any], params: dict[str, Any],
                        fmt: str, partial_images: int, prefix: str,
                        compression: int | None = None, progress: bool = False) -> web.StreamResponse:
    """`compression`: OpenAI's `output_compression`, the JPEG / WebP quality (images.py encode_image)."""
    if partial_images:
        params = {**params, "partial_images": partial_images}
    async with PipelineCall(request, route, inputs, params, {"image"}) as call:
        await call.started()  # an error before the first output keeps its HTTP status
        async with SSEWriter(request, named=True) as sse:  # (`event:` lines, as OpenAI's image stream has)
            index = 0
            try:
                async for chunk in call:
                    out = chunk.output
                    if not isinstance(out, ImageOutput):
                        continue
                    if progress and out.images is None and out.progress is not None:
                        p = out.progress
                        await sse.send(ImageProgressEvent(type=f"{prefix}.progress", step=p.step, total=p.total,
                                                          progress=p.fraction, phase=p.phase,
                                                          created_at=int(time.time())))
                    if out.preview is not None and index < partial_images:
                        img = out.preview[0]
                        await sse.send(ImageStreamEvent(
                            type=f"{prefix}.partial_image", b64_json=await off_loop(encode_b64, img, fmt, compression),
                            created_at=int(time.time()), size=f"{img.shape[1]}x{img.shape[0]}",
                            output_format=fmt, partial_image_index=index))
                        index += 1
                    if out.images is not None:
                        arr = out.images
                        for img in arr if arr.ndim == 4 else [arr]:
                            await sse.send(ImageStreamEvent(
                                type=f"{prefix}.completed", b64_json=await off_loop(encode_b64, img, fmt, compression),
                                created_at=int(time.time()), size=f"{img.shape[1]}x{img.shape[0]}",
                                output_format=fmt))
            except RequestError as err:
                return await sse.fail(from_exception(err))
            return await sse.end()
