"""Multipart form parts read under the server's body limit (server.max_body_mb over all the parts)."""

from __future__ import annotations

from typing import Any

from omni_actors.api.errors import ApiError

READ_CHUNK = 1 << 16
"""Bytes read from a part at a time (the limit is checked after each)."""


class BodyBudget:
    """What a form body may still bring: reading past `max_bytes` in all is a 413 that closes the connection."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0

    async def read(self, part: Any) -> bytearray:
        """The whole of one form part (an aiohttp BodyPartReader)."""
        data = bytearray()
        while chunk := await part.read_chunk(READ_CHUNK):
            self.total += len(chunk)
            if self.total > self.max_bytes:
                raise ApiError(413, f"request body is over the limit of {self.max_bytes} bytes", None,
                               "body_too_large", close=True)
            data += chunk
        return data
