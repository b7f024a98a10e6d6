"""Images answered as `response_format: "url"`: held in memory for IMAGE_URL_TTL_S, served at /v1/files/images/{id}.

An OpenAI image URL is a short-lived link, not stored work, so nothing goes to
disk: each file is dropped by a timer when it expires (no sweep loop), the
oldest first when the store is over MAX_STORED_BYTES (never one of the answer being
stored: an answer larger than the bound alone is kept whole, as a single image is),
and all of them when the app shuts down. The id is 128 random bits: the link is the capability, as with
OpenAI's signed URLs, so fetching it needs no API key (middleware.CAPABILITY_PREFIXES).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

from omni_actors.api.errors import ApiError

IMAGE_URL_TTL_S = 3600.0
"""How long an image URL answers (OpenAI's own links last an hour)."""
MAX_STORED_BYTES = 256 * 1024 * 1024
"""Memory all stored images may take; past it the oldest are dropped early."""
ROUTE = "/v1/files/images/{name}"
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@dataclass
class _File:
    data: bytes
    content_type: str
    expires_at: float
    timer: asyncio.TimerHandle


class ImageFiles:
    """The in-memory store behind image URLs; one per app."""

    def __init__(self, ttl_s: float = IMAGE_URL_TTL_S, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, _File] = OrderedDict()
        self._bytes = 0

    def put(self, data: bytes, fmt: str) -> tuple[str, int]:
        """Store one encoded image; return its file name and the Unix time it expires."""
        names, expires = self.put_all([data], fmt)
        return names[0], expires

    def put_all(self, blobs: list[bytes], fmt: str) -> tuple[list[str], int]:
        """Store one answer's encoded images; return their file names and the Unix time they expire.
        Older files make room for them, never one another: a link is not dead when it is handed out."""
        loop = asyncio.get_running_loop()
        expires = time.time() + self.ttl_s
        names = []
        for data in blobs:
            name = f"img_{secrets.token_hex(16)}.{fmt}"
            timer = loop.call_later(self.ttl_s, self._drop, name)
            self._files[name] = _File(data, CONTENT_TYPES[fmt], expires, timer)
            self._bytes += len(data)
            names.append(name)
        while self._bytes > self.max_bytes and len(self._files) > len(names):
            self._drop(next(iter(self._files)))  # the oldest (the new ones are last)
        return names, int(expires)

    def get(self, name: str) -> _File | None:
        return self._files.get(name)

    def __len__(self) -> int:
        return len(self._files)

    def _drop(self, name: str) -> None:
        f = self._files.pop(name, None)
        if f is not None:
            f.timer.cancel()
            self._bytes -= len(f.data)

    def clear(self) -> None:
        for name in list(self._files):
            self._drop(name)


FILES_KEY = web.AppKey("image_files", ImageFiles)


def add_routes(app: web.Application) -> None:
    app[FILES_KEY] = ImageFiles()
    app.router.add_get(ROUTE, serve_file)

    async def _clear(app: web.Application) -> None:
        app[FILES_KEY].clear()

    app.on_cleanup.append(_clear)


async def serve_file(request: web.Request) -> web.Response:
    f = request.app[FILES_KEY].get(request.match_info["name"])
    if f is None:
        raise ApiError(404, "no such image (image URLs expire after "
                       f"{request.app[FILES_KEY].ttl_s:g} s)", None, "file_not_found")
    return web.Response(body=f.data, content_type=f.content_type,
                        headers={"Cache-Control": f"private, max-age={max(0, int(f.expires_at - time.time()))}"})
