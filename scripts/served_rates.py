"""served_rates: requests/s of a deployment at each asked concurrency (best of N), for the diffusion and video benchmarks.

"Served" is the runtime without HTTP: the in-process orchestrator and real
worker processes, requests through `Orchestrator.submit`. Not a script itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from scripts.gpu_mem import gpu_used_gb


def concurrency_list(text: str) -> list[int]:
    """argparse type of --concurrency: "1,4" -> [1, 4] (sorted, no repeats)."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return sorted(set(values))


def served_rates(
    deploy: Any, inputs: dict[str, Any], params: dict[str, Any], key: str, per_measurement: int, repeats: int,
    concurrency: list[int],
) -> dict[str, Any]:
    """{"startup_s", "c<N>" for each N in `concurrency`, "step_ms", "gpu_used_before_gb", "gpu_used_gb"}.

    Each rate is the best of `repeats` runs of `per_measurement` requests. Request i of a round gets
    seed `seed + i`; every result's last output must carry `key`. "step_ms": the median gap between
    consecutive per-step progress outputs of the measured concurrency-1 requests as they reach the
    orchestrator, the first step left out (None without progress outputs or with fewer than three
    steps). The worker does not synchronise the device at a step's end, so this is the pace at which
    steps are issued, which tracks device time once the launch queue is full (large models), and
    runs ahead of it on short steps. "gpu_used_before_gb" / "gpu_used_gb": nvidia-smi's device-wide
    used memory before the orchestrator starts and after the last measurement with the workers still
    up (every process on the GPUs; None without nvidia-smi).
    """
    from omni_actors.orchestrator.core import Orchestrator
    from omni_actors.orchestrator.requests import RequestSpec

    gaps: list[float] = []

    async def one(orch: Orchestrator, spec: Any, record: bool) -> list[Any]:
        chunks, last_step, last_at = [], None, 0.0
        async for chunk in orch.submit(spec):
            now = time.perf_counter()
            chunks.append(chunk)
            step = chunk.data.get("step") if key not in chunk.data else None
            if isinstance(step, int):
                if record and last_step is not None and last_step >= 1 and step == last_step + 1:
                    gaps.append(now - last_at)
                last_step, last_at = step, now
        return chunks

    async def round_(orch: Orchestrator, c: int, seed: int, record: bool = False) -> None:
        specs = [RequestSpec(inputs=dict(inputs), params={**params, "seed": seed + i}) for i in range(c)]
        results = await asyncio.gather(*(one(orch, s, record and c == 1) for s in specs))
        assert all(r and key in r[-1].data for r in results)

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_used_before_gb": gpu_used_gb()}
        orch = Orchestrator(deploy)
        t0 = time.perf_counter()
        await orch.start()
        out["startup_s"] = time.perf_counter() - t0
        try:
            for c in concurrency:
                await round_(orch, c, 0)  # warm-up
                rounds = max(1, per_measurement // c)
                best = 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    for r in range(rounds):
                        await round_(orch, c, r * c, record=True)
                    best = max(best, rounds * c / (time.perf_counter() - start))
                out[f"c{c}"] = best
            out["gpu_used_gb"] = gpu_used_gb()
        finally:
            await orch.stop()
        out["step_ms"] = 1000 * statistics.median(gaps) if gaps else None
        return out

    return asyncio.run(run())
