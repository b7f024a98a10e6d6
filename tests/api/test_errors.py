"""Client mistakes over raw HTTP (400 / 401 / 404 / 405 / 413) and client disconnects mid-request."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.api.conftest import Server, eventually, idle, post, serve
from tests.conftest import shm_files

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "a b c"}]
MAX_CHUNKS = 6000
MAX_PROMPT_CHARS = 4000
"""Stage 0 refuses a longer prompt as past its context."""


@pytest.fixture(scope="module")
async def srv():
    stages = [
        # speech runs ~2 s; like a model's context, more than MAX_CHUNKS tokens are refused at add
        {"stage_id": 0, "engine_extras": {"chunks": 400, "step_delay_ms": 5, "max_chunks": MAX_CHUNKS,
                                          "max_prompt_chars": MAX_PROMPT_CHARS}},
        {"stage_id": 1, "engine_extras": {"payload_bytes": 1 << 17}},  # leases in flight when aborted
        {"stage_id": 2},
    ]
    async with serve("synthetic", stages=stages, server={"max_body_mb": 0.25}) as s:
        yield s


def _error(body: dict, status: int, kind: str) -> dict:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["type"] == kind, (status, body)
    return body["error"]


async def test_auth(srv: Server) -> None:
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
        status, body = await post(srv, CHAT, {"model": "synthetic", "messages": MSG}, headers=headers)
        assert status == 401
        _error(body, 401, "authentication_error")
    status, _ = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, "max_tokens": 1},
                           headers={"Authorization": "", "api-key": srv.key})
    assert status == 200


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "synthetic", "messages": MSG, "max_tokens": "ten"}, "max_tokens", "invalid_type"),
    ({"model": "synthetic", "messages": MSG, "foo": 1}, "foo", "unknown_parameter"),
    ({"model": "synthetic", "messages": MSG, "temperature": 5}, "temperature", "decimal_above_max_value"),
    ({"model": "synthetic"}, "messages", "missing_required_parameter"),
    ({"model": "synthetic", "messages": []}, "messages", "array_below_min_length"),
    ({"model": "synthetic", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"model": "synthetic", "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type", "invalid_value"),
    ({"model": "synthetic", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "@@@", "format": "wav"}}]}]},
     "messages[0].content[0].input_audio.data", "invalid_base64"),
    ({"model": "synthetic", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
     "messages[0].content[0].input_audio.data", "invalid_audio"),
    ({"model": "synthetic", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]},
     "messages[0].content[0].image_url.url", "unsupported_url"),
    ({"model": "synthetic", "messages": MSG, "modalities": ["video"]}, "modalities[0]", "invalid_value"),
])
async def test_chat_400_names_the_field(srv: Server, body: dict, param: str, code: str) -> None:
    status, out = await post(srv, CHAT, body)
    assert status == 400
    err = _error(out, 400, "invalid_request_error")
    assert err["param"] == param and err["code"] == code, err
    assert f"`{param}`" in err["message"]


async def test_a_number_past_a_double_is_an_invalid_value_not_a_wrong_type(srv: Server) -> None:
    data = b'{"model": "synthetic", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}'
    status, out = await post(srv, CHAT, data=data, headers={"Content-Type": "application/json"})
    assert status == 400, out
    err = _error(out, 400, "invalid_request_error")
    assert (err["param"], err["code"]) == ("temperature", "invalid_value"), err
    assert "out of range" in err["message"], err


async def test_other_400s(srv: Server) -> None:
    status, out = await post(srv, CHAT, data=b'{"model": "synthetic", "messages": [', headers={
        "Content-Type": "application/json"})
    assert status == 400 and _error(out, 400, "invalid_request_error")["code"] == "invalid_json"
    status, out = await post(srv, CHAT, data=b"", headers={"Content-Type": "application/json"})
    assert status == 400 and _error(out, 400, "invalid_request_error")["code"] == "invalid_json"
    status, out = await post(srv, "/v1/audio/speech", {"model": "synthetic", "input": "x", "response_format": "wma"})
    assert status == 400 and _error(out, 400, "invalid_request_error")["param"] == "response_format"
    status, out = await post(srv, "/v1/audio/speech", {"model": "synthetic", "input": "x", "speed": 9})
    assert status == 400 and _error(out, 400, "invalid_request_error")["param"] == "speed"
    # This pipeline makes no images: a clear 400, not a 500.
    status, out = await post(srv, "/v1/images/generations", {"prompt": "a cat"})
    assert status == 400 and "cannot produce ['image']" in _error(out, 400, "invalid_request_error")["message"]


async def test_404_and_405(srv: Server) -> None:
    status, out = await post(srv, CHAT, {"model": "gpt-nope", "messages": MSG})
    assert status == 404 and _error(out, 404, "invalid_request_error")["code"] == "model_not_found"
    status, out = await post(srv, "/v1/nope", {})
    assert status == 404 and _error(out, 404, "invalid_request_error")["code"] == "not_found"
    async with aiohttp.ClientSession(headers=srv.headers) as session:
        async with session.get(srv.url + "/v1/models/gpt-nope") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["param"] == "model"
        async with session.put(srv.url + CHAT) as resp:  # (GET lists stored completions)
            assert resp.status == 405 and (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_413_before_and_while_reading(srv: Server) -> None:
    big = b'{"model": "synthetic", "messages": [], "user": "' + b"x" * 300_000 + b'"}'
    status, out = await post(srv, CHAT, data=big, headers={"Content-Type": "application/json"})
    assert status == 413 and _error(out, 413, "invalid_request_error")["code"] == "body_too_large"

    async def chunked():  # no Content-Length: cut off by the reader at the same limit
        for _ in range(10):
            yield b"x" * 50_000

    async with aiohttp.ClientSession(headers=srv.headers) as session, \
            session.post(srv.url + CHAT, data=chunked()) as resp:
        assert resp.status == 413 and (await resp.json())["error"]["type"] == "invalid_request_error"


async def _leak_free(srv: Server) -> None:
    await eventually(lambda: idle(srv.orch), 2.0)
    arena_files = [f for f in shm_files(srv.orch.run_prefix) if "-orch" in f]
    assert srv.orch.statistics().leases_held == 0
    assert srv.orch.arena.leased == 0, arena_files


@pytest.mark.parametrize("audio", [False, True])
async def test_disconnect_mid_stream_aborts_every_stage(srv: Server, audio: bool) -> None:
    body = {"model": "synthetic", "messages": MSG, "max_tokens": 5000, "stream": True}
    if audio:
        body |= {"modalities": ["text", "audio"], "audio": {"voice": "a", "format": "pcm16"}}
    aborted_before = srv.orch.statistics().requests_aborted
    session = aiohttp.ClientSession(headers=srv.headers)
    resp = await session.post(srv.url + CHAT, json=body)
    assert resp.status == 200
    events = 0
    async for line in resp.content:
        events += line.startswith(b"data: ")
        if events == 6:
            break
    stats = srv.orch.statistics()
    assert stats.requests_in_flight == 1 and stats.stage(0).in_flight == 1
    resp.close()
    t0 = time.monotonic()
    await session.close()
    await eventually(lambda: srv.orch.statistics().requests_in_flight == 0, 1.0)
    ended_in = time.monotonic() - t0
    assert ended_in < 0.1, f"abort took {ended_in:.3f} s"
    await _leak_free(srv)
    assert srv.orch.statistics().requests_aborted == aborted_before + 1


async def test_disconnect_while_waiting_for_a_whole_answer(srv: Server) -> None:
    body = {"model": "synthetic", "messages": MSG, "max_tokens": 5000, "modalities": ["text", "audio"]}
    async with aiohttp.ClientSession(headers=srv.headers) as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(srv.url + CHAT, json=body, timeout=aiohttp.ClientTimeout(total=0.3))
    await _leak_free(srv)
    # The server still answers.
    status, out = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, "max_tokens": 2})
    assert status == 200 and out["choices"][0]["message"]["content"] == "a b"


async def test_disconnect_mid_chunked_speech_aborts(srv: Server) -> None:
    body = {"model": "synthetic", "input": "one two three", "response_format": "pcm", "stream": True}
    session = aiohttp.ClientSession(headers=srv.headers)
    resp = await session.post(srv.url + "/v1/audio/speech", json=body)
    assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked"
    got = 0
    async for part in resp.content.iter_any():
        got += len(part)
        if got >= 4 * 2400 * 2:  # a few chunks of audio have arrived
            break
    assert srv.orch.statistics().requests_in_flight == 1
    resp.close()
    await session.close()
    await eventually(lambda: srv.orch.statistics().requests_in_flight == 0, 0.5)
    await _leak_free(srv)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_past_the_context_is_openais_context_length_exceeded(srv: Server, stream: bool) -> None:
    """The stage types the refusal (ContextLengthError -> bus StageOutput.code): OpenAI's code, whatever
    words the engine's library used."""
    long = [{"role": "user", "content": "word " * MAX_PROMPT_CHARS}]
    status, out = await post(srv, CHAT, {"model": "synthetic", "messages": long, "stream": stream})
    err = _error(out, 400, "invalid_request_error")
    assert status == 400 and err["code"] == "context_length_exceeded", err
    assert f"context holds {MAX_PROMPT_CHARS}" in err["message"], err
    await _leak_free(srv)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_the_stage_refuses_is_a_400_even_when_streamed(srv: Server, stream: bool, n: int) -> None:
    body = {"model": "synthetic", "messages": MSG, "max_tokens": MAX_CHUNKS + 1, "stream": stream, "n": n}
    status, out = await post(srv, CHAT, body)
    assert status == 400, out  # not a 500, and no 200 stream carrying the error
    err = _error(out, 400, "invalid_request_error")
    assert err["code"] == "rejected_by_stage" and f"at most {MAX_CHUNKS}" in err["message"]
    await _leak_free(srv)
    status, out = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, "max_tokens": 2, "stream": stream})
    assert status == 200


async def test_a_body_that_never_arrives_is_a_408_not_a_held_handler() -> None:
    async with serve("synthetic", server={"body_timeout_s": 0.5}) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(s.url.rsplit(":", 1)[1]))
        head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
        writer.write(head.encode())  # 100 bytes declared, 8 sent
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = await asyncio.wait_for(reader.readexactly(length), 10.0)
        writer.close()
        assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head, head
        assert b'"code":"body_timeout"' in body
        status, _ = await post(s, CHAT, {"model": "synthetic", "messages": MSG, "max_tokens": 1})
        assert status == 200
