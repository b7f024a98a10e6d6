"""A batch line's request sent through the app's own routes, as a client's request goes.

    loopback = Loopback(app); await loopback.start()
    status, headers, body = await loopback.post("/v1/chat/completions", body_bytes)
    await loopback.close()

The app is served a second time, on a Unix socket in a private (0700) runtime directory of its own
(bus.sockets.RuntimeDir: removed at close, or by a later run if this process is killed), by its own
request handler (`Application._make_handler`, what aiohttp's AppRunner serves a site with): every
middleware (auth, limits, metrics, errors) and every route's own checks run for a line exactly as
for a direct call, so its answer (a 400's body, a 429, a 504) is the one a client would have had.
The public listener is not used: its address is not known to the app (a port of 0, a wildcard
host), and batch lines must not take the connection cap's places from clients.

Requests carry the first configured API key (checked there as on the public port). Cancelling a
`post` closes its connection, which cancels the route's handler (`handler_cancellation`) and
aborts its request in every stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from aiohttp.web_server import Server

from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.bus.sockets import RuntimeDir

SHUTDOWN_TIMEOUT_S = 5.0
"""Longest close waits for the loopback's handlers still running (each has been cancelled by then)."""
SOCKET_NAME = "b.sock"
"""The socket in its runtime directory (a short name: the path must fit a socket address)."""
HOST = "batch.internal"
"""The Host the loopback's requests name (nothing resolves it: the connector dials the socket)."""


class Loopback:
    """The app served on a private socket, and a client session for it (`lines` connections at most)."""

    def __init__(self, app: web.Application, lines: int) -> None:
        self.app = app
        self.lines = lines
        self._dir: RuntimeDir | None = None
        self._server: Server | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._starting = asyncio.Lock()
        keys = app[PIPELINES_KEY].default.deploy.server.api_keys
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {keys[0]}"} if keys else {})}

    async def start(self) -> None:
        """Listen, once (the app frozen: at its start-up or later); nothing is left open if it fails."""
        async with self._starting:
            if self._session is not None:
                return
            self._dir = RuntimeDir()
            path = str(self._dir.path / SOCKET_NAME)
            try:
                self._server = self.app._make_handler(loop=asyncio.get_running_loop())  # (as AppRunner serves it)
                self._listener = await asyncio.get_running_loop().create_unix_server(self._server, path=path)
            except BaseException:
                await self.close()
                raise
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path, limit=self.lines),
                timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False)

    async def post(self, path: str, body: bytes) -> tuple[int, Mapping[str, str], bytes]:
        """POST `body` (JSON) to the app's route `path`; (status, headers, body) as answered."""
        assert self._session is not None
        async with self._session.post(f"http://{HOST}{path}", data=body, headers=self.headers) as resp:
            return resp.status, resp.headers, await resp.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
            self._listener = None
        if self._server is not None:
            await self._server.shutdown(SHUTDOWN_TIMEOUT_S)
            self._server = None
        if self._dir is not None:
            self._dir.close()
            self._dir = None
