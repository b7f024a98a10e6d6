"""Each stage worker reports where its start-up went (its Ready), and the orchestrator shows it:
one `stage.ready` log line per replica, the replica's statistics, and /metrics."""

from __future__ import annotations

import os
import signal

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import serve
from tests.conftest import eventually, make_deploy, running

LOAD_MS = 300
"""Stage 0's simulated weight loading (synthetic engine `load_ms`, timed as phase "weights")."""
WORKER_PHASES = ("boot", "imports", "engine", "total")
RESTART_WAIT_S = 30.0
"""Longest wait for the killed worker's replacement to be Ready (a fresh interpreter on a busy box)."""


async def test_every_replica_reports_its_start_up_phases() -> None:
    stages = [{"stage_id": 0, "num_replicas": 2, "engine_extras": {"load_ms": LOAD_MS}}]
    with structlog.testing.capture_logs() as logs:
        async with serve("synthetic", stages=stages) as srv:
            stats = srv.orch.statistics()
            async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/metrics") as resp:
                text = await resp.text()

    replicas = {(st.stage_id, r.replica): r.startup for st in stats.stages for r in st.replicas}
    assert sorted(replicas) == [(0, 0), (0, 1), (1, 0), (2, 0)]
    for key, phases in replicas.items():
        assert all(p in phases for p in (*WORKER_PHASES, "ready")), (key, phases)
        assert all(v >= 0.0 for v in phases.values()), (key, phases)
        assert phases["boot"] >= 0.0, (key, phases)  # (a worker forked from the zygote starts within a tick)
        # the worker's parts fit in its total (1 ms: each is rounded to ms), and the engine's
        # own phases fit in the engine's construction
        assert phases["boot"] + phases["imports"] + phases["engine"] <= phases["total"] + 0.002, (key, phases)
        inner = sum(v for k, v in phases.items() if k.startswith("engine."))
        assert inner <= phases["engine"] + 0.001 * max(1, len(phases)), (key, phases)
        # seen from the orchestrator, spawn -> Ready spans the worker's own account of it
        assert phases["ready"] + 0.05 >= phases["total"], (key, phases)
    for replica in (0, 1):
        assert replicas[(0, replica)]["engine.weights"] >= LOAD_MS / 1000, replicas[(0, replica)]
    assert replicas[(1, 0)].get("engine.weights", 0.0) < LOAD_MS / 1000  # only stage 0 loads slowly

    ready = [e for e in logs if e["event"] == "stage.ready"]
    assert sorted((e["stage_id"], e["replica"]) for e in ready) == sorted(replicas)  # once per replica
    for e in ready:
        phases = replicas[(e["stage_id"], e["replica"])]
        assert {f"{k.replace('.', '_')}_s": v for k, v in phases.items()}.items() <= e.items(), e

    exported = {
        (s.labels["stage_id"], s.labels["replica"], s.labels["phase"]): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
        if s.name == "omni_worker_startup_seconds"
    }
    for (stage_id, replica), phases in replicas.items():
        for phase, seconds in phases.items():
            assert exported[(str(stage_id), str(replica), phase)] == seconds


async def test_a_restarted_worker_reports_its_own_start_up() -> None:
    stages = [{"stage_id": 0, "engine_extras": {"load_ms": LOAD_MS}}]
    with structlog.testing.capture_logs() as logs:
        async with running(make_deploy("synthetic_text", stages=stages)) as orch:
            first = orch.workers[0][0]
            before = orch.statistics().stage(0).replicas[0].startup
            os.kill(first.pid, signal.SIGKILL)
            await eventually(lambda: orch.workers[0][0] is not first, 10.0)
            await orch.wait_healthy(RESTART_WAIT_S)
            after = orch.statistics().stage(0).replicas[0].startup
    assert after["engine.weights"] >= LOAD_MS / 1000 and after["total"] > 0, after
    assert after != before  # the new process's own account, not the first one's
    restarted = [e for e in logs if e["event"] == "worker.restarted"]
    assert len(restarted) == 1 and restarted[0]["total_s"] == after["total"], restarted
