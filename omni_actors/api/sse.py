"""Server-sent events: one `data: <json>` event per object, `data: [DONE]` to end, errors in-band.

    async with SSEWriter(request) as sse:
        await sse.send(struct_or_dict); ...
        return await sse.done()

Events are coalesced: `send` only queues; a flusher task writes everything
queued in one write as soon as the handler yields to the event loop (it waits
for the next pipeline output). A burst of outputs that arrive together costs
one syscall instead of one each, and nothing waits longer than the handler's
own turn. A write failure (client gone) is raised from the next `send`.

After the headers are sent an error can no longer change the status; it goes
out as `data: {"error": {...}}` (the openai SDK raises APIError on it), then
the stream ends without `[DONE]`.
"""

from __future__ import annotations

import asyncio
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
        self._buf: list[bytes] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._error: BaseException | None = None
        self._flusher: asyncio.Task | None = None

    async def __aenter__(self) -> SSEWriter:
        await self.resp.prepare(self.request)
        self.request[RESPONSE_STARTED] = True
        self._flusher = asyncio.ensure_future(self._flush_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def send(self, event: Any) -> None:
        if self._error is not None:
            raise self._error
        self._buf.append(b"data: " + _encoder.encode(event) + b"\n\n")
        self._wake.set()

    async def _flush_loop(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            await self._write_pending()

    async def _write_pending(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        self._buf.clear()
        try:
            await self.resp.write(data)
        except (ConnectionError, RuntimeError) as err:  # client gone / transport closed
            self._error = err
            self._closing = True

    async def _finish(self, last: bytes) -> web.StreamResponse:
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
        if self._error is not None:
            raise self._error
        self._buf.append(last)
        await self._write_pending()
        if self._error is not None:
            raise self._error
        await self.resp.write_eof()
        return self.resp

    async def done(self) -> web.StreamResponse:
        return await self._finish(b"data: [DONE]\n\n")

    async def fail(self, error: ApiError) -> web.StreamResponse:
        return await self._finish(b"data: " + _encoder.encode(error.body()) + b"\n\n")

    async def end(self) -> web.StreamResponse:
        """End without `[DONE]` (speech SSE ends with its own `speech.audio.done` event)."""
        return await self._finish(b"")
