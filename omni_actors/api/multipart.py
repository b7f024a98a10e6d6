"""Multipart form bodies: parts read under the server's body limit (server.max_body_mb over all the
parts), and whatever aiohttp's reader cannot parse answered as a 400, on every upload route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from omni_actors.api.calls import orchestrator
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
    nested multipart part, a part without a name or with one that is not UTF-8 is a 400 (the connection
    closes after it)."""
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
        if not is_utf8(name):
            # aiohttp keeps a header's bytes that are not UTF-8 as lone surrogates: no field's name
            raise bad_request(f"a form part's name is not UTF-8: {ascii(name)[:80]}", None, "invalid_multipart")
        yield part


def is_utf8(text: str) -> bool:
    """`text` can be written as UTF-8 (aiohttp keeps a header's bytes that are not as lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def misplaced_part(part: Any, name: str, file_field: bool, hint: str = "") -> ApiError | None:
    """A 400 naming `name` when a form part came as the other kind: a text field sent as a file (a part with a
    filename: before 2026-12-05 a prompt file's bytes became the prompt), or a file field sent as text (no
    filename and no Content-Type, or a text/* one; `hint` says what else the field takes). None when the
    part is of its field's kind."""
    if not file_field and part.filename is not None:
        return bad_request(f"`{name}` is a text field but came as a file part (filename {part.filename!r}); "
                           "send its value as a plain form field", name, "invalid_type")
    kind = part.headers.get("Content-Type", "text/plain")
    if file_field and part.filename is None and kind.startswith("text/"):
        return bad_request(f"`{name}` is a file upload but came as a text field (or as a file with an empty "
                           f"name); send the file as a file part with a filename{hint}", name, "invalid_type")
    return None


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


async def read_form(request: web.Request, files: set[str], fields: set[str],
                    filenames: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, bytes]]:
    """Text fields (stripped) and file parts of a multipart upload, read under the server's body size
    and time limits: a 415 unless it is multipart, a 400 naming an unknown or repeated field. The
    file parts' own names go into `filenames` when given."""
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send multipart/form-data",
                       None, "unsupported_media_type")
    server = orchestrator(request).deploy.server
    limit = int(server.max_body_mb * 1024 * 1024)

    async def read() -> tuple[dict[str, str], dict[str, bytes]]:
        texts: dict[str, str] = {}
        blobs: dict[str, bytes] = {}
        budget = BodyBudget(limit)
        async for part in form_parts(request):
            name = part.name or ""
            if name not in files | fields:
                raise bad_request(f"unknown form field `{name}`; expected {sorted(files | fields)}", name,
                                  "unknown_parameter")
            if name in texts or name in blobs:
                raise bad_request(f"form field `{name}` is given twice", name)
            if (misplaced := misplaced_part(part, name, name in files)) is not None:
                raise misplaced
            data = await budget.read(part)
            if name in files:
                blobs[name] = bytes(data)
                if filenames is not None:
                    filenames[name] = part.filename or ""
            else:
                texts[name] = data.decode("utf-8", errors="replace").strip()
        return texts, blobs

    try:
        async with asyncio.timeout(server.body_timeout_s):
            return await read()
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {server.body_timeout_s:g} s", None,
                       "body_timeout", close=True) from None
