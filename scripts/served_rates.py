"""served_rates: requests/s of a deployment at each asked concurrency (best of N), for the diffusion and video benchmarks.

"Served" is the runtime without HTTP: the in-process orchestrator and real
worker processes, requests through `Orchestrator.submit`. Not a script itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from scripts.gpu_mem import gpu_used_gb


def concurrency_list(text: str) -> list[int]:
    """argparse type of --concurrency: "1,4" -> [1, 4] (sorted, no repeats)."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return sorted(set(values))


class ServedRun:
    """The orchestrator and its real workers kept up between measurements, its event loop on a thread of its
    own (so a measurement of something else in between, say the direct baseline, leaves heartbeats answered).

    `rate(c, rounds, seed)` runs `rounds` rounds of `c` requests at once (request i of a round gets seed
    `seed + i`) and returns requests/s; every result's last output must carry `key`. With `record`, the
    gaps between consecutive per-step progress outputs of concurrency-1 requests, as they reach the
    orchestrator, are kept for `step_ms` (the first step left out).
    """

    def __init__(self, deploy: Any, inputs: dict[str, Any], params: dict[str, Any], key: str) -> None:
        from omni_actors.orchestrator.core import Orchestrator

        self.inputs, self.params, self.key = inputs, params, key
        self.gaps: list[float] = []
        self.gpu_used_before_gb = gpu_used_gb()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="served-run", daemon=True)
        self._thread.start()
        async def make() -> Orchestrator:  # (its asyncio parts belong to the loop's thread)
            return Orchestrator(deploy)

        self.orch = self._run(make())
        t0 = time.perf_counter()
        try:
            self._run(self.orch.start())
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - t0

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _one(self, spec: Any, record: bool) -> list[Any]:
        chunks, last_step, last_at = [], None, 0.0
        async for chunk in self.orch.submit(spec):
            now = time.perf_counter()
            chunks.append(chunk)
            step = chunk.data.get("step") if self.key not in chunk.data else None
            if isinstance(step, int):
                if record and last_step is not None and last_step >= 1 and step == last_step + 1:
                    self.gaps.append(now - last_at)
                last_step, last_at = step, now
        return chunks

    async def _rounds(self, c: int, rounds: int, seed: int, record: bool) -> float:
        from omni_actors.orchestrator.requests import RequestSpec

        start = time.perf_counter()
        for r in range(rounds):
            specs = [RequestSpec(inputs=dict(self.inputs), params={**self.params, "seed": seed + r * c + i})
                     for i in range(c)]
            results = await asyncio.gather(*(self._one(s, record and c == 1) for s in specs))
            assert all(res and self.key in res[-1].data for res in results)
        return rounds * c / (time.perf_counter() - start)

    def rate(self, c: int, rounds: int, seed: int = 0, record: bool = True) -> float:
        return self._run(self._rounds(c, rounds, seed, record))

    @property
    def step_ms(self) -> float | None:
        return 1000 * statistics.median(self.gaps) if self.gaps else None

    def close(self) -> None:
        try:
            self._run(self.orch.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


def served_rates(
    deploy: Any, inputs: dict[str, Any], params: dict[str, Any], key: str, per_measurement: int, repeats: int,
    concurrency: list[int],
) -> dict[str, Any]:
    """{"startup_s", "c<N>" for each N in `concurrency`, "step_ms", "gpu_used_before_gb", "gpu_used_gb"}.

    Each rate is the best of `repeats` runs of `per_measurement` requests (ServedRun.rate), measured one
    concurrency after the other. "step_ms": ServedRun's, the pace at which steps are issued (the worker
    does not synchronise the device at a step's end), which tracks device time once the launch queue
    is full (large models), and runs ahead of it on short steps. "gpu_used_before_gb" / "gpu_used_gb":
    nvidia-smi's device-wide used memory before the orchestrator starts and after the last measurement
    with the workers still up (every process on the GPUs; None without nvidia-smi).
    """
    run = ServedRun(deploy, inputs, params, key)
    out: dict[str, Any] = {"gpu_used_before_gb": run.gpu_used_before_gb, "startup_s": run.startup_s}
    try:
        for c in concurrency:
            run.rate(c, 1, record=False)  # warm-up
            rounds = max(1, per_measurement // c)
            out[f"c{c}"] = max(run.rate(c, rounds) for _ in range(repeats))
        out["gpu_used_gb"] = gpu_used_gb()
    finally:
        run.close()
    out["step_ms"] = run.step_ms
    return out
