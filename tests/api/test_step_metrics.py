"""/metrics shows each stage replica's engine progress from its heartbeats: the running step's age, steps done,
seconds spent in steps, a histogram of step durations; each replica's requests in flight and restarts; and the
audio real-time factor of answered requests."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from omni_actors.orchestrator.launcher import HEARTBEAT_INTERVAL_S
from tests.api.conftest import Server, serve

STEP_MS = 4000
"""One synthetic step per request (one chunk): long enough for heartbeats to see it running."""
SCRAPE_AFTER_S = 2.5 * HEARTBEAT_INTERVAL_S
"""Into the second request's step: at least one heartbeat has reported it by then."""
MSG = [{"role": "user", "content": "slow"}]


async def metrics_text(srv: Server) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/metrics") as resp:
        return await resp.text()


def worker_samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, replica) -> value of stage 0's worker gauges and counters."""
    return {(s.name, s.labels["replica"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name.startswith(("omni_worker_step", "omni_worker_busy", "omni_replica_"))
            and "le" not in s.labels and s.labels["stage_id"] == "0"}


async def test_a_running_step_and_the_steps_done_are_exported_per_replica() -> None:
    stages = [{"stage_id": 0, "engine_extras": {"chunks": 1, "step_delay_ms": STEP_MS}}]
    async with serve("synthetic_text", stages=stages) as srv:
        client = srv.client()
        idle = worker_samples(await metrics_text(srv))
        assert idle[("omni_worker_step_seconds", "0")] == 0.0 and idle[("omni_worker_steps_total", "0")] == 0.0
        assert idle[("omni_worker_busy_seconds_total", "0")] == 0.0
        first = await client.chat.completions.create(model="synthetic_text", messages=MSG)
        assert first.choices[0].message.content
        second = asyncio.ensure_future(client.chat.completions.create(model="synthetic_text", messages=MSG))
        await asyncio.sleep(SCRAPE_AFTER_S)  # (one scrape at a known point of the step; nothing to wait on)
        busy_text = await metrics_text(srv)
        busy = worker_samples(busy_text)
        assert busy[("omni_replica_in_flight", "0")] == 1 and busy[("omni_replica_restarts_total", "0")] == 0, busy
        assert (await second).choices[0].message.content
    # the second request's step is running, about SCRAPE_AFTER_S old; the first one's step is done
    assert HEARTBEAT_INTERVAL_S / 2 < busy[("omni_worker_step_seconds", "0")] < STEP_MS / 1000 * 3, busy
    assert busy[("omni_worker_steps_total", "0")] >= 1, busy
    # the first request's step (STEP_MS) is done and reported; the running one is not counted yet
    assert 0.9 * STEP_MS / 1000 <= busy[("omni_worker_busy_seconds_total", "0")] < 2 * STEP_MS / 1000, busy
    hist = {s.labels.get("le"): s.value for fam in text_string_to_metric_families(busy_text)
            for s in fam.samples if s.name == "omni_worker_step_duration_seconds_bucket" and s.labels["stage_id"] == "0"}
    assert hist["2.5"] == 0 and hist["5.0"] >= 1 and hist["+Inf"] == busy[("omni_worker_steps_total", "0")], hist


VOCODER_DELAY_MS = 300
"""The vocoder's every step: its first output comes at least this long after it starts on a request."""


async def test_each_stage_share_of_first_output_is_a_histogram() -> None:
    stages = [{"stage_id": 2, "engine_extras": {"step_delay_ms": VOCODER_DELAY_MS}}]
    async with serve("synthetic", key=None, stages=stages) as srv:
        for _ in range(2):
            await srv.client().chat.completions.create(
                model="synthetic", messages=MSG, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "omni_stage_first_output_seconds")
    by = {(s.name, s.labels["stage_id"], s.labels.get("le")): s.value for s in fam.samples}
    for stage in ("0", "1", "2"):  # every stage answered both requests once
        assert by[("omni_stage_first_output_seconds_count", stage, None)] == 2, by
        assert by[("omni_stage_first_output_seconds_bucket", stage, "+Inf")] == 2, by
    vocoder = by[("omni_stage_first_output_seconds_sum", "2", None)]
    assert vocoder >= 2 * VOCODER_DELAY_MS / 1000, by
    assert by[("omni_stage_first_output_seconds_sum", "0", None)] < vocoder / 2, by
    assert by[("omni_stage_first_output_seconds_bucket", "2", "0.25")] == 0, by  # all above the delay
    rtf = {s.name: s.value for f in text_string_to_metric_families(text) if f.name == "omni_audio_real_time_factor"
           for s in f.samples if s.labels["route"] == "/v1/chat/completions"}
    assert rtf["omni_audio_real_time_factor_count"] == 2 and rtf["omni_audio_real_time_factor_sum"] > 0, rtf
