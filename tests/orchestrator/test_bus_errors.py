"""Frames the bus cannot decode: counted in /metrics, the request they carried fails at once."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import pytest
from aiohttp import web

from omni_actors.api.app import build_app
from omni_actors.config.pipeline import PipelineConfig, get_pipeline
from omni_actors.errors import StageFailed
from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import make_deploy, running

ODD_ENGINE = "tests.orchestrator.odd_engines:OddKeyEngine"


def odd_pipeline() -> PipelineConfig:
    base = get_pipeline("synthetic_text")
    return msgspec.structs.replace(
        base, stages=tuple(msgspec.structs.replace(s, engine=ODD_ENGINE) for s in base.stages)
    )


async def test_an_output_the_worker_cannot_encode_fails_its_request_only() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"chunks": 3}}])
    async with running(deploy, pipeline=odd_pipeline()) as orch:
        worker = orch.workers[0][0]
        odd = orch.submit(RequestSpec(inputs={"prompt": "a b c"}, params={"odd_text": True}, deadline_s=600))
        with pytest.raises(StageFailed, match="could not be sent"):
            await asyncio.wait_for(odd.collect(), 30)
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "a b c"})).collect()
        assert "".join(c.data["text"] for c in chunks) == "a b c"
        assert orch.workers[0][0] is worker and orch.statistics().worker_restarts == 0


async def test_an_undecodable_output_fails_its_request_at_once_and_is_counted() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"chunks": 3}}])
    async with running(deploy, pipeline=odd_pipeline()) as orch:
        # The deadline is far away: only the undecodable frame can end this request in time.
        odd = orch.submit(RequestSpec(inputs={"prompt": "a b c"}, params={"odd_key": True}, deadline_s=600))
        with pytest.raises(StageFailed, match="could not be decoded"):
            await asyncio.wait_for(odd.collect(), 30)
        assert orch.statistics().requests_in_flight == 0
        # The worker and the bus go on: the next request is served.
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "a b c"})).collect()
        assert "".join(c.data["text"] for c in chunks) == "a b c"
        assert orch.statistics().worker_restarts == 0
        runner = web.AppRunner(build_app(orch), handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            host, port = runner.addresses[0][:2]
            async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/metrics") as resp:
                text = await resp.text()
        finally:
            await runner.cleanup()
        counted = [ln for ln in text.splitlines() if ln.startswith("omni_bus_frames_undecodable_total{")]
        assert counted and float(counted[0].split()[1]) >= 1, counted
