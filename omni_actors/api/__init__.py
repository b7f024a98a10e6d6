"""The HTTP layer: aiohttp app with REST routes, SSE, the realtime WebSocket, errors."""
