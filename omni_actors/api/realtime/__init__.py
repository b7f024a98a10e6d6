"""The OpenAI-Realtime-compatible WebSocket endpoint (/v1/realtime)."""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application) -> None:
    """Register /v1/realtime on `app` (filled in by the realtime package)."""
