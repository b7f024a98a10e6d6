"""Benchmark: CPU used by the orchestrator and its workers over 10 s with no traffic.

The same-run baseline is a process that only sleeps for the same time (what
"nothing" costs to measure). Target: <= 1% of one core for everything.

    .venv/bin/python scripts/bench_idle.py [--seconds 10]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import psutil
import uvloop

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec


def cpu_s(procs: list[psutil.Process]) -> float:
    """CPU time of every thread of these processes, in seconds (ns resolution from schedstat)."""
    total = 0
    for p in procs:
        for task in os.listdir(f"/proc/{p.pid}/task"):
            with open(f"/proc/{p.pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


async def main(args: argparse.Namespace) -> dict:
    orch = Orchestrator(build_deploy({"pipeline": "synthetic", "async_chunk": True}, "bench"))
    await orch.start()
    try:
        await orch.submit(RequestSpec(inputs={"prompt": "warm up"})).collect()
        await asyncio.sleep(1.0)
        procs = [psutil.Process(os.getpid())] + [psutil.Process(h.pid) for hs in orch.workers.values() for h in hs]
        sleeper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(1); time.sleep({args.seconds})"])
        await asyncio.sleep(0.5)  # past the sleeper's interpreter start
        base_proc = psutil.Process(sleeper.pid)
        c0, b0, t0 = cpu_s(procs), cpu_s([base_proc]), time.perf_counter()
        await asyncio.sleep(args.seconds)
        c1, b1, wall = cpu_s(procs), cpu_s([base_proc]), time.perf_counter() - t0
        sleeper.wait()
        stats = orch.statistics()
        return {
            "bench": "idle_cpu",
            "seconds": round(wall, 2),
            "processes": len(procs),
            "cpu_percent_of_one_core": round(100 * (c1 - c0) / wall, 4),
            "baseline_sleeping_process_percent": round(100 * (b1 - b0) / wall, 4),
            "loop_wakeups_total": stats.loop_wakeups,
            "target_percent": 1.0,
        }
    finally:
        await orch.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    print(json.dumps(uvloop.run(main(p.parse_args()))))
