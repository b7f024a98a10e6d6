"""Realtime responses take the REST routes' request path (PipelineCall): the same deadline and metrics."""

from __future__ import annotations

import aiohttp

from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import STAGES, RtServer, connect, serve_rt

DEADLINE_S = 2.0
LONG_TOKENS = 1000
"""At the synthetic thinker's 20 ms a step: far past the deadline."""


def _text_response(tokens: int | None = None) -> dict:
    """An out-of-band text response (None: the pipeline's default length, 8 chunks)."""
    return {"conversation": "none", "modalities": ["text"], "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tell me more"}]}],
        **({"max_output_tokens": tokens} if tokens else {})}


async def test_realtime_response_has_the_rest_deadline_and_metrics() -> None:
    async with serve_rt("synthetic", stages=STAGES, server={"request_timeout_s": DEADLINE_S}) as srv, \
            aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("response.create", response=_text_response(LONG_TOKENS))
        done = (await c.until("response.done", timeout_s=60))[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "request_timeout"  # REST's
        await eventually(lambda: idle(srv.orch))
        await c.send("response.create", response=_text_response())
        done = (await c.until("response.done", timeout_s=60))[-1]["response"]
        assert done["status"] == "completed"
        async with http.get(srv.url + "/metrics", headers=srv.headers) as resp:
            metrics = await resp.text()
        assert 'omni_time_to_first_token_seconds_count{pipeline="synthetic",route="/v1/realtime"} 2.0' in metrics
        assert 'omni_request_duration_seconds_count{pipeline="synthetic",route="/v1/realtime"} 1.0' in metrics
        await c.ws.close()


async def test_a_request_the_stage_refuses_is_the_clients_error(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("response.create", response=_text_response(10**9))  # past the stage's limit
        done = (await c.until("response.done", timeout_s=60))[-1]["response"]
        assert done["status"] == "failed"
        assert done["status_details"]["error"]["type"] == "invalid_request_error"
        assert done["status_details"]["error"]["code"] == "rejected_by_stage"  # as REST answers it
        await c.ws.close()
