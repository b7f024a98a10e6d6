"""Requests aiohttp cannot parse are answered 400 and logged as one line, not as an error with a traceback.

A bad header line, a bad chunk size, a body whose Content-Encoding does not decode, a Content-Length
that is no number: each is the client's mistake, repeatable by anyone, so each must not write an
error-level traceback to the server's log (aiohttp's own logging did, one per request). Real server,
raw sockets; the server answers the next request after each.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.api.conftest import API_KEY, Server, serve

READ_TIMEOUT_S = 10.0
"""Test-side bound on waiting for the server's answer to one raw request."""

GZIP_JUNK = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Encoding: gzip\r\n"
             b"Content-Length: 9\r\n\r\n{notgzip}")
BAD = [
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", id="header-line-without-colon"),
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                 id="bad-chunk-size"),
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", id="bad-length"),
    pytest.param(GZIP_JUNK, id="body-not-gzip"),
]


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve("synthetic") as s:
        yield s


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _exchange(srv: Server, data: bytes) -> bytes:
    url = urlsplit(srv.url)
    with socket.create_connection((url.hostname, url.port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.startswith(b"HTTP/1.1 200"):
                break
    return answer


@pytest.mark.parametrize("data", BAD)
async def test_an_unparsable_request_is_a_400_and_no_error_traceback(srv: Server, data: bytes) -> None:
    errors = _Errors()
    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(errors)
    try:
        answer = await asyncio.to_thread(_exchange, srv, data)
        assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", answer[:200]
        # the server goes on: a plain request after it is answered
        health = await asyncio.to_thread(_exchange, srv, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200"), health[:200]
    finally:
        server_log.removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []
