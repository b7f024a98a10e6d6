"""Multipart form bodies: parts read under the server's body limit (server.max_body_mb over all the
parts), and whatever aiohttp's reader cannot parse answered as a 400, on every upload route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NoReturn

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from omni_actors.api.errors import ApiError, bad_request

READ_CHUNK = 1 << 16
"""Bytes read from a part at a time (the limit is checked after each)."""
MULTIPART_ERRORS = (ValueError, AssertionError, LookupError, HttpProcessingError, web.RequestPayloadError)
"""What aiohttp's multipart reader raises on a body it cannot parse (no or an over-long boundary,
control characters or too many headers in a part, a body cut short, ...)."""


def _unparsable(err: BaseException) -> NoReturn:
    detail = err.message if isinstance(err, HttpProcessingError) else str(err)
    raise ApiError(400, f"cannot parse the multipart/form-data body: {str(detail)[:200]}", None,
                   "invalid_multipart", close=True) from None


async def form_parts(request: web.Request) -> AsyncIterator[BodyPartReader]:
    """Each named part of a multipart/form-data body in order. A body the reader cannot parse, a
    nested multipart part or a part without a name is a 400 (the connection closes after it)."""
    try:
        reader = await request.multipart()
    except MULTIPART_ERRORS as err:
        _unparsable(err)
    while True:
        try:
            part = await reader.next()
            name = part.name if isinstance(part, BodyPartReader) else None
        except MULTIPART_ERRORS as err:
            _unparsable(err)
        if part is None:
            return
        if not isinstance(part, BodyPartReader):
            raise bad_request("nested multipart parts are not accepted; send each field as its own part",
                              None, "invalid_multipart")
        if not name:
            raise bad_request("a form part has no name (Content-Disposition: form-data; name=...)", None,
                              "invalid_multipart")
        yield part


class BodyBudget:
    """What a form body may still bring: reading past `max_bytes` in all is a 413 that closes the connection."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0

    async def read(self, part: Any) -> bytearray:
        """The whole of one form part (an aiohttp BodyPartReader)."""
        data = bytearray()
        while chunk := await _chunk(part):
            self.total += len(chunk)
            if self.total > self.max_bytes:
                raise ApiError(413, f"request body is over the limit of {self.max_bytes} bytes", None,
                               "body_too_large", close=True)
            data += chunk
        return data


async def _chunk(part: Any) -> bytes:
    try:
        return await part.read_chunk(READ_CHUNK)
    except MULTIPART_ERRORS as err:
        _unparsable(err)
