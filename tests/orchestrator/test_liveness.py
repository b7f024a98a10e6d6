"""Worker liveness: long steps live, stuck steps and hung workers are caught, restarts back off sanely."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from omni_actors.errors import WorkerDied
from omni_actors.orchestrator.requests import RequestSpec
from tests.api.conftest import post, serve
from tests.conftest import eventually, make_deploy, running

RESTART_S = 30.0
"""Restart timeout here: a worker starts in ~1 s, ~5 s on a loaded 2-core box."""


def _text_stage(**extras: object) -> dict:
    return {"stage_id": 0, "engine_extras": {"chunks": 1, **extras}}


async def test_a_step_longer_than_the_heartbeat_timeout_completes() -> None:
    # Heartbeats leave from the worker's I/O thread during the step: a 6 s step under a 3 s
    # heartbeat timeout is a busy worker, not a dead one.
    deploy = make_deploy("synthetic_text", stages=[_text_stage(step_delay_ms=6000)])
    async with running(deploy, heartbeat_timeout_s=3.0) as orch:
        worker = orch.workers[0][0]
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "slow"})).collect()
        assert chunks[-1].finished and chunks[-1].data["text"] == "slow"
        assert orch.workers[0][0] is worker and orch.statistics().worker_restarts == 0


async def test_a_step_past_max_step_s_gets_the_worker_restarted_and_the_request_failed() -> None:
    stage = {**_text_stage(step_delay_ms=600_000), "max_step_s": 1.0}
    async with running(make_deploy("synthetic_text", stages=[stage]), restart_timeout_s=RESTART_S) as orch:
        victim = orch.workers[0][0]
        with pytest.raises(WorkerDied, match="max_step_s of 1 s") as err:
            await asyncio.wait_for(orch.submit(RequestSpec(inputs={"prompt": "stuck"})).collect(), 60)
        assert err.value.stage_id == 0
        await orch.wait_healthy(3 * RESTART_S)
        assert orch.workers[0][0].pid != victim.pid and victim.proc.returncode is not None


async def test_a_hung_worker_turns_health_to_503_and_is_refused_until_it_answers_again() -> None:
    # Default thresholds: unresponsive after a few missed heartbeats, killed only after a minute.
    async with serve("synthetic_text", key=None) as srv, aiohttp.ClientSession() as http:
        async def health() -> int:
            async with http.get(srv.url + "/health") as resp:
                return resp.status

        chat = {"model": "synthetic_text", "messages": [{"role": "user", "content": "hi"}]}
        assert await health() == 200
        victim = srv.orch.workers[0][0].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            status = 200
            for _ in range(200):  # ~20 s at most; the stage turns unhealthy after ~4 s
                status = await health()
                if status == 503:
                    break
                await asyncio.sleep(0.1)
            assert status == 503
            # New requests are refused at once instead of queueing into the hung worker.
            status, body = await asyncio.wait_for(post(srv, "/v1/chat/completions", chat), 10)
            assert status == 503, body
        finally:
            os.kill(victim, signal.SIGCONT)
        await eventually(lambda: srv.orch.health()[0], 20.0)
        assert await health() == 200
        status, body = await post(srv, "/v1/chat/completions", chat)
        assert status == 200, body
        assert srv.orch.workers[0][0].pid == victim  # it answered again: never killed


async def test_the_restart_backoff_resets_after_a_healthy_period() -> None:
    async with running(make_deploy("synthetic_text"), restart_timeout_s=RESTART_S,
                       backoff_reset_after_s=3.0) as orch:
        sup, key = orch.supervisor, (0, 0)

        async def kill_and_wait_back() -> None:
            h = orch.workers[0][0]
            os.kill(h.pid, signal.SIGKILL)
            await eventually(lambda: orch.workers[0][0] is not h, 10.0)
            await orch.wait_healthy(3 * RESTART_S)

        await kill_and_wait_back()
        assert sup.deaths_in_row[key] == 1
        await kill_and_wait_back()  # died right after it came back: the row goes on (a longer wait)
        assert sup.deaths_in_row[key] == 2
        await asyncio.sleep(3.5)  # healthy past backoff_reset_after_s
        await kill_and_wait_back()
        assert sup.deaths_in_row[key] == 1  # a new row: restarted without delay
        assert sup.restarts[key] == 3


async def test_a_restart_that_hangs_while_starting_is_given_up_on_and_tried_again() -> None:
    # The Ready timeout stays at its default (minutes): the hung replacement's silence ends it.
    # Each worker "loads weights" for 1.5 s (a forked worker is Ready within milliseconds otherwise,
    # and could be Ready before the test stops it).
    loading = [{"stage_id": 0, "engine_extras": {"load_ms": 1500}}]
    async with running(make_deploy("synthetic_text", stages=loading)) as orch:
        orch.supervisor.starting_silence_s = 3.0  # (set after start: the first workers load unwatched)
        first = orch.workers[0][0]
        os.kill(first.pid, signal.SIGKILL)
        # The replacement is stopped while it loads, before it can say Ready.
        await eventually(lambda: orch.workers[0][0] is not first and orch.workers[0][0].proc is not None, 10.0)
        stuck = orch.workers[0][0]
        os.kill(stuck.pid, signal.SIGSTOP)
        await orch.wait_healthy(60)
        now = orch.workers[0][0]
        assert now.generation >= 2 and now.pid not in (first.pid, stuck.pid)
        assert stuck.proc.returncode is not None  # the hung one was ended, not left behind
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "b"}, params={"chunks": 2})).collect()
        assert chunks[-1].finished
