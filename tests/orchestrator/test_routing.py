"""End to end through real workers: routing with and without async chunk, fan-in, replicas, admission."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omni_actors.errors import AdmissionError, RequestRejected, StageFailed, StartupError
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import make_deploy, running

SLOW = {"step_delay_ms": 20}


def texts(chunks, stage_id: int) -> str:
    return "".join(c.data.get("text", "") for c in chunks if c.stage_id == stage_id)


@pytest.mark.parametrize("async_chunk", [True, False])
async def test_three_stages_stream_text_and_audio(async_chunk: bool) -> None:
    # The thinker is slow (150 ms a token) so that, on a busy box too, downstream
    # stages have ample time to turn its first token into audio before it ends.
    deploy = make_deploy(async_chunk=async_chunk, stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": 150}}])
    async with running(deploy) as orch:
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "one two three"})).collect()
        assert texts(chunks, 0) == "one two three one"
        audio = [c for c in chunks if c.output_type == "audio"]
        assert all(c.data["sample_rate"] == 24000 and c.data["audio"].dtype == np.float32 for c in audio)
        assert audio[-1].finished and sum(c.finished for c in chunks) == 2
        text_done = next(i for i, c in enumerate(chunks) if c.stage_id == 0 and c.finished)
        first_audio = chunks.index(audio[0])
        if async_chunk:
            # One talker/vocoder chunk per text delta, and audio starts before the text ends.
            assert len(audio) == 4
            assert first_audio < text_done
        else:
            assert first_audio > text_done
        stats = orch.statistics()
        assert stats.requests_in_flight == 0 and stats.leases_held == 0


@pytest.mark.parametrize("async_chunk", [True, False])
async def test_fan_in_waits_for_both_sources(async_chunk: bool) -> None:
    deploy = make_deploy("synthetic_fanin", async_chunk=async_chunk)
    async with running(deploy) as orch:
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "a b"})).collect()
        assert {c.stage_id for c in chunks} == {3}
        # async: one output per fed chunk from each of the two sources (4 + 4);
        # full payload: the join runs once on both inputs merged.
        assert len(chunks) == (8 if async_chunk else 4)
        assert chunks[-1].finished


async def test_outputs_do_not_mix_between_concurrent_requests() -> None:
    deploy = make_deploy(stages=[{"stage_id": 0, "engine_extras": {"chunks": 6, **SLOW}}])
    async with running(deploy) as orch:
        prompts = [f"w{i} x{i} y{i}" for i in range(6)]
        results = await asyncio.gather(*(orch.submit(RequestSpec(inputs={"prompt": p})).collect() for p in prompts))
        alone = await orch.submit(RequestSpec(inputs={"prompt": prompts[3]})).collect()
        for p, chunks in zip(prompts, results, strict=True):
            assert texts(chunks, 0).split() == (p.split() * 2)[:6]
        assert [c.data["text"] for c in alone if c.stage_id == 0] == [
            c.data["text"] for c in results[3] if c.stage_id == 0
        ]
        np.testing.assert_array_equal(
            np.concatenate([c.data["audio"] for c in alone if c.output_type == "audio"]),
            np.concatenate([c.data["audio"] for c in results[3] if c.output_type == "audio"]),
        )


async def test_replicas_share_load_least_loaded() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "num_replicas": 2, "engine_extras": SLOW}])
    async with running(deploy) as orch:
        streams = [orch.submit(RequestSpec(inputs={"prompt": "a b"})) for _ in range(8)]
        loads = [r.in_flight for r in orch.statistics().stage(0).replicas]
        assert loads == [4, 4]
        await asyncio.gather(*(s.collect() for s in streams))
        assert [r.in_flight for r in orch.statistics().stage(0).replicas] == [0, 0]


async def test_admission_limit_is_a_distinct_error() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "max_queue": 2, "engine_extras": SLOW}])
    async with running(deploy) as orch:
        streams = [orch.submit(RequestSpec(inputs={"prompt": "a"})) for _ in range(2)]
        with pytest.raises(AdmissionError) as err:
            orch.submit(RequestSpec(inputs={"prompt": "a"}))
        assert err.value.stage_id == 0
        await asyncio.gather(*(s.collect() for s in streams))
        await orch.submit(RequestSpec(inputs={"prompt": "a"})).collect()  # room again


async def test_engine_error_fails_only_that_request() -> None:
    async with running(make_deploy(stages=[{"stage_id": 2, "engine_extras": {"fail_on_chunk": 1}}])) as orch:
        # Refused at add (the engine's ValueError): the caller's fault.
        with pytest.raises(RequestRejected, match="synthetic failure requested") as refused:
            await orch.submit(RequestSpec(inputs={"prompt": "x"}, stage_params={1: {"fail": True}})).collect()
        assert refused.value.stage_id == 1
        # Failed while running: the engine's fault, not a rejection.
        with pytest.raises(StageFailed, match="synthetic failure at chunk") as failed:
            await orch.submit(RequestSpec(inputs={"prompt": "y"})).collect()
        assert not isinstance(failed.value, RequestRejected) and failed.value.stage_id == 2
        ok = await orch.submit(RequestSpec(inputs={"prompt": "fine"}, stages=(0, 1))).collect()
        assert texts(ok, 0).startswith("fine")
        assert orch.statistics().requests_failed == 2


async def test_a_value_the_bus_cannot_carry_fails_only_its_request() -> None:
    async with running(make_deploy("synthetic_text")) as orch:
        # Submitted in one loop turn, both AddRequests share one frame to the stage.
        bad = orch.submit(RequestSpec(inputs={"prompt": "x"}, params={"seed": 2**70}))
        good = orch.submit(RequestSpec(inputs={"prompt": "fine"}))
        with pytest.raises(RequestRejected, match="cannot be sent"):
            await bad.collect()
        assert texts(await good.collect(), 0).startswith("fine")
        assert orch.statistics().requests_in_flight == 0


async def test_stage_subset_runs_only_selected_stages() -> None:
    async with running(make_deploy()) as orch:
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "t"}, stages=(0,))).collect()
        assert {c.output_type for c in chunks} == {"text"}


async def test_engine_that_cannot_start_names_its_stage() -> None:
    deploy = make_deploy(stages=[{"stage_id": 1, "engine_extras": {"fail_start": True}}])
    orch = Orchestrator(deploy)
    with pytest.raises(StartupError) as err:
        await orch.start()
    assert err.value.stage_id == 1 and "fail at start" in str(err.value)
    assert orch.runtime is not None and not orch.runtime.path.exists()


async def test_tcp_transport_works_like_ipc() -> None:
    async with running(make_deploy("synthetic_text"), endpoint="tcp://127.0.0.1:0") as orch:
        assert orch.router is not None and orch.router.endpoint.startswith("tcp://127.0.0.1:")
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "over tcp"})).collect()
        assert texts(chunks, 0) == "over tcp over tcp"
