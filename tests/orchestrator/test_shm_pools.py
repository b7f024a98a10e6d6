"""Shared-memory pools of real workers: bounded by their byte budget, given back when idle."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import eventually, make_deploy, running

MIB = 1 << 20
BUDGET_MB = 4
BURST = 16
CHUNKS = 6
STAGES = [
    {"stage_id": 0, "engine_extras": {"chunks": CHUNKS}},
    # Every talker chunk carries 1 MiB through shared memory to a slow vocoder.
    {"stage_id": 1, "shm_budget_mb": BUDGET_MB, "engine_extras": {"payload_bytes": MIB}},
    {"stage_id": 2, "engine_extras": {"step_delay_ms": 300}},
]


def segment_bytes(prefix: str) -> int:
    total = 0
    for path in Path("/dev/shm").glob(f"{prefix}-*"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def shm_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("/dev/shm/")
        except FileNotFoundError:
            pass
    return count


async def test_a_burst_stays_within_the_budget_and_idle_segments_and_fds_go_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_SHM_IDLE_S", "1")  # read by the workers this test starts
    async with running(make_deploy(stages=STAGES)) as orch:
        producer, consumer = orch.workers[1][0], orch.workers[2][0]
        peak = 0
        done = asyncio.Event()

        async def sample() -> None:  # (test side: watch the producer's segments during the burst)
            nonlocal peak
            while not done.is_set():
                peak = max(peak, segment_bytes(producer.shm_prefix))
                await asyncio.sleep(0.005)

        sampler = asyncio.ensure_future(sample())
        streams = [orch.submit(RequestSpec(inputs={"prompt": f"burst {i}"})) for i in range(BURST)]
        results = await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)), 120)
        done.set()
        await sampler
        for chunks in results:  # every request got all of its audio: the budget held nobody forever
            assert sum(c.output_type == "audio" for c in chunks) == CHUNKS
        assert peak > 0
        # At the budget the producer stops stepping; one step (one chunk per request) may pass it.
        assert peak <= BUDGET_MB * MIB + BURST * MIB, peak / MIB
        # Idle: the producer unlinks its segments, both sides close their mappings and files.
        await eventually(lambda: segment_bytes(producer.shm_prefix) == 0, 20.0)
        await eventually(lambda: shm_fds(producer.pid) == 0 and shm_fds(consumer.pid) == 0, 20.0)
        # The pools work again after giving everything back.
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "again"})).collect()
        assert sum(c.output_type == "audio" for c in chunks) == CHUNKS


async def test_a_consumer_that_keeps_its_leases_does_not_deadlock_the_budget() -> None:
    # Without async chunk the orchestrator buffers every talker chunk (and its lease) until the talker
    # finishes: holding the talker back cannot bring a lease back, so after a while it steps on.
    stages = [STAGES[0], {**STAGES[1], "shm_budget_mb": 2}, {"stage_id": 2}]
    async with running(make_deploy(stages=stages, async_chunk=False)) as orch:
        streams = [orch.submit(RequestSpec(inputs={"prompt": f"whole {i}"})) for i in range(2)]
        results = await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)), 120)
        assert all(chunks[-1].finished for chunks in results)
        assert orch.statistics().leases_held == 0
