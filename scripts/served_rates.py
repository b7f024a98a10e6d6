"""served_rates: requests/s of a deployment at concurrency 1 and 4 (best of N), for the diffusion and video benchmarks.

"Served" is the runtime without HTTP: the in-process orchestrator and real
worker processes, requests through `Orchestrator.submit`. Not a script itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


def served_rates(
    deploy: Any, inputs: dict[str, Any], params: dict[str, Any], key: str, per_measurement: int, repeats: int
) -> dict[str, float]:
    """{"startup_s", "c1", "c4"}: each rate the best of `repeats` runs of `per_measurement` requests.

    Request i of a round gets seed `seed + i`; every result's last output must carry `key`.
    """
    from omni_actors.orchestrator.core import Orchestrator
    from omni_actors.orchestrator.requests import RequestSpec

    async def round_(orch: Orchestrator, concurrency: int, seed: int) -> None:
        specs = [RequestSpec(inputs=dict(inputs), params={**params, "seed": seed + i}) for i in range(concurrency)]
        results = await asyncio.gather(*(orch.submit(s).collect() for s in specs))
        assert all(r and key in r[-1].data for r in results)

    async def run() -> dict[str, float]:
        orch = Orchestrator(deploy)
        t0 = time.perf_counter()
        await orch.start()
        out = {"startup_s": time.perf_counter() - t0}
        try:
            for c in (1, 4):
                await round_(orch, c, 0)  # warm-up
                rounds = max(1, per_measurement // c)
                best = 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    for r in range(rounds):
                        await round_(orch, c, r * c)
                    best = max(best, rounds * c / (time.perf_counter() - start))
                out[f"c{c}"] = best
        finally:
            await orch.stop()
        return out

    return asyncio.run(run())
