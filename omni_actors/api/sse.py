"""Server-sent events: the one streamed-response skeleton (`data: <json>` events, `[DONE]`, errors in-band).

    return await respond(request, events())      # every streamed route: an async iterator of events

    async with SSEWriter(request) as sse:          # what `respond` runs on
        await sse.send(struct_or_dict); ...
        return await sse.done()

Events are coalesced: `send` queues; a flusher task writes everything queued
in one write as soon as the handler yields to the event loop (it waits for the
next pipeline output). A burst of outputs that arrive together costs one
syscall instead of one each.

Backpressure: the flusher's write waits for the transport to drain, and `send`
waits while more than SSE_PENDING_BYTES are queued behind it. So a client that
reads slowly slows the handler, which stops taking the request's output
stream (bounded by `server.stream_buffer_mb` in the orchestrator); a client
that stops reading is cut off by the connection's write timeout
(`server.write_timeout_s`, api/server.py), which fails the pending write and
so the next `send` (ConnectionError), and the route's PipelineCall aborts the
request in every stage.

After the headers are sent an error can no longer change the status; it goes
out as `data: {"error": {...}}` (the openai SDK raises APIError on it), then
the stream ends without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api.errors import IN_BAND_ERROR, RESPONSE_STARTED, ApiError, from_exception
from omni_actors.errors import RequestError

SSE_PENDING_BYTES = 256 * 1024
"""Encoded events queued for the socket before `send` waits for the flusher to take them."""

_encoder = msgspec.json.Encoder()


async def respond(request: web.Request, events: AsyncGenerator[Any, None], *, done: bool = True,
                  headers: dict[str, str] | None = None, named: bool = False) -> web.StreamResponse:
    """Send each event of `events` as it comes, then `[DONE]` (or nothing more: `done=False`).
    A RequestError out of `events` ends the stream with an in-band error event. `headers` go
    beside the stream's own; `named`: each event has an `event: <its type>` line too, as OpenAI's
    Responses stream does (clients that dispatch on the SSE event name need it)."""
    async with SSEWriter(request, headers, named) as sse, contextlib.aclosing(events):  # (closed at once on any exit)
        try:
            async for event in events:
                await sse.send(event)
        except RequestError as err:  # headers are out: report in-band
            return await sse.fail(from_exception(err))
        return await (sse.done() if done else sse.end())


class _Kind(msgspec.Struct):
    type: str = ""


_kind = msgspec.json.Decoder(_Kind)


def _event_name(event: Any) -> str:
    """An event's `type` (a struct's, a dict's or an encoded one's), for its `event:` line."""
    if isinstance(event, msgspec.Raw):
        return _kind.decode(event).type
    if isinstance(event, msgspec.Struct) and event.__struct_config__.tag_field == "type":  # (a tag: no attribute)
        return str(event.__struct_config__.tag)
    kind = event.get("type") if isinstance(event, dict) else getattr(event, "type", "")
    return kind if isinstance(kind, str) else ""


class SSEWriter:
    def __init__(self, request: web.Request, headers: dict[str, str] | None = None, named: bool = False) -> None:
        self.request = request
        self.named = named
        self.resp = web.StreamResponse(headers={
            **(headers or {}),
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        })
        self._buf: list[bytes] = []
        self._pending = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
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
        """Queue one event; waits while the client is behind by more than SSE_PENDING_BYTES."""
        if self._error is not None:
            raise self._error
        data = b"data: " + _encoder.encode(event) + b"\n\n"
        if self.named and (name := _event_name(event)):
            data = b"event: " + name.encode() + b"\n" + data
        self._buf.append(data)
        self._pending += len(data)
        self._wake.set()
        while self._pending > SSE_PENDING_BYTES and self._error is None:
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error

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
        self._pending = 0
        self._room.set()
        try:
            await self.resp.write(data)  # waits for the transport to drain
        except (ConnectionError, RuntimeError) as err:  # client gone / transport closed or timed out
            self._error = err
            self._closing = True
            self._room.set()

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
        self.request[IN_BAND_ERROR] = error.code or "none"
        return await self._finish((b"event: error\n" if self.named else b"") + b"data: "
                                  + _encoder.encode(error.body()) + b"\n\n")

    async def end(self) -> web.StreamResponse:
        """End without `[DONE]` (speech SSE ends with its own `speech.audio.done` event)."""
        return await self._finish(b"")
