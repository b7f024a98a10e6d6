"""Aborts, deadlines and worker deaths: one terminal event, leases freed, the stage comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq

from omni_actors.config.pipeline import get_pipeline
from omni_actors.errors import RequestAborted, RequestTimeout, StageUnavailable, WorkerDied
from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import SHM, eventually, make_deploy, running, shm_files

BIG = {"step_delay_ms": 30, "payload_bytes": 1 << 20, "chunks": 50}
RESTART_S = 15.0
"""Restart timeout in the kill tests: a worker starts in ~1 s, ~5 s on a loaded 2-core box."""


async def test_abort_mid_flight_frees_every_lease_and_reaches_every_stage() -> None:
    deploy = make_deploy(stages=[{"stage_id": s, "engine_extras": BIG} for s in (0, 1, 2)])
    async with running(deploy) as orch:
        for _ in range(3):
            stream = orch.submit(RequestSpec(inputs={"prompt": "a b c"}))
            seen = 0
            async for chunk in stream:
                seen += chunk.output_type == "audio"
                if seen == 2:
                    stream.abort()
                    break
            with pytest.raises(RequestAborted):
                await stream.collect()
            assert orch.statistics().requests_in_flight == 0
            # Every stage's worker confirms it dropped the request (Aborted): then its leases are freed.
            await eventually(lambda: all(s.engine_requests == 0 for s in orch.statistics().stages), 1.0)
            await eventually(lambda: orch.statistics().leases_held == 0, 1.0)
        # Every producer got every lease back (reported with the next heartbeat).
        await eventually(
            lambda: all(r.leases_out == 0 for s in orch.statistics().stages for r in s.replicas), 3.0
        )
        assert orch.arena.leased == 0
        assert orch.statistics().requests_aborted == 3


async def test_a_request_aborted_while_queued_at_a_busy_worker_is_dropped_and_its_segment_kept_till_then(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A slow step: the worker reads nothing meanwhile, so a request sent then waits in its socket.
    stage = {"stage_id": 0, "max_num_seqs": 1, "engine_extras": {"step_delay_ms": 800, "chunks": 3}}
    async with running(make_deploy("synthetic_text", stages=[stage])) as orch:
        busy = orch.submit(RequestSpec(inputs={"prompt": "busy"}))
        async for _ in busy:
            break  # its first step is done: the worker is in its second
        audio = np.zeros(48_000, dtype=np.float32)  # past the inline limit: in the orchestrator's shm
        queued = orch.submit(RequestSpec(inputs={"audio": audio, "sample_rate": 16_000, "prompt": "q"}))
        queued.abort()  # the client gave up while its input is still unread at the worker
        # What the orchestrator's trimmer does to a segment idle past OMNI_SHM_IDLE_S: the input's
        # segment must not be one of them while the worker has not answered the Abort.
        orch.arena.idle_s = 0.0
        orch.arena.trim()
        assert [c.output_type for c in await busy.collect()].count("text") >= 1
        with pytest.raises(RequestAborted):
            await queued.collect()
        await eventually(lambda: orch.arena.leased == 0 and len(orch.abort_waits) == 0, 5.0)
        orch.arena.trim()
        assert shm_files(orch.arena.prefix) == []
        assert orch.statistics().stage(0).in_flight == 0
    err = capfd.readouterr().err
    assert "worker.request_failed" not in err and "FileNotFoundError" not in err, err


async def test_deadline_ends_request_with_timeout() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": 50, "chunks": 100}}])
    async with running(deploy) as orch:
        stream = orch.submit(RequestSpec(inputs={"prompt": "x"}, deadline_s=0.3))
        with pytest.raises(RequestTimeout):
            await stream.collect()
        assert orch.statistics().stage(0).in_flight == 0


async def test_sigkill_fails_request_fast_and_restarted_stage_serves_next() -> None:
    deploy = make_deploy(stages=[{"stage_id": 1, "engine_extras": BIG}])
    # A replacement that fails to come up is itself replaced after RESTART_S: the stage must come back.
    async with running(deploy, restart_timeout_s=RESTART_S) as orch:
        stream = orch.submit(RequestSpec(inputs={"prompt": "a b"}))
        async for chunk in stream:
            if chunk.output_type == "audio":
                break
        victim = orch.workers[1][0]
        t0 = time.perf_counter()
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(WorkerDied) as err:
            await stream.collect()
        assert time.perf_counter() - t0 < 1.0
        assert err.value.stage_id == 1
        assert orch.health()[1] is False or orch.workers[1][0] is not victim
        with pytest.raises(StageUnavailable):
            if not orch.health()[1]:
                orch.submit(RequestSpec(inputs={"prompt": "too early"}))
            else:
                raise StageUnavailable(1)
        await orch.wait_healthy(3 * RESTART_S)
        assert orch.workers[1][0].pid != victim.pid
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "after"}, params={"chunks": 2})).collect()
        assert chunks[-1].finished
        stats = orch.statistics()
        assert stats.worker_restarts >= 1 and stats.leases_held == 0
        assert shm_files(victim.shm_prefix) == []


async def test_what_the_cuda_driver_leaves_of_a_worker_goes_when_it_ends() -> None:
    """The driver names a file after the process that exported an interprocess CUDA event and never
    removes it; here each is written as the driver would, for a worker that dies and one that stops."""

    def driver_file(pid: int) -> Path:
        path = SHM / f"cuda.shm.0.{pid:x}.1"
        path.write_bytes(bytes(64))
        return path

    async with running(make_deploy(), restart_timeout_s=RESTART_S) as orch:
        victim, survivor = orch.workers[1][0], orch.workers[2][0]
        died, stopped = driver_file(victim.pid), driver_file(survivor.pid)
        os.kill(victim.pid, signal.SIGKILL)
        await eventually(lambda: orch.workers[1][0] is not victim, RESTART_S)
        assert not died.exists()
        assert stopped.exists()  # (its process lives on)
    assert not stopped.exists()


async def test_segments_of_a_killed_run_are_swept_at_next_start() -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = f"/dev/shm/omni-{dead.stdout.strip()}-deadbeef-orch-0"
    with open(stale, "wb") as f:
        f.write(b"x")
    async with running(make_deploy("synthetic_text")):
        assert not os.path.exists(stale)


async def test_hung_worker_is_detected_by_missed_heartbeats_and_replaced() -> None:
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": 50, "chunks": 200}}])
    async with running(deploy, heartbeat_timeout_s=2.0) as orch:
        stream = orch.submit(RequestSpec(inputs={"prompt": "a"}))
        await stream.__anext__()
        victim = orch.workers[0][0]
        os.kill(victim.pid, signal.SIGSTOP)  # alive but silent
        with pytest.raises(WorkerDied, match="missed heartbeats"):
            await asyncio.wait_for(stream.collect(), 10)
        await orch.wait_healthy(30)
        assert orch.workers[0][0].pid != victim.pid
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "b"}, params={"chunks": 2})).collect()
        assert chunks[-1].finished


async def test_a_restart_that_never_becomes_ready_is_killed_and_tried_again(tmp_path) -> None:
    marker = tmp_path / "hang"
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"hang_marker": str(marker)}}])
    pipeline = get_pipeline("synthetic_text")
    pipeline = msgspec.structs.replace(pipeline, stages=tuple(
        msgspec.structs.replace(s, engine="tests.orchestrator.odd_engines:HangOnceEngine") for s in pipeline.stages))
    async with running(deploy, pipeline=pipeline, restart_timeout_s=3.0) as orch:
        first = orch.workers[0][0]
        marker.touch()  # the replacement takes it and hangs loading, beating all the while
        os.kill(first.pid, signal.SIGKILL)
        await eventually(lambda: orch.workers[0][0] is not first and orch.workers[0][0].proc is not None, 5.0)
        stuck = orch.workers[0][0]
        await orch.wait_healthy(30)
        now = orch.workers[0][0]
        assert not marker.exists() and not stuck.ready
        assert now.generation == 2 and now.pid not in (first.pid, stuck.pid)
        assert stuck.proc.returncode is not None  # the stuck one was ended, not left behind
        assert orch.statistics().worker_restarts == 2
        chunks = await orch.submit(RequestSpec(inputs={"prompt": "b"}, params={"chunks": 2})).collect()
        assert chunks[-1].finished


async def test_a_bus_endpoint_that_cannot_be_bound_fails_start_and_leaves_nothing() -> None:
    from omni_actors.orchestrator.core import Orchestrator

    orch = Orchestrator(make_deploy("synthetic_text"), endpoint="ipc:///nonexistent-dir/for/sure/bus.sock")
    with pytest.raises(zmq.ZMQError):
        await asyncio.wait_for(orch.start(), 30)  # (a socket left open would hang the context's term)
    assert orch.runtime is not None and not orch.runtime.path.exists()  # its runtime dir is gone
    assert shm_files(orch.run_prefix) == [] and orch.workers[0] == []
