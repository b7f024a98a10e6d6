"""Server-sent events: one `data: <json>` event per object, `data: [DONE]` to end, errors in-band.

    sse = SSEWriter(request); await sse.start()
    await sse.send(struct_or_dict); ...; await sse.done()

After the headers are sent an error can no longer change the status; it goes
out as `data: {"error": {...}}` (the openai SDK raises APIError on it), then
the stream ends without `[DONE]`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api.errors import RESPONSE_STARTED, ApiError

_encoder = msgspec.json.Encoder()


class SSEWriter:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        })

    async def start(self) -> None:
        await self.resp.prepare(self.request)
        self.request[RESPONSE_STARTED] = True

    async def send(self, event: Any) -> None:
        await self.resp.write(b"data: " + _encoder.encode(event) + b"\n\n")

    async def done(self) -> web.StreamResponse:
        await self.resp.write(b"data: [DONE]\n\n")
        await self.resp.write_eof()
        return self.resp

    async def fail(self, error: ApiError) -> web.StreamResponse:
        await self.send(error.body())
        await self.resp.write_eof()
        return self.resp
