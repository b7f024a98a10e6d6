"""Diffusion replicas: served images/s with 1 replica vs N replicas, one device each, same run.

The `diffusion` pipeline on a diffusers folder, through an in-process
Orchestrator and real worker processes (no HTTP). For each replica count the
runtime starts with `num_replicas: R` and `devices` the first R of --devices
(the launcher gives replica i device i), warms every replica up, then keeps
--concurrency one-image requests in flight until --images images are done.
The first replica count is the baseline of the others (`gain`).

    python scripts/bench_replicas.py --model DIR --devices 0,1 --replicas 1,2 \\
        --dtype float16 --size 512 --steps 20 --concurrency 8 --images 32

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec

PROMPT = "a lighthouse on a cliff at dawn, oil painting"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--devices", default="0,1", help="one device per replica, in order")
    ap.add_argument("--replicas", default="1,2", help="replica counts to compare; the first is the baseline")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--images", type=int, default=32, help="images per measurement")
    ap.add_argument("--max-num-seqs", type=int, default=4, help="batch per replica")
    ap.add_argument(
        "--gather-ms", default=None,
        help='engine_extras batch_gather_ms values to compare, e.g. "0,10" (default: the engine\'s own)',
    )  # fmt: skip
    return ap.parse_args()


async def measure(args: argparse.Namespace, replicas: int, gather_ms: float | None) -> dict[str, Any]:
    devices = [d.strip() for d in args.devices.split(",")][:replicas]
    deploy = build_deploy(
        {
            "pipeline": "diffusion",
            "model": str(args.model),
            "stages": [{
                "stage_id": 0, "num_replicas": replicas, "devices": ",".join(devices),
                "max_num_seqs": args.max_num_seqs, "max_queue": 256, "dtype": args.dtype,
                "engine_extras": {} if gather_ms is None else {"batch_gather_ms": gather_ms},
            }],
        },
        source="bench_replicas",
    )  # fmt: skip
    params = {"num_inference_steps": args.steps, "width": args.size, "height": args.size}
    orch = Orchestrator(deploy)
    t0 = time.perf_counter()
    await orch.start()
    startup = time.perf_counter() - t0
    next_seed = 0

    async def image() -> None:
        nonlocal next_seed
        next_seed += 1
        out = await orch.submit(RequestSpec(inputs={"prompt": PROMPT}, params={**params, "seed": next_seed})).collect()
        if not out or "images" not in out[-1].data:
            raise RuntimeError(f"no image: {out[-1].data if out else 'nothing'}")

    async def run(total: int) -> float:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(total):
            queue.put_nowait(i)

        async def lane() -> None:
            while not queue.empty():
                queue.get_nowait()
                await image()

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(args.concurrency)))
        return total / (time.perf_counter() - start)

    try:
        await run(2 * replicas * args.max_num_seqs)  # warm-up: every replica runs a full batch
        ips = await run(args.images)
    finally:
        await orch.stop()
    return {"devices": devices, "startup_s": round(startup, 2), "images_per_s": round(ips, 3)}


async def main() -> None:
    args = parse_args()
    from omni_actors import logs

    logs.configure("bench")  # logs to stderr; stdout carries only the JSON line
    counts = [int(r) for r in args.replicas.split(",")]
    gathers = [float(g) for g in args.gather_ms.split(",")] if args.gather_ms else [None]
    results = {}
    for g in gathers:
        for r in counts:
            tag = f"replicas{r}" + ("" if g is None else f"@gather{g:g}ms")
            results[tag] = await measure(args, r, g)
    base = next(iter(results.values()))["images_per_s"]
    line = {
        "bench": "replicas",
        "model": str(args.model),
        "dtype": args.dtype,
        "size": args.size,
        "steps": args.steps,
        "concurrency": args.concurrency,
        "images": args.images,
        "max_num_seqs": args.max_num_seqs,
        "results": results,
        "gain": {k: round(v["images_per_s"] / base, 2) for k, v in results.items()},
    }
    print(json.dumps(line))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
