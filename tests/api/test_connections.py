"""Connection floods: incomplete request heads time out, connections are capped, /health keeps answering."""

from __future__ import annotations

import asyncio
import resource
import socket
from urllib.parse import urlsplit

import aiohttp

from omni_actors.api.server import FD_RESERVE, REFUSED_LINGER_MAX, ensure_fd_room
from tests.api.conftest import Server, eventually, serve

CAP = 8
FLOOD = 40
WAIT_S = 30.0
"""Test-side bound on how long the server may take to close a stalled connection."""


def _stalled(srv: Server) -> socket.socket:
    """A connection that sends half a request line and then nothing."""
    url = urlsplit(srv.url)
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(b"GET /heal")
    return sock


def _closed(sock: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset), having answered nothing or a 503."""
    sock.settimeout(WAIT_S)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer == b"" or answer.startswith(b"HTTP/1.1 503 ")


async def _health(srv: Server) -> int:
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/health") as resp:
        return resp.status


async def test_incomplete_request_head_is_closed_after_the_header_timeout() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": 1.0}) as srv:
        sock = _stalled(srv)
        try:
            assert await asyncio.to_thread(_closed, sock)
        finally:
            sock.close()


async def test_flood_of_stalled_connections_is_capped_and_health_still_answers() -> None:
    async with serve("synthetic_text", server={"max_connections": CAP, "header_timeout_s": 2.0}) as srv:
        assert srv.http is not None
        gate = srv.http.gate
        # (made while the loop waits: the server accepts them in one burst, before reading any; those
        # over the cap push out none of the just-accepted ones, which may be sending, and get a 503)
        socks = [_stalled(srv) for _ in range(FLOOD)]
        try:
            await eventually(lambda: gate.pushed_out + gate.refused >= FLOOD - CAP, WAIT_S)
            assert gate.connections <= CAP
            for _ in range(3):  # (the first pushes out a stalled connection: it has sent part of a head)
                assert await _health(srv) == 200
            # A real client's request goes through while the flood holds the other slots.
            async with srv.client() as client:  # (closed after: its idle connection would stay open)
                assert (await client.models.list()).data
            # Every stalled connection ends: refused, pushed out, or closed at the header timeout.
            closed = await asyncio.gather(*(asyncio.to_thread(_closed, s) for s in socks))
            assert all(closed)
            await eventually(lambda: gate.connections == 0, WAIT_S)
            assert gate.pushed_out >= 1 and gate.header_timeouts >= 1
        finally:
            for s in socks:
                s.close()


async def test_over_the_cap_with_every_connection_busy_is_answered_503() -> None:
    stages = [{"stage_id": 0, "engine_extras": {"step_delay_ms": 50, "chunks": 200}}]
    async with serve("synthetic_text", stages=stages, server={"max_connections": 2}) as srv:
        assert srv.http is not None
        client = srv.client()
        busy = [asyncio.ensure_future(client.chat.completions.create(
            model="synthetic_text", messages=[{"role": "user", "content": "hi"}], max_tokens=200))
            for _ in range(2)]
        try:
            await eventually(lambda: srv.orch.statistics().requests_in_flight == 2, WAIT_S)
            async with aiohttp.ClientSession() as session, session.get(srv.url + "/health") as resp:
                assert resp.status == 503
                body = await resp.json()
            assert body["error"]["code"] == "too_many_connections"
            assert srv.http.gate.refused == 1
        finally:
            for task in busy:
                task.cancel()
            await asyncio.gather(*busy, return_exceptions=True)


def test_open_files_limit_fits_the_connection_cap() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        want = 1024 + REFUSED_LINGER_MAX + FD_RESERVE
        assert ensure_fd_room(1024) == min(want, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(want, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
