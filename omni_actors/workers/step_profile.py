"""Opt-in torch profile of a worker's engine steps, for finding where a step's time goes.

Off unless the environment asks (nothing is imported or wrapped otherwise):

    OMNI_PROFILE_DIR=/tmp/prof          where each profiled worker writes its report
    OMNI_PROFILE_STEPS=50:100           skip the first 50 steps (warm-up, graph capture), profile 100
    OMNI_PROFILE_STAGES=talker,codec    only these stages (model_stage names; default: all)

After the profiled steps, the worker writes `<stage>-<replica>.txt` (torch's operator
table, sorted by self device time on a GPU, else self CPU time) and
`<stage>-<replica>.json` (one line: steps, wall ms a step, device kernel ms a step, and
their ratio: near 1 the step is bound by its kernels, far below 1 by the host that
launches them). Kernels launched from CUDA graphs are counted. The report is written
once; the worker then steps unprofiled.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from omni_actors import logs

log = logs.get(__name__)

ENV_DIR, ENV_STEPS, ENV_STAGES = "OMNI_PROFILE_DIR", "OMNI_PROFILE_STEPS", "OMNI_PROFILE_STAGES"
DEFAULT_STEPS = (50, 100)
"""(steps skipped, steps profiled) when OMNI_PROFILE_STEPS is not set."""
TABLE_ROWS = 40


def from_env(stage: str, replica: int, environ: dict[str, str] | None = None) -> StepProfiler | None:
    """A profiler for this worker when the environment asks for one (see the module docstring)."""
    env = os.environ if environ is None else environ
    folder = env.get(ENV_DIR)
    if not folder:
        return None
    stages = [s for s in env.get(ENV_STAGES, "").split(",") if s.strip()]
    if stages and stage not in {s.strip() for s in stages}:
        return None
    skip, count = DEFAULT_STEPS
    if env.get(ENV_STEPS):
        try:
            a, b = env[ENV_STEPS].split(":")
            skip, count = int(a), int(b)
        except ValueError as err:
            raise ValueError(f"{ENV_STEPS}={env[ENV_STEPS]!r}: expected 'skip:count', e.g. '50:100'") from err
    if skip < 0 or count < 1:
        raise ValueError(f"{ENV_STEPS}: skip must be >= 0 and count >= 1")
    return StepProfiler(Path(folder), f"{stage}-{replica}", skip, count)


class StepProfiler:
    """Counts steps; profiles steps [skip, skip + count) and writes the report after them."""

    def __init__(self, folder: Path, name: str, skip: int, count: int) -> None:
        self.folder, self.name, self.skip, self.count = folder, name, skip, count
        self.seen = 0
        self.wall_s = 0.0
        self._prof: Any = None
        self.done = False

    def step(self) -> AbstractContextManager[Any]:
        """Wrap one engine step in this."""
        if self.done:
            return nullcontext()
        return _Step(self)

    def _begin(self) -> None:
        if self.seen == self.skip and self._prof is None:
            import torch

            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=acts)
            self._prof.__enter__()

    def _end(self, elapsed: float) -> None:
        if self._prof is not None:
            self.wall_s += elapsed
        self.seen += 1
        if self._prof is not None and self.seen >= self.skip + self.count:
            self._write()

    def _write(self) -> None:
        prof, self._prof, self.done = self._prof, None, True
        prof.__exit__(None, None, None)
        events = prof.key_averages()
        on_gpu = any(getattr(e, "self_device_time_total", 0) for e in events)
        key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        device_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
        steps = self.count
        summary = {
            "profile": self.name, "steps": steps, "wall_ms_per_step": round(self.wall_s * 1000 / steps, 3),
            "device_ms_per_step": round(device_us / 1000 / steps, 3),
            "device_busy": round(device_us / 1e6 / self.wall_s, 3) if self.wall_s and on_gpu else None,
        }  # fmt: skip
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{self.name}.json").write_text(json.dumps(summary) + "\n")
        (self.folder / f"{self.name}.txt").write_text(events.table(sort_by=key, row_limit=TABLE_ROWS) + "\n")
        log.info("worker.profile_written", **summary)


class _Step:
    def __init__(self, owner: StepProfiler) -> None:
        self.owner = owner
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.owner._begin()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.owner._prof is not None:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # the step's kernels belong to it
        self.owner._end(time.perf_counter() - self.t0)
