"""Server-side limits over HTTP: 429 when admission is full, 504 at the deadline, 503 while a stage is down."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import openai
import pytest

from tests.api.conftest import Server, eventually, idle, post, serve

CHAT = "/v1/chat/completions"
STEP_MS = 100


@pytest.fixture(scope="module")
async def srv():
    stages = [{"stage_id": 0, "max_num_seqs": 1, "max_queue": 1,
               "engine_extras": {"chunks": 2, "step_delay_ms": STEP_MS}}]
    async with serve("synthetic_text", stages=stages, server={"request_timeout_s": 1.0}) as s:
        yield s


def _chat(tokens: int, **extra) -> dict:
    return {"model": "synthetic_text", "messages": [{"role": "user", "content": "a b"}],
            "max_tokens": tokens, **extra}


async def test_no_audio_output_is_a_clear_400(srv: Server) -> None:
    status, out = await post(srv, CHAT, _chat(1, modalities=["text", "audio"]))
    assert status == 400 and out["error"]["param"] == "modalities"
    assert "cannot produce ['audio']" in out["error"]["message"]
    status, out = await post(srv, "/v1/audio/speech", {"model": "synthetic_text", "input": "hi"})
    assert status == 400 and out["error"]["param"] == "model"


async def test_429_when_the_queue_is_full(srv: Server) -> None:
    client = srv.client()
    first = asyncio.ensure_future(post(srv, CHAT, _chat(6)))  # holds the one slot for ~0.6 s
    await eventually(lambda: srv.orch.statistics().stage(0).in_flight == 1, 2.0)
    async with aiohttp.ClientSession() as session, session.post(srv.url + CHAT, json=_chat(1),
                                                                headers=srv.headers) as resp:
        status, out, retry_after = resp.status, await resp.json(), resp.headers.get("Retry-After")
    assert status == 429
    assert out["error"]["type"] == "rate_limit_error" and out["error"]["code"] == "queue_full"
    assert retry_after == "1"  # a small wait in whole seconds (the SDK honours it when it retries)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(**_chat(1))
    status, out = await first
    assert status == 200 and out["choices"][0]["message"]["content"] == "a b a b a b"


async def test_504_at_the_deadline(srv: Server) -> None:
    status, out = await post(srv, CHAT, _chat(50))
    assert status == 504 and out["error"]["type"] == "timeout_error"
    assert out["error"]["code"] == "request_timeout"
    # Once the SSE headers are out, the timeout arrives in-band and the SDK raises it.
    stream = await srv.client().chat.completions.create(**_chat(50), stream=True)
    with pytest.raises(openai.APIError, match="timed out"):
        async for _ in stream:
            pass
    await eventually(lambda: idle(srv.orch), 2.0)


async def test_503_while_a_worker_is_down_then_recovery(srv: Server) -> None:
    orch = srv.orch
    restarts = orch.statistics().worker_restarts
    pending = asyncio.ensure_future(post(srv, CHAT, _chat(8)))
    await eventually(lambda: orch.statistics().stage(0).in_flight == 1, 2.0)
    os.kill(orch.workers[0][0].pid, signal.SIGKILL)
    status, out = await pending  # the in-flight request fails at once with a clear 503
    assert status == 503 and out["error"]["code"] == "worker_died"
    async with aiohttp.ClientSession() as session:
        async with session.get(srv.url + "/health") as resp:
            body = await resp.json()
        if resp.status == 503:  # the restart may already have won the race
            assert body["unhealthy_stages"] == [{"stage_id": 0, "model_stage": "llm"}]
            status, out = await post(srv, CHAT, _chat(1))
            assert status == 503 and out["error"]["type"] == "service_unavailable"
        await orch.wait_healthy(30.0)
        async with session.get(srv.url + "/health") as resp:
            assert resp.status == 200
    assert orch.statistics().worker_restarts == restarts + 1
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/metrics") as resp:
        text = await resp.text()
    assert f'omni_worker_restarts_total{{model_stage="llm",pipeline="synthetic_text",stage_id="0"}} {restarts + 1}.0' in text
    assert 'omni_http_requests_total{method="POST",route="/v1/chat/completions",status="503"}' in text
    status, out = await post(srv, CHAT, _chat(1))
    assert status == 200 and out["choices"][0]["message"]["content"] == "a"
