"""Worker start-up: CPU workers forked from the zygote, against fresh interpreters (the same-run baseline).

A tiny checkpoint of a family (default `csm`: a backbone and a Mimi decoder, two transformers stages) is
written once; then, in one process per mode (OMNI_WORKER_ZYGOTE=1 / 0, as `omni-run` would run), the
pipeline is started and stopped `--starts` times in a row, each start timed from `Orchestrator.start()`
to every replica Ready. The zygote's first start pays its imports once; the later ones fork.

    .venv/bin/python scripts/bench_worker_start.py [--family csm] [--starts 3]

Prints one JSON line: seconds per start and each replica's own account of its last start (imports,
engine), per mode, and how much faster the later starts are with the zygote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = {"fresh": "0", "zygote": "1"}


async def _child(family: str, model: str, starts: int) -> dict:
    from omni_actors.config.deploy import build_deploy
    from omni_actors.orchestrator.core import Orchestrator

    seconds, phases = [], {}
    for _ in range(starts):
        orch = Orchestrator(build_deploy({"pipeline": family, "model": model}, source="bench"))
        t0 = time.perf_counter()
        await orch.start()
        seconds.append(round(time.perf_counter() - t0, 3))
        phases = {f"s{st.stage_id}r{r.replica}": {k: r.startup[k] for k in ("imports", "engine", "total")
                                                     if k in r.startup}
                  for st in orch.statistics().stages for r in st.replicas}
        await orch.stop()
    return {"starts_s": seconds, "last_start_phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="csm")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.family, args.child, args.starts))))
        return
    from omni_actors.models.tiny import make_tiny

    out: dict = {"bench": "worker_start", "family": args.family, "starts": args.starts}
    with tempfile.TemporaryDirectory(prefix="omni-bench-start-") as tmp:
        model = make_tiny(args.family, Path(tmp) / args.family, seed=0)
        for mode, flag in MODES.items():
            env = {**os.environ, "OMNI_WORKER_ZYGOTE": flag, "OMNI_LOG_LEVEL": "warning", "OMP_NUM_THREADS": "1"}
            done = subprocess.run([sys.executable, __file__, "--family", args.family, "--starts", str(args.starts),
                                   "--child", str(model)], env=env, capture_output=True, text=True, check=True)
            out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    later = {m: statistics.median(out[m]["starts_s"][1:] or out[m]["starts_s"]) for m in MODES}
    out["later_start_s"] = later
    out["later_speedup"] = round(later["fresh"] / later["zygote"], 2)
    out["first_start_ratio"] = round(out["zygote"]["starts_s"][0] / out["fresh"]["starts_s"][0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
