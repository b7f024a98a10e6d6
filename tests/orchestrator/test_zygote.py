"""CPU workers forked from one zygote that imported torch once: what they share, what still starts fresh."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import msgspec
import psutil
import pytest

from omni_actors.config.pipeline import get_pipeline
from omni_actors.orchestrator import zygote
from omni_actors.orchestrator.launcher import worker_env
from omni_actors.orchestrator.requests import RequestSpec
from tests.conftest import eventually, make_deploy, running

RESTART_WAIT_S = 30.0


def _parent(pid: int) -> int:
    return psutil.Process(pid).ppid()


async def _answer(orch) -> bool:
    chunks = await orch.submit(RequestSpec(inputs={"prompt": "a b"}, params={"chunks": 2})).collect()
    return chunks[-1].finished


async def test_plain_workers_are_forked_from_one_zygote_and_a_stage_env_starts_fresh() -> None:
    stages = [{"stage_id": 0, "num_replicas": 2}, {"stage_id": 1, "env": {"OMNI_TEST_MARK": "1"}}]
    async with running(make_deploy("synthetic", stages=stages)) as orch:
        forked = [*orch.workers[0], *orch.workers[2]]
        parents = {_parent(h.pid) for h in forked}
        assert len(parents) == 1 and parents != {os.getpid()}, parents  # one zygote, not this process
        (z,) = parents
        assert "omni_actors.workers.zygote" in " ".join(psutil.Process(z).cmdline())
        assert all(isinstance(h.proc, zygote.ForkedWorker) for h in forked)
        fresh = orch.workers[1][0]
        assert _parent(fresh.pid) == os.getpid()  # its own environment: a fresh interpreter
        assert psutil.Process(fresh.pid).environ()["OMNI_TEST_MARK"] == "1"
        assert "OMNI_TEST_MARK" not in psutil.Process(forked[0].pid).environ()
        assert await _answer(orch)
    for h in forked:
        assert not psutil.pid_exists(h.pid) or psutil.Process(h.pid).status() == psutil.STATUS_ZOMBIE


async def test_a_killed_forked_worker_is_seen_dead_and_forked_again() -> None:
    async with running(make_deploy("synthetic_text")) as orch:
        first = orch.workers[0][0]
        assert isinstance(first.proc, zygote.ForkedWorker)
        z = _parent(first.pid)
        os.kill(first.pid, signal.SIGKILL)
        assert await first.proc.wait() == -signal.SIGKILL  # the zygote reaped it and said so
        await eventually(lambda: orch.workers[0][0] is not first, 10.0)
        await orch.wait_healthy(RESTART_WAIT_S)
        again = orch.workers[0][0]
        assert isinstance(again.proc, zygote.ForkedWorker) and _parent(again.pid) == z
        assert await _answer(orch)


async def test_a_closed_zygote_ends_and_its_workers_with_it() -> None:
    z = zygote.Zygote(worker_env())
    worker = await z.fork('{"not": "a spec"}')  # the worker fails at once: a bad spec
    assert await worker.wait() != 0
    pid = z.pid
    z.close()
    assert not z.alive and not psutil.pid_exists(pid)
    try:
        await z.fork("{}")
    except zygote.ZygoteGone:
        pass
    else:
        raise AssertionError("a closed zygote forked")


async def test_a_changed_environment_gets_a_new_zygote(monkeypatch) -> None:
    async with running(make_deploy("synthetic_text")) as orch:
        old = _parent(orch.workers[0][0].pid)
    monkeypatch.setenv("OMNI_TEST_CHANGED", "1")  # (as a library setting a variable in this process would)
    async with running(make_deploy("synthetic_text")) as orch:
        worker = orch.workers[0][0]
        new = _parent(worker.pid)
        assert isinstance(worker.proc, zygote.ForkedWorker) and new not in (old, os.getpid())
        assert psutil.Process(new).environ()["OMNI_TEST_CHANGED"] == "1"
        assert await _answer(orch)
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE


async def test_a_new_environment_forks_from_a_new_zygote_while_the_old_one_still_has_workers(monkeypatch) -> None:
    async with running(make_deploy("synthetic_text")) as first:
        old = _parent(first.workers[0][0].pid)
        monkeypatch.setenv("OMNI_TEST_CHANGED_BUSY", "1")
        async with running(make_deploy("synthetic_text")) as second:
            worker = second.workers[0][0]
            new = _parent(worker.pid)
            assert isinstance(worker.proc, zygote.ForkedWorker) and new not in (old, os.getpid())
            assert psutil.pid_exists(old)  # it still serves the first run's worker
            assert await _answer(first) and await _answer(second)
    zygote.shared(worker_env())  # (the next fork's lookup ends the retired zygote, idle now)
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE


async def test_a_fork_cancelled_while_pending_is_killed_when_its_pid_comes() -> None:
    async with running(make_deploy("synthetic_text")) as orch:
        assert orch.launcher is not None
        ws = orch.launcher.worker_spec(orch.workers[0][0])
        # A worker that would wait forever: nothing listens where it connects.
        spec = msgspec.json.encode(msgspec.structs.replace(
            ws, endpoint="ipc:///nonexistent/omni-test-nobody", identity="orphan")).decode()
        z = zygote.shared(worker_env())
        assert z is not None
        before = {p.pid for p in psutil.Process(z.pid).children()}
        task = asyncio.ensure_future(z.fork(spec, worker_env(), ws.stage.engine))
        await asyncio.sleep(0)  # (the request is on the socket)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        failing = await z.fork('{"not": "a spec"}')  # (the zygote forks in order: the orphan came first)
        assert await failing.wait() != 0
        await eventually(lambda: {p.pid for p in psutil.Process(z.pid).children()} <= before, 10.0)
        assert await _answer(orch)


async def test_with_json_logs_what_workers_write_to_stderr_arrives_as_json_lines_to_the_last(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    # Torch's C++ warnings go straight to fd 2: forked workers (stages 0, 2) and a fresh one (its own
    # env, stage 1) alike must not put plain text among the JSON lines, nor lose what they write last.
    monkeypatch.setenv("OMNI_LOG_JSON", "1")
    burst = 3000  # ~200 KB written as the worker ends: more than a pipe holds by default
    stages = [{"stage_id": s, "engine_extras": {"stderr_burst": burst}} for s in (0, 2)]
    stages.insert(1, {"stage_id": 1, "env": {"OMNI_TEST_MARK": "1"}, "engine_extras": {"stderr_burst": burst}})
    pipeline = get_pipeline("synthetic")
    pipeline = msgspec.structs.replace(pipeline, stages=tuple(
        msgspec.structs.replace(s, engine="tests.orchestrator.odd_engines:StderrEngine") for s in pipeline.stages))
    async with running(make_deploy("synthetic", stages=stages), pipeline=pipeline) as orch:
        assert await _answer(orch)
    seen: dict[str, list[str]] = {f"s{s}r0": [] for s in (0, 1, 2)}
    captured = capfd.readouterr()
    printed = [json.loads(line) for line in captured.err.splitlines() if "printed on stdout" in line]
    assert sorted(e["line"] for e in printed) == [f"s{s}r0 printed on stdout" for s in (0, 1, 2)], printed
    assert all(e["event"] == "worker.stderr" for e in printed) and "printed on stdout" not in captured.out
    for line in captured.err.splitlines():
        if "Warning: s" not in line and "last words" not in line:
            continue
        event = json.loads(line)  # never a plain line
        assert event["event"] == "worker.stderr" and event["level"] == "warning", event
        tag = f"s{event['stage_id']}r{event['replica']}"
        assert event["line"].startswith(("[W1205", tag)) and tag in event["line"], event
        seen[tag].append(event["line"])
    for tag, lines in seen.items():
        assert len(lines) == burst + 2, (tag, len(lines))  # the start line, the burst, the last words
        assert lines[-1] == f"{tag} last words"
