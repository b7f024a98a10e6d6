"""direct_rates: the same-run baseline of the diffusion and video benchmarks, diffusers called directly.

For each batch size: outputs/s (best of N), torch's peak allocated GPU memory over
the measurement, and the time per denoising step read from the pipeline's
`callback_on_step_end` (CUDA synchronised in the callback, so a step's time is its
device time). Not a script itself.
"""

from __future__ import annotations

import inspect
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from scripts.gpu_mem import peak_gb, reset_peak


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def direct_rates(
    pipe: Any, kwargs: Callable[[int, int], dict[str, Any]], batches: list[int], per_measurement: int,
    repeats: int, device: str,
) -> dict[int, dict[str, float | None]]:
    """{batch: {"rate", "peak_gb", "step_ms", "call_overhead_ms"}}.

    `kwargs(batch, seed)` is one call's arguments (`batch` prompts, seeds from `seed`). Each batch
    size gets a warm-up call, then `repeats` runs of `per_measurement // batch` calls; "rate" is the
    best run's outputs per second. "step_ms" is the median denoising step over every measured call,
    each call's first step left out (it carries the text encoding); "call_overhead_ms" is the median
    over calls of wall time minus (steps x that median): text encoding, VAE decode, postprocess. Both
    None when the pipeline has no step callback or runs fewer than two steps. "peak_gb" is
    `torch.cuda.max_memory_allocated` over the measured runs (None off CUDA).
    """
    sync = _sync(device)
    has_callback = "callback_on_step_end" in inspect.signature(pipe.__call__).parameters
    out: dict[int, dict[str, float | None]] = {}
    for batch in batches:
        steps: list[float] = []
        overheads: list[tuple[float, int]] = []
        _timed_call(pipe, kwargs(batch, 0), has_callback, sync)  # warm-up
        calls = max(1, per_measurement // batch)
        reset_peak(device)
        best = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            for c in range(calls):
                total, marks = _timed_call(pipe, kwargs(batch, c * batch), has_callback, sync)
                if len(marks) >= 2:
                    steps.extend(b - a for a, b in itertools.pairwise(marks))
                    overheads.append((total, len(marks)))
            best = max(best, calls * batch / (time.perf_counter() - start))
        step = statistics.median(steps) if steps else None
        overhead = (
            statistics.median(total - n * step for total, n in overheads) if step is not None else None
        )
        out[batch] = {
            "rate": best,
            "peak_gb": peak_gb(device),
            "step_ms": None if step is None else 1000 * step,
            "call_overhead_ms": None if overhead is None else 1000 * overhead,
        }
    return out


def _timed_call(
    pipe: Any, kw: dict[str, Any], has_callback: bool, sync: Callable[[], None]
) -> tuple[float, list[float]]:
    """One `pipe(**kw)`: (wall seconds, time.perf_counter() at each step's end, device synchronised)."""
    marks: list[float] = []
    if has_callback:

        def on_step_end(_pipe: Any, _i: int, _t: Any, _kw: dict[str, Any]) -> dict[str, Any]:
            sync()
            marks.append(time.perf_counter())
            return {}

        kw["callback_on_step_end"] = on_step_end
    sync()
    start = time.perf_counter()
    pipe(**kw)
    sync()
    return time.perf_counter() - start, marks
