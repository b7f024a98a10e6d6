"""Benchmark: per-stage-hop latency (concurrency 1) and stage-message throughput (concurrency 64).

Hop latency is the extra end-to-end time of the 3-stage synthetic pipeline
over the 1-stage one, per added stage (engines do no work, so this is all
runtime). The same-run baseline is the physical floor: a raw pyzmq
DEALER/ROUTER round trip between two processes on the same ipc transport.

    .venv/bin/python scripts/bench_orchestrator.py [--requests 400]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import tempfile
import time

import numpy as np
import uvloop
import zmq

from omni_actors import logs
from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec


def _echo(endpoint: str) -> None:
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"ready")
    while True:
        msg = sock.recv()
        if msg == b"stop":
            break
        sock.send(msg)
    sock.close(0)
    ctx.term()


def zmq_round_trip_us(n: int) -> dict[str, float]:
    tmp = tempfile.mkdtemp()
    endpoint = f"ipc://{tmp}/rt.sock"
    ctx = zmq.Context(1)
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    proc = mp.get_context("spawn").Process(target=_echo, args=(endpoint,))
    proc.start()
    ident, _ = router.recv_multipart()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        router.send_multipart([ident, b"x" * 64])
        router.recv_multipart()
        samples.append((time.perf_counter() - t0) * 1e6)
    router.send_multipart([ident, b"stop"])
    proc.join()
    router.close(0)
    ctx.term()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"p50": float(np.percentile(samples, 50)), "p99": float(np.percentile(samples, 99))}


async def latencies(pipeline: str, n: int) -> np.ndarray:
    # Every stage does the cheapest synthetic work (one short text chunk), so what is
    # measured is the runtime: messages, routing, codec, worker loops.
    stages = [{"stage_id": s, "engine_extras": {"chunks": 1, "kind": "text"}}
              for s in range(3 if pipeline == "synthetic" else 1)]
    orch = Orchestrator(build_deploy({"pipeline": pipeline, "async_chunk": True, "stages": stages}, "bench"))
    await orch.start()
    try:
        out = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            await orch.submit(RequestSpec(inputs={"prompt": "hop"})).collect()
            if i >= 20:  # warm-up excluded
                out.append((time.perf_counter() - t0) * 1e6)
        return np.array(out)
    finally:
        await orch.stop()


async def throughput(concurrency: int, chunks: int) -> dict[str, float]:
    stages = [{"stage_id": s, "max_num_seqs": concurrency, "engine_extras": {"chunks": chunks, "kind": "text"}}
              for s in range(3)]
    orch = Orchestrator(build_deploy({"pipeline": "synthetic", "async_chunk": True, "stages": stages}, "bench"))
    await orch.start()
    try:
        before = orch.statistics()
        t0 = time.perf_counter()
        await asyncio.gather(*(
            orch.submit(RequestSpec(inputs={"prompt": f"r{i} a b c"})).collect() for i in range(concurrency)
        ))
        wall = time.perf_counter() - t0
        after = orch.statistics()
        msgs = (after.messages_in - before.messages_in) + (after.messages_out - before.messages_out)
        return {"messages": msgs, "wall_s": wall, "messages_per_s": msgs / wall,
                "frames_per_s": ((after.frames_in - before.frames_in) + (after.frames_out - before.frames_out)) / wall}
    finally:
        await orch.stop()


async def main(args: argparse.Namespace) -> dict:
    one = await latencies("synthetic_text", args.requests)
    three = await latencies("synthetic", args.requests)
    hop_p50 = (np.percentile(three, 50) - np.percentile(one, 50)) / 2
    hop_p99 = (np.percentile(three, 99) - np.percentile(one, 99)) / 2
    tput = await throughput(64, args.chunks)
    return {
        "bench": "orchestrator",
        "hop_latency_us": {"p50": round(hop_p50, 1), "p99": round(hop_p99, 1)},
        "e2e_1stage_us": {"p50": round(float(np.percentile(one, 50)), 1), "p99": round(float(np.percentile(one, 99)), 1)},
        "e2e_3stage_us": {"p50": round(float(np.percentile(three, 50)), 1), "p99": round(float(np.percentile(three, 99)), 1)},
        "throughput_c64": {k: round(v, 1) for k, v in tput.items()},
        "baseline_zmq_round_trip_us": {k: round(v, 1) for k, v in zmq_round_trip_us(2000).items()},
        "targets": {"hop_p50_us": 150, "hop_p99_us": 1000, "messages_per_s": 20000},
    }


if __name__ == "__main__":
    logs.configure()
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--chunks", type=int, default=100)
    print(json.dumps(uvloop.run(main(p.parse_args()))))
