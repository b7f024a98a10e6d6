"""Deploy `first_output_priority`: workers sharing a device hold while one makes a first output."""

from __future__ import annotations

import time

from omni_actors.bus import messages as m
from omni_actors.orchestrator.first_output import (
    HOLD_S,
    FirstOutputPriority,
    claims_first_outputs,
    devices_of,
)
from omni_actors.orchestrator.launcher import WorkerHandle
from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import make_deploy, running
from tests.orchestrator.test_routing import texts

# The vocoder (stage 2) makes each request's first audio on its first step: slow enough that the
# thinker, still writing the same request's text, is held for it.
STAGES = [{"stage_id": 0, "engine_extras": {"step_delay_ms": 30, "chunks": 6}},
          {"stage_id": 2, "engine_extras": {"step_delay_ms": 40}}]


async def _answer(priority: bool | None) -> tuple[str, int, int]:
    deploy = make_deploy(first_output_priority=priority, stages=STAGES)
    async with running(deploy) as orch:
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "one two three"})).collect()
        audio = sum(1 for c in chunks if c.output_type == "audio")
        return texts(chunks, 0), audio, orch.statistics().first_output_holds


async def test_first_outputs_hold_the_stages_sharing_the_device_and_change_no_output() -> None:
    text, audio, holds = await _answer(True)
    assert (text, audio) == ("one two three one two three", 6)
    # Each stage's first output held the other two (all CPU stages share the host).
    assert holds >= 3
    assert await _answer(False) == (text, audio, 0)
    assert await _answer(None) == (text, audio, 0)  # by default CPU stages do not take part


def _handle(stage_id: int, replica: int = 0) -> WorkerHandle:
    h = WorkerHandle(stage_id=stage_id, replica=replica, generation=0, identity=f"s{stage_id}r{replica}".encode(),
                     producer=f"s{stage_id}r{replica}", shm_prefix="x")
    h.ready = True
    return h


def test_only_workers_on_a_claimers_devices_are_held_until_no_claim_is_left() -> None:
    deploy = make_deploy(
        first_output_priority=True,
        stages=[{"stage_id": 0, "devices": "0"}, {"stage_id": 1, "devices": "0,1", "num_replicas": 2},
                {"stage_id": 2, "devices": "1"}],
    )  # fmt: skip
    thinker, talker0, talker1, code2wav = _handle(0), _handle(1, 0), _handle(1, 1), _handle(2)
    assert [devices_of(deploy, h.stage_id, h.replica, "cuda") for h in (thinker, talker0, talker1, code2wav)] == [
        {"0"}, {"0"}, {"1"}, {"1"}]
    sent: list[tuple[bytes, m.Message]] = []
    prio = FirstOutputPriority(deploy, "cuda", lambda ident, msg: sent.append((ident, msg)))
    workers = [thinker, talker0, talker1, code2wav]
    prio.on_claim(code2wav, True, workers)
    assert sent == [(b"s1r1", m.Hold(HOLD_S))]
    prio.on_claim(talker1, True, workers)  # a second claimer on GPU 1: the held one is released for it
    assert sent[1:] == [(b"s1r1", m.Hold(0.0))]
    prio.on_claim(code2wav, False, workers)
    assert sent[2:] == [(b"s2r0", m.Hold(HOLD_S))]  # the talker still claims: the vocoder waits now
    code2wav.dead = True
    prio.on_claim(talker1, False, workers)
    assert sent[3:] == [] and prio.holds == 2  # a dead worker is sent nothing


def test_by_default_only_stages_on_gpus_take_part() -> None:
    deploy = make_deploy(stages=[{"stage_id": 0, "devices": "1"}, {"stage_id": 2, "devices": "0"}])
    assert [claims_first_outputs(deploy, s, "cpu") for s in (0, 1, 2)] == [False] * 3
    assert [claims_first_outputs(deploy, s, "cuda") for s in (0, 1, 2)] == [True] * 3
    assert claims_first_outputs(make_deploy(first_output_priority=True), 0, "cpu")
    assert not claims_first_outputs(make_deploy(first_output_priority=False), 1, "cuda")
    sent: list[tuple[bytes, m.Message]] = []
    prio = FirstOutputPriority(deploy, "cuda", lambda ident, msg: sent.append((ident, msg)))
    prio.on_claim(_handle(2), True, [_handle(0), _handle(1), _handle(2)])
    assert sent == [(b"s1r0", m.Hold(HOLD_S))]  # stage 1 has no devices: CUDA's default, GPU 0
    prio = FirstOutputPriority(deploy, "cpu", lambda ident, msg: sent.append((ident, msg)))
    prio.on_claim(_handle(2), True, [_handle(0), _handle(1), _handle(2)])
    assert sent[1:] == []  # CPU stages only when asked


def test_a_clusters_workers_are_never_held() -> None:
    """With the Ray backend, workers on other hosts share no device with the claimer."""
    deploy = make_deploy(first_output_priority=True, cluster={"backend": "ray"})
    sent: list[tuple[bytes, m.Message]] = []
    prio = FirstOutputPriority(deploy, "cuda", lambda ident, msg: sent.append((ident, msg)))
    prio.on_claim(_handle(2), True, [_handle(0), _handle(1), _handle(2)])
    assert sent == [] and prio.holds == 0


async def test_a_held_worker_steps_again_when_its_hold_lapses() -> None:
    """A Hold whose release never comes (its claimer died mid-step) ends on its own."""
    deploy = make_deploy(stages=[{"stage_id": 0, "engine_extras": {"chunks": 2}}])
    async with running(deploy) as orch:
        entry = orch.workers[0][0]
        orch._send_to(entry.identity, m.Hold(0.3))
        t0 = time.monotonic()
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "a b"}, stages=(0,))).collect()
        assert texts(chunks, 0) == "a b"
        assert time.monotonic() - t0 >= 0.25  # held, then stepped without a release
