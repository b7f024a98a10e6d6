"""Keep-alive and request-head timing: idle connections between requests, heads begun late, the cap's 503s."""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlsplit

import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import Server, eventually, serve

HEADER_S = 2.0
"""The server's header timeout in these tests (scaled down from 15 s)."""
WAIT_S = 30.0
"""Test-side bound on any one answer or close."""
HEAD = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
SPLIT = 12
"""Where a head is cut in two: its first bytes come before the rest."""


def _connect(srv: Server) -> socket.socket:
    url = urlsplit(srv.url)
    sock = socket.create_connection((url.hostname, url.port))
    sock.settimeout(WAIT_S)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """One response's head (the server's answers here fit one read), or b"" when the server closed."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _sends(srv: Server, steps: list[tuple[float, bytes]]) -> list[bytes]:
    """Send each step's bytes after its pause; after each complete head, read its answer."""
    with _connect(srv) as sock:
        answers = []
        for pause_s, data in steps:
            time.sleep(pause_s)
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                return [*answers, b""]
            if data.endswith(b"\r\n\r\n"):
                answers.append(_answer(sock))
        return answers


async def test_a_head_has_the_header_timeout_from_its_first_byte() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": HEADER_S}) as srv:
        # Its first bytes come in time; its last, past the header timeout from the accept, but within
        # it from the first byte: answered, not cut.
        answers = await asyncio.to_thread(_sends, srv, [(0.7 * HEADER_S, HEAD[:SPLIT]), (0.6 * HEADER_S, HEAD[SPLIT:])])
        assert answers[0].startswith(b"HTTP/1.1 200 "), answers


async def test_a_keep_alive_connection_outlives_the_header_timeout_between_requests() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": HEADER_S}) as srv:
        answers = await asyncio.to_thread(_sends, srv, [(0, HEAD), (1.5 * HEADER_S, HEAD)])
        assert [a[:13] for a in answers] == [b"HTTP/1.1 200 "] * 2, answers
        assert srv.http is not None and srv.http.gate.accepted == 1


async def test_a_slowloris_head_is_still_cut_at_the_header_timeout() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": HEADER_S}) as srv:
        assert srv.http is not None
        # One request, then a next head a byte at a time, never complete.
        trickle = [(0.3 * HEADER_S, HEAD[i:i + 1]) for i in range(len(HEAD) - 1)]
        answers = await asyncio.to_thread(_sends, srv, [(0, HEAD), (0.5 * HEADER_S, b""), *trickle[:12]])
        with _connect(srv) as quiet:  # and a connection that sends nothing at all
            assert await asyncio.to_thread(_answer, quiet) == b""
        assert answers[0].startswith(b"HTTP/1.1 200 ")
        await eventually(lambda: srv.http.gate.header_timeouts == 2, WAIT_S)


async def test_the_sdk_reuses_its_connection_across_an_idle_longer_than_the_header_timeout() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": HEADER_S}) as srv:
        assert srv.http is not None
        client = srv.client()  # (max_retries=0: a connection error would be seen, not retried)
        assert (await client.models.list()).data
        await asyncio.sleep(1.5 * HEADER_S)  # (shorter than httpx's 5 s pool expiry)
        assert (await client.models.list()).data
        assert srv.http.gate.accepted == 1
        await client.close()


async def test_closed_connections_leave_no_handler_behind() -> None:
    async with serve("synthetic_text", server={"header_timeout_s": 0.5}) as srv:
        assert srv.http is not None
        for steps in ([(0, HEAD[:SPLIT])], [(0, HEAD), (0, HEAD[:SPLIT])]):  # cut by the server, twice
            await asyncio.to_thread(_sends, srv, steps)
        with _connect(srv) as stalled:
            stalled.sendall(HEAD[:SPLIT])
            assert await asyncio.to_thread(_answer, stalled) == b""
        await eventually(lambda: srv.http.gate.connections == 0, WAIT_S)
        assert srv.http.runner.server is not None and srv.http.runner.server.connections == []


async def test_a_burst_over_the_cap_is_answered_never_reset() -> None:
    cap, burst = 2, 6
    async with serve("synthetic_text", key=None, server={"max_connections": cap}) as srv:
        assert srv.http is not None
        # Made while the loop waits: the server accepts all in one burst, every request already sent.
        socks = [_connect(srv) for _ in range(burst)]
        try:
            for sock in socks:
                sock.sendall(HEAD)
            answers = await asyncio.gather(*(asyncio.to_thread(_answer, s) for s in socks))
        finally:
            for sock in socks:
                sock.close()
        # Each is answered: 200, or the cap's 503 (never a reset, nor a close with no answer: pushed
        # out is only a connection that was answered and waits idle).
        statuses = [a[:13] for a in answers]
        assert set(statuses) <= {b"HTTP/1.1 200 ", b"HTTP/1.1 503 "}, answers
        assert statuses.count(b"HTTP/1.1 200 ") >= cap, answers


@pytest.mark.parametrize(("calls", "retries"), [(20, 0), (50, 2)])  # (2: the SDK's default)
async def test_many_sdk_calls_over_the_cap_succeed_or_get_retried_503s(calls: int, retries: int) -> None:
    stages = [{"stage_id": 0, "engine_extras": {"step_delay_ms": 20}}]
    async with serve("synthetic_text", stages=stages, server={"max_connections": 8}) as srv:
        client = AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=srv.key or "none", timeout=WAIT_S,
                             max_retries=retries)

        async def one(i: int) -> str:
            try:
                await client.chat.completions.create(
                    model="synthetic_text", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=8)
            except openai.InternalServerError as exc:  # the cap's 503 (after the SDK's retries, if any)
                assert exc.status_code == 503 and exc.body["code"] == "too_many_connections", exc.body
                return "503"
            return "ok"

        outcomes = await asyncio.gather(*(one(i) for i in range(calls)))  # a connection error fails here
        assert "ok" in outcomes
        await client.close()
