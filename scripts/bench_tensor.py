"""Benchmark: a 64 MiB array handed from stage to stage, against np.copyto of the same size.

The root stage of the synthetic fan-in pipeline emits a 64 MiB array per chunk;
both middle stages receive every chunk (through shared memory: written once by
the producer, mapped by each consumer). Handoff bandwidth is bytes delivered to
one consumer per second of wall time. The same-run baseline is np.copyto of
64 MiB between two preallocated arrays.

    .venv/bin/python scripts/bench_tensor.py [--chunks 40]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import uvloop

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec

SIZE = 64 * 1024 * 1024


def copy_bandwidth(reps: int) -> float:
    src = np.ones(SIZE, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    return SIZE * reps / (time.perf_counter() - t0)


async def handoff_bandwidth(chunks: int, rounds: int) -> list[float]:
    stages = [{"stage_id": 0, "engine_extras": {"payload_bytes": SIZE}}]
    orch = Orchestrator(build_deploy({"pipeline": "synthetic_fanin", "async_chunk": True, "stages": stages}, "bench"))
    await orch.start()
    try:
        await orch.submit(RequestSpec(inputs={"prompt": "warm"}, params={"chunks": 4})).collect()
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            await orch.submit(RequestSpec(inputs={"prompt": "x"}, params={"chunks": chunks})).collect()
            out.append(SIZE * chunks / (time.perf_counter() - t0))
        return out
    finally:
        await orch.stop()


def main(args: argparse.Namespace) -> dict:
    # Same treatment for both: several rounds, median (the box may be shared).
    base = float(np.median([copy_bandwidth(args.chunks) for _ in range(args.rounds)]))
    served = float(np.median(uvloop.run(handoff_bandwidth(args.chunks, args.rounds))))
    return {
        "bench": "tensor_handoff",
        "array_mib": SIZE // (1024 * 1024),
        "chunks": args.chunks,
        "rounds_median_of": args.rounds,
        "handoff_gb_s": round(served / 1e9, 2),
        "baseline_copyto_gb_s": round(base / 1e9, 2),
        "ratio": round(served / base, 2),
        "target_ratio": 0.5,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--chunks", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    print(json.dumps(main(p.parse_args())))
