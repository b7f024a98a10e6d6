"""The HTTP listener: the app on a TCP port, with a connection cap, a header timeout and a write timeout.

    server = await start_server(build_app(orch), host, port, deploy.server)
    server.url ...; await server.close()

Both `omni-run` and the tests listen through this, so what is tested is what runs.

aiohttp serves each connection with its RequestHandler protocol; a thin
protocol in front of it (one `_Guard` per connection, made by `ConnectionGate`)
adds what aiohttp lacks:

- Connection cap (`server.max_connections`). At the cap a new connection pushes
  out the oldest connection that is waiting for a request head with nothing left
  to write (idle keep-alive, or a stalled partial head), so a flood of stalled
  sockets can hold neither the file limit nor `/health`. When every connection
  is busy with a request, the new one is answered 503 and closed.
- Write timeout (`server.write_timeout_s`). A connection whose transport has
  paused writing (its client stopped taking bytes) for that long is aborted.
  aiohttp then cancels its handler (`handler_cancellation`), the pending write
  fails, and the route's PipelineCall aborts the request in every stage. This
  covers SSE, chunked audio and WebSockets alike.

At start the process's soft open-files limit is raised (up to the hard limit)
to fit the cap plus FD_RESERVE, so the cap is reached before the file limit.

The header timeout is aiohttp's own keep-alive timer, armed when a connection
opens and after each response (`keepalive_timeout=server.header_timeout_s`): a
connection still without a complete request head when it fires is closed.
"""

from __future__ import annotations

import asyncio
import json
import resource
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from omni_actors import logs
from omni_actors.config.deploy import ServerConfig

log = logs.get(__name__)

SHUTDOWN_TIMEOUT_S = 5.0
"""Longest wait at close for handlers still running."""
FD_RESERVE = 512
"""File descriptors the main process needs besides client connections (the bus, shared-memory
segments, logs, the data directory); the cap on connections is useless if they cannot fit."""

_FULL_BODY = json.dumps({"error": {
    "message": "too many open connections: every connection is serving a request (server.max_connections)",
    "type": "server_error", "param": None, "code": "too_many_connections"}}).encode()
_FULL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: " + str(len(_FULL_BODY)).encode() + b"\r\n\r\n" + _FULL_BODY)


class _Refused(asyncio.Protocol):
    """A connection over the cap when none can be pushed out: 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        transport.write(_FULL)
        transport.close()


class _Guard(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's handler; times out stalled writes."""

    def __init__(self, gate: ConnectionGate, inner: RequestHandler) -> None:
        self.gate = gate
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self._stall: asyncio.TimerHandle | None = None
        self.aborted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        self.transport = transport
        if self.aborted:  # pushed out between accept and now
            transport.abort()
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()
        if self._stall is None:
            self._stall = asyncio.get_running_loop().call_later(self.gate.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self.gate.forget(self)
        if self.inner.transport is not None:  # (aiohttp's handler saw connection_made)
            self.inner.connection_lost(exc)

    def _write_timed_out(self) -> None:
        self._stall = None
        self.gate.write_timeouts += 1
        log.info("http.write_timeout", timeout_s=self.gate.write_timeout_s)
        self.abort()

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self.gate.aborting += 1
            if self.transport is not None:
                self.transport.abort()  # connection_lost follows on the next loop turn

    def idle(self) -> bool:
        """Waiting for a request head with nothing left to write: safe to push out.

        Reads two RequestHandler internals of aiohttp 3.14 (pinned in requirements/cpu.txt);
        tests/api/test_connections.py fails if they change meaning."""
        if self.aborted:
            return False
        if self.transport is None:  # accepted, not yet connected: has sent nothing
            return True
        h = self.inner
        return (not self.transport.is_closing() and not h._request_in_progress and not h._messages
                and self.transport.get_write_buffer_size() == 0)


class ConnectionGate:
    """The listening socket's protocol factory: aiohttp's handler behind a `_Guard`, within the cap."""

    def __init__(self, server: web.Server, max_connections: int, write_timeout_s: float) -> None:
        self.server = server
        self.max_connections = max_connections
        self.write_timeout_s = write_timeout_s
        self.open: dict[_Guard, None] = {}  # oldest first
        self.aborting = 0
        self.pushed_out = 0
        self.refused = 0
        self.write_timeouts = 0

    @property
    def connections(self) -> int:
        """Open connections, not counting those being aborted."""
        return len(self.open) - self.aborting

    def forget(self, guard: _Guard) -> None:
        if guard in self.open:
            del self.open[guard]
            self.aborting -= guard.aborted

    def __call__(self) -> asyncio.Protocol:
        if self.connections >= self.max_connections:
            victim = next((g for g in self.open if g.idle()), None)
            if victim is None:
                self.refused += 1
                log.warning("http.connections_full", limit=self.max_connections)
                return _Refused()
            self.pushed_out += 1
            victim.abort()
        guard = _Guard(self, self.server())
        self.open[guard] = None  # counted now: the loop may accept several before any connection_made
        return guard


class _GatedSite(web.BaseSite):
    """A TCP site whose connections go through a ConnectionGate."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, gate: ConnectionGate) -> None:
        super().__init__(runner)
        self._host, self._port, self.gate = host, port, gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._server = await asyncio.get_running_loop().create_server(
            self.gate, self._host, self._port, reuse_address=True)


@dataclass
class ApiServer:
    runner: web.AppRunner
    gate: ConnectionGate
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


def ensure_fd_room(max_connections: int) -> int:
    """Raise this process's soft open-files limit to fit `max_connections` plus FD_RESERVE (up to
    the hard limit); returns the limit now in force. Warns when even that is too small."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("http.fd_limit_low", limit=soft, max_connections=max_connections, reserve=FD_RESERVE)
    return soft


async def start_server(app: web.Application, host: str, port: int, cfg: ServerConfig) -> ApiServer:
    """Listen on host:port (0: a free port); raises OSError when it cannot bind (nothing left open)."""
    ensure_fd_room(cfg.max_connections)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                           keepalive_timeout=cfg.header_timeout_s)
    await runner.setup()
    assert runner.server is not None
    gate = ConnectionGate(runner.server, cfg.max_connections, cfg.write_timeout_s)
    site = _GatedSite(runner, host, port, gate)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return ApiServer(runner, gate, host, runner.addresses[0][1])
