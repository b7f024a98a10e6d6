"""The HTTP listener: the app on a TCP port, with a connection cap, a header timeout and a write timeout.

    server = await start_server(build_app(orch), host, port, deploy.server)
    server.url ...; await server.close()

Both `omni-run` and the tests listen through this, so what is tested is what runs.

aiohttp serves each connection with its RequestHandler protocol; a thin
protocol in front of it (one `_Guard` per connection, made by `ConnectionGate`)
adds what aiohttp lacks:

- Connection cap (`server.max_connections`). At the cap a new connection pushes
  out the oldest connection that is waiting for a request head with nothing left
  to write and has had its chance to send one (a keep-alive connection between
  requests, a stalled partial head, or one silent for PUSH_OUT_GRACE_S), so a
  flood of stalled sockets can hold neither the file limit nor `/health`. A
  connection just accepted is never the one pushed out (its client may be
  sending its request now: a reset there would be an error no client retries
  safely); when none can go, the new one is answered 503 (retryable) and closed.
- Header timeout (`server.header_timeout_s`). A new connection has that long to
  start its first request head; once a head's first byte has arrived the head
  has that long to complete. A head that does not is cut: the connection closes.
- Keep-alive idle timeout (KEEPALIVE_TIMEOUT_S, aiohttp's `keepalive_timeout`):
  a connection that has answered a request and waits for the next is closed
  after that long with nothing received; it is longer than the idle expiry of
  common clients (httpx 5 s, aiohttp 15 s), so they drop the connection first
  and never send a request on one the server is closing. A head begun before
  it fires is not cut by it (its header timeout runs instead).
- Client mistakes in the log: a request aiohttp cannot parse (a bad header line, chunk size or
  Content-Encoding) is answered 400 by aiohttp and logged by it as an error with a traceback, one per
  request, which any client can repeat; here it is one `http.unparsable_request` line instead
  (`_ServerLog`). Every other exception aiohttp logs keeps its traceback.
- Write timeout (`server.write_timeout_s`). A connection whose transport has
  paused writing (its client stopped taking bytes) for that long is aborted.
  aiohttp then cancels its handler (`handler_cancellation`), the pending write
  fails, and the route's PipelineCall aborts the request in every stage. This
  covers SSE, chunked audio and WebSockets alike.

At start the process's soft open-files limit is raised (up to the hard limit)
to fit the cap, REFUSED_LINGER_MAX and FD_RESERVE, so the cap is reached before the file limit.

`_Guard` reads three RequestHandler internals of aiohttp 3.14 (pinned in
requirements/cpu.txt) and writes one (`_next_keepalive_close_time`);
tests/api/test_connections.py and test_keepalive.py fail if they change meaning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from omni_actors import logs
from omni_actors.config.deploy import ServerConfig

log = logs.get(__name__)

SHUTDOWN_TIMEOUT_S = 5.0
"""Longest wait at close for handlers still running."""
KEEPALIVE_TIMEOUT_S = 75.0
"""Longest a keep-alive connection waits between requests (nginx's and aiohttp's default): longer than
clients keep an idle pooled connection, so the client, not the server, ends it (no request races a close)."""
REFUSED_LINGER_S = 2.0
"""Longest a connection answered 503 at the cap stays open for its client to read the answer and close."""
REFUSED_LINGER_MAX = 256
"""Refused connections lingering at once at most; a flood's others are closed at once (their clients
may see a reset in place of the 503). Counted in the open-files room (`ensure_fd_room`)."""
PUSH_OUT_GRACE_S = 1.0
"""How long a new connection that has sent nothing is safe from being pushed out at the cap: its
request may be on its way (a burst of connects is accepted before any of them is read)."""
FD_RESERVE = 512
"""File descriptors the main process needs besides client connections (the bus, shared-memory
segments, logs, the data directory); the cap on connections is useless if they cannot fit."""

_FULL_BODY = json.dumps({"error": {
    "message": "too many open connections (server.max_connections): none is idle to make room; retry",
    "type": "server_error", "param": None, "code": "too_many_connections"}}).encode()
_FULL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: " + str(len(_FULL_BODY)).encode() + b"\r\n\r\n" + _FULL_BODY)


class _Refused(asyncio.Protocol):
    """A connection over the cap when none can be pushed out: 503 (a retryable status), then closed.

    The close lingers (REFUSED_LINGER_S at most, until the client closes): closing at once, with its
    request still arriving, would reset the connection, and a reset can discard the 503 unread on the
    client's side, which then sees a connection error in place of a status it knows to retry. At most
    REFUSED_LINGER_MAX linger at once."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        transport.write(_FULL)
        if self.gate.lingering >= REFUSED_LINGER_MAX or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.gate.lingering += 1
        self._linger = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass  # the request, not read

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
            self.gate.lingering -= 1


class _Guard(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's handler; times out request heads and stalled writes."""

    def __init__(self, gate: ConnectionGate, inner: RequestHandler) -> None:
        self.gate = gate
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.opened_at = self.loop.time()
        self.received = False  # any byte yet: its client has used its chance to send
        self._stall: asyncio.TimerHandle | None = None
        self._head: asyncio.TimerHandle | None = None  # header timeout: for a first byte, then for the rest
        self._head_begun = False  # the head waited for has sent its first byte
        self._connected = False  # aiohttp's handler saw connection_made (it must see connection_lost)
        self.aborted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not its subclasses)
        self.transport = transport
        if self.aborted:  # pushed out between accept and now
            transport.abort()
            return
        self._connected = True
        self.inner.connection_made(transport)
        self._head = self.loop.call_later(self.gate.header_timeout_s, self._head_timed_out)

    def _between_requests(self) -> bool:
        """No request head complete and waiting, none being handled."""
        h = self.inner
        return not h._request_in_progress and not h._messages

    def _waiting_for_head(self) -> bool:
        """aiohttp's handler is parked until a request head completes (not, say, between taking one
        from its queue and starting its task): what its own keep-alive timer checks before a close."""
        waiter = self.inner._waiter
        return waiter is not None and not waiter.done()

    def data_received(self, data: bytes) -> None:
        self.received = True
        h = self.inner
        if data and not self._head_begun and self._between_requests():
            # The first byte of a head: it has header_timeout_s from now, and aiohttp's keep-alive
            # timer (which closes a connection waiting for a head) must not cut it before that: it is
            # put off past this deadline (a backstop only; it is set anew after the response).
            self._head_begun = True
            deadline = self.loop.time() + self.gate.header_timeout_s
            if self._head is not None:
                self._head.cancel()
            self._head = self.loop.call_at(deadline, self._head_timed_out)
            h._next_keepalive_close_time = max(h._next_keepalive_close_time, deadline + self.gate.header_timeout_s)
        h.data_received(data)
        if self._head_begun and not self._between_requests():  # the head is complete
            self._head_begun = False
            if self._head is not None:
                self._head.cancel()
                self._head = None

    def _head_timed_out(self) -> None:
        self._head = None
        if not self._waiting_for_head():  # (the bytes were a request's, or the head completed since)
            self._head_begun = False
            return
        if self.transport is not None and not self.transport.is_closing():
            self.gate.header_timeouts += 1
            log.info("http.header_timeout", timeout_s=self.gate.header_timeout_s)
            self.inner.force_close()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.gate.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._stall, self._head):
            if timer is not None:
                timer.cancel()
        self._stall = self._head = None
        self.gate.forget(self)
        if self._connected:  # (even when aiohttp closed it itself, which clears its `transport`)
            self._connected = False
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

    def pushable(self) -> bool:
        """Waiting for a request head with nothing left to write, and has had its chance to send
        one (sent something, or nothing for PUSH_OUT_GRACE_S): safe to push out."""
        if self.aborted:
            return False
        if not self.received and self.loop.time() - self.opened_at < PUSH_OUT_GRACE_S:
            return False  # just accepted: its request may be on its way
        if self.transport is None:  # accepted, not yet connected (only while the loop is stalled)
            return True
        return (not self.transport.is_closing() and self._waiting_for_head()
                and self.transport.get_write_buffer_size() == 0)


class ConnectionGate:
    """The listening socket's protocol factory: aiohttp's handler behind a `_Guard`, within the cap."""

    def __init__(self, server: web.Server, max_connections: int, write_timeout_s: float,
                 header_timeout_s: float) -> None:
        self.server = server
        self.max_connections = max_connections
        self.write_timeout_s = write_timeout_s
        self.header_timeout_s = header_timeout_s
        self.open: dict[_Guard, None] = {}  # oldest first
        self.aborting = 0
        self.accepted = 0
        self.pushed_out = 0
        self.refused = 0
        self.lingering = 0  # refused connections waiting for their client to close
        self.write_timeouts = 0
        self.header_timeouts = 0

    @property
    def connections(self) -> int:
        """Open connections, not counting those being aborted."""
        return len(self.open) - self.aborting

    def forget(self, guard: _Guard) -> None:
        if guard in self.open:
            del self.open[guard]
            self.aborting -= guard.aborted

    def __call__(self) -> asyncio.Protocol:
        self.accepted += 1
        if self.connections >= self.max_connections:
            victim = next((g for g in self.open if g.pushable()), None)
            if victim is None:
                self.refused += 1
                log.warning("http.connections_full", limit=self.max_connections)
                return _Refused(self)
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
    """Raise this process's soft open-files limit to fit `max_connections`, REFUSED_LINGER_MAX and
    FD_RESERVE (up to the hard limit); returns the limit now in force. Warns when even that is too small."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + REFUSED_LINGER_MAX + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("http.fd_limit_low", limit=soft, max_connections=max_connections, reserve=FD_RESERVE)
    return soft


class _ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger, where a request it could not parse (its client's mistake, already answered
    400) is one `http.unparsable_request` line, not an error with a traceback."""

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else exc
            reason = cause.message if isinstance(cause, HttpProcessingError) else str(cause)
            # (the reason's words only: what follows its colon can be the client's bytes, a key among them)
            log.info("http.unparsable_request", error_type=type(cause).__name__,
                     reason=str(reason).strip().partition(":")[0][:80])
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


async def start_server(app: web.Application, host: str, port: int, cfg: ServerConfig) -> ApiServer:
    """Listen on host:port (0: a free port); raises OSError when it cannot bind (nothing left open)."""
    ensure_fd_room(cfg.max_connections)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                           keepalive_timeout=KEEPALIVE_TIMEOUT_S,
                           logger=_ServerLog(logging.getLogger("aiohttp.server"), {}))
    await runner.setup()
    assert runner.server is not None
    gate = ConnectionGate(runner.server, cfg.max_connections, cfg.write_timeout_s, cfg.header_timeout_s)
    site = _GatedSite(runner, host, port, gate)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return ApiServer(runner, gate, host, runner.addresses[0][1])
