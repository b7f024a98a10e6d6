"""Streamed answers to clients that stop reading: bounded buffering, write timeout, abort in every stage.

A raw socket with a tiny receive buffer sends a streamed text+audio chat and
never reads. The server must not hold more than `server.stream_buffer_mb` of
that request's output, must abort the request in every stage (leases and
worker slots freed), and must close the connection after
`server.write_timeout_s`; other clients are served meanwhile. Once such streams have ended,
the memory they held goes back to the OS (api/calls.py HeapTrim).
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import os
import socket
from urllib.parse import urlsplit

import aiohttp

from omni_actors.api.calls import HEAP_TRIM
from omni_actors.api.realtime import SESSIONS_KEY
from tests.api.conftest import API_KEY, Server, eventually, idle, serve

STALL_WAIT_S = 60.0
"""Test-side bound on how long the server may take to give up on a stalled reader."""
BUFFER_MB = 1.0
CHUNK_MAX_BYTES = 64 * 1024
"""More than one output of STAGES below holds (0.2 s of float32 audio and its text)."""


def _stalled_chat(srv: Server, max_tokens: int) -> socket.socket:
    """Send a streamed chat on a raw socket that will never be read."""
    body = json.dumps({
        "model": "synthetic", "stream": True, "max_tokens": max_tokens, "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "pcm16"},
        "messages": [{"role": "user", "content": "a long answer please"}],
    }).encode()
    url = urlsplit(srv.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((url.hostname, url.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


async def _health(srv: Server) -> int:
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/health") as resp:
        return resp.status


def _closed_by_server(sock: socket.socket) -> bool:
    """Read whatever the kernel kept, then see the end of the stream (EOF or reset)."""
    sock.settimeout(STALL_WAIT_S)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True


STAGES = [
    {"stage_id": 0, "engine_extras": {"step_delay_ms": 1}},
    {"stage_id": 1},
    {"stage_id": 2, "engine_extras": {"samples": 4800}},  # 0.2 s of audio a chunk
]


async def test_unread_stream_overflows_its_buffer_and_is_aborted_in_every_stage() -> None:
    async with serve("synthetic", stages=STAGES,
                     server={"stream_buffer_mb": BUFFER_MB, "write_timeout_s": STALL_WAIT_S * 4}) as srv:
        sock = _stalled_chat(srv, max_tokens=3000)  # ~58 MB of audio if it were all made
        try:
            stats = srv.orch.statistics
            await eventually(lambda: stats().stream_overflows == 1 and idle(srv.orch), STALL_WAIT_S)
            assert stats().stream_bytes_peak <= BUFFER_MB * 1024 * 1024 + CHUNK_MAX_BYTES  # (the bound, then one more)
            assert stats().stream_bytes_queued == 0 and stats().requests_aborted == 1
            assert await _health(srv) == 200
            # The pipeline is free for the next client.
            out = await srv.client().chat.completions.create(
                model="synthetic", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            assert out.choices[0].message.content
        finally:
            sock.close()


async def test_client_that_stops_reading_is_cut_off_after_the_write_timeout() -> None:
    # Everything fits the buffer (no overflow), but not the socket: only the write timeout ends it.
    async with serve("synthetic", stages=STAGES,
                     server={"stream_buffer_mb": 256, "write_timeout_s": 1.0}) as srv:
        assert srv.http is not None
        sock = _stalled_chat(srv, max_tokens=600)  # ~12 MB of SSE
        try:
            await eventually(lambda: srv.http.gate.write_timeouts == 1, STALL_WAIT_S)
            assert await asyncio.to_thread(_closed_by_server, sock)
            await eventually(lambda: idle(srv.orch) and srv.http.gate.connections == 0, STALL_WAIT_S)
            assert srv.orch.statistics().stream_overflows == 0
            metrics = await _metrics(srv)
            assert 'omni_http_requests_in_flight{route="/v1/chat/completions"} 0.0' in metrics
        finally:
            sock.close()


def _rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


STALLED = 16
"""Stalled streamed chats at once in the memory test, each aborted at its 8 MB bound."""
MEMORY_WRITE_TIMEOUT_S = 10.0
"""The memory test's write timeout: past the time its streams take to overflow (~3 s on 2 busy cores)."""


async def test_memory_held_for_stalled_readers_goes_back_once_they_have_ended() -> None:
    """16 streams whose clients never read fill their 8 MB bounds and are aborted; once the write timeout
    has ended their handlers, the memory the allocator kept of their outputs goes back to the OS (before
    2026-12-05 it stayed: 20 stalled chats, 360 MB, after they had ended)."""
    async with serve("synthetic", stages=STAGES,
                     server={"stream_buffer_mb": 8, "write_timeout_s": MEMORY_WRITE_TIMEOUT_S}) as srv:
        assert srv.http is not None
        ctypes.CDLL(None).malloc_trim(0)  # (a baseline without what earlier tests freed)
        before, trims = _rss_anon_mb(), HEAP_TRIM.trims
        peak = [before]

        def overflowed() -> bool:
            peak.append(_rss_anon_mb())
            return srv.orch.statistics().stream_overflows == STALLED

        socks = [_stalled_chat(srv, max_tokens=3000) for _ in range(STALLED)]
        try:
            await eventually(overflowed, STALL_WAIT_S)
            await eventually(lambda: HEAP_TRIM.trims > trims and idle(srv.orch), STALL_WAIT_S)
            held, after = max(peak), _rss_anon_mb()
            assert held - before > 60 and held - after > (held - before) / 2, (before, held, after)
        finally:
            for sock in socks:
                sock.close()


async def _metrics(srv: Server) -> str:
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/metrics") as resp:
        return await resp.text()


def _ws_frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it (RFC 6455)."""
    n = len(payload)
    head = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _stalled_realtime(srv: Server, chunks: int) -> socket.socket:
    """Open /v1/realtime on a raw socket, ask for a long audio response, then never read again."""
    url = urlsplit(srv.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((url.hostname, url.port))
    sock.sendall(b"GET /v1/realtime?model=synthetic HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                 b"Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)) + b"\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    event = {"type": "response.create", "response": {
        "conversation": "none", "modalities": ["text", "audio"], "max_output_tokens": chunks,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "talk"}]}]}}
    sock.sendall(_ws_frame(json.dumps(event).encode()))
    return sock


async def test_realtime_client_that_stops_reading_is_cut_off_and_its_response_aborted() -> None:
    stages = [{"stage_id": 0, "engine_extras": {"step_delay_ms": 5}}, *STAGES[1:]]
    async with serve("synthetic", stages=stages,
                     server={"stream_buffer_mb": 256, "write_timeout_s": 1.0}) as srv:
        assert srv.http is not None
        # (in a thread: the handshake waits for this process's own server)
        sock = await asyncio.to_thread(_stalled_realtime, srv, 3000)  # 15 s of steps at least
        try:
            await eventually(lambda: srv.http.gate.write_timeouts == 1, STALL_WAIT_S)
            sessions = srv.http.runner.app[SESSIONS_KEY]
            await eventually(lambda: not sessions and idle(srv.orch), STALL_WAIT_S)
            stats = srv.orch.statistics()
            assert stats.requests_aborted == 1 and stats.stream_overflows == 0
            assert await _health(srv) == 200
        finally:
            sock.close()
