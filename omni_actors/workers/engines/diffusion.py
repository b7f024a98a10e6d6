"""The DIFFUSION stage engine: any diffusers pipeline, compatible requests batched, one denoising step per `step()`.

The pipeline is loaded from a local diffusers folder by its model_index.json
`_class_name`. How it is called comes from its `__call__` signature, not from
its name: text-to-image pipelines take `prompt`, class-conditional ones
`class_labels`, unconditional ones `batch_size`.

Stepping. A batch runs `pipe(...)` in its own thread. At the end of every
denoising step (through `callback_on_step_end`, or a wrapper around
`scheduler.step` for pipelines without that callback) the thread reports
progress and blocks until the engine releases the next step, so each
`engine.step()` advances exactly one denoising step and the worker thread is
the only one that decides when work happens. After the last step the thread
runs on through the VAE decode without blocking. Abort between steps: the
blocked callback raises, the pipeline call unwinds, the thread ends.

Request params (from `inputs` or `params`; `inputs` win for the prompt):
    prompt, negative_prompt   text (text-to-image pipelines)
    class_label               int (class-conditional pipelines)
    n                         images for this request (num_images_per_prompt)
    width, height | size      ints, or "WxH"
    num_inference_steps, guidance_scale, seed

Batching: queued requests with the same size, steps, guidance (and whether
they carry a negative prompt) share a batch, up to `max_num_seqs` requests and
engine_extras `max_batch_images` images; others wait for a later batch.

Outputs per request: {"progress", "step", "total", "batch_size"} after each
step but the last; then, finished, {"images": uint8 [n, H, W, 3], "seed",
"batch_size", "progress": 1.0, "step", "total"}.
"""

from __future__ import annotations

import enum
import inspect
import math
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from omni_actors.errors import ConfigError
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine
from omni_actors.workers.engines.diffusion_batch import Batch, Runner
from omni_actors.workers.engines.diffusion_loading import load_pipeline

log = structlog.get_logger(__name__)

MAX_IMAGES_PER_REQUEST = 16
DEFAULT_MAX_BATCH_IMAGES = 16
"""Images one batch may hold (engine_extras `max_batch_images`); a bigger request runs alone."""
MAX_SIDE_PX = 4096
MAX_INFERENCE_STEPS = 1000
SIDE_MULTIPLE_PX = 8
SEED_BITS = 63

class CallStyle(enum.Enum):
    """How a pipeline is asked for images, read from its `__call__` signature."""

    PROMPT = "prompt"
    CLASS = "class_labels"
    UNCONDITIONAL = "batch_size"


@dataclass(frozen=True)
class DiffusionStatistics:
    """A snapshot of the engine's queue and batches."""

    queued: int
    running: int
    """Live requests in the batch being denoised."""
    batches_started: int
    last_batch_size: int
    """Requests in the most recently started batch."""


@dataclass(frozen=True)
class _Job:
    """One validated request."""

    request_id: str
    prompt: str | None
    negative_prompt: str | None
    class_label: int | None
    n: int
    width: int | None
    height: int | None
    steps: int
    guidance: float | None
    seed: int

    @property
    def batch_key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one batch."""
        return (
            self.width,
            self.height,
            self.steps,
            self.guidance,
            self.negative_prompt is not None,
        )


class DiffusionEngine(StageEngine):
    """Runs one diffusers pipeline; see the module docstring."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        import torch

        if ctx.device == "cpu":
            torch.set_num_threads(1)
        self.pipe = load_pipeline(ctx.model_path, ctx.device, ctx.dtype)
        sig = inspect.signature(type(self.pipe).__call__).parameters
        self.style = _call_style(type(self.pipe).__name__, sig)
        self._accepts = frozenset(sig)
        self._default_steps = _default(sig, "num_inference_steps", 50)
        self._default_guidance = _default(sig, "guidance_scale", None)
        self._max_batch = max(1, ctx.max_num_seqs)
        self._max_batch_images = _int(
            ctx.engine_extras.get("max_batch_images", DEFAULT_MAX_BATCH_IMAGES),
            "engine_extras.max_batch_images",
            1,
            1 << 16,
        )
        self._queue: deque[_Job] = deque()
        self._runner = Runner()
        self._batch: Batch | None = None
        self._batches_started = 0
        self._last_batch_size = 0

    # -- StageEngine --

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        if streaming:
            raise ValueError("the diffusion engine does not take streamed input")
        if self._knows(request_id):
            raise ValueError(f"request {request_id} is already running")
        self._queue.append(self._parse(request_id, inputs, self.merged_sampling(params)))

    def abort(self, request_id: str) -> None:
        self._queue = deque(j for j in self._queue if j.request_id != request_id)
        batch = self._batch
        if batch is not None and request_id in batch.live:
            batch.live.discard(request_id)
            if not batch.live:
                batch.cancel()
                self._batch = None

    def has_work(self) -> bool:
        return self._batch is not None or bool(self._queue)

    def step(self) -> list[EngineOutput]:
        if self._batch is None:
            if not self._queue:
                return []
            self._batch = self._start_batch()
        else:
            self._batch.release()
        batch = self._batch
        report = batch.wait_report()
        if report[0] == "progress":
            _, done, total = report
            payload = {
                "progress": done / total,
                "step": done,
                "total": total,
                "batch_size": len(batch.jobs),
            }
            return [
                EngineOutput(j.request_id, dict(payload))
                for j in batch.jobs
                if j.request_id in batch.live
            ]
        self._batch = None
        if report[0] != "timeout":
            batch.join()  # it has reported its end; let it finish freeing tensors first
        if report[0] in ("error", "timeout"):
            return [
                EngineOutput(j.request_id, {}, finished=True, error=report[1])
                for j in batch.jobs
                if j.request_id in batch.live
            ]
        return self._final_outputs(batch, report[1], report[2])

    def close(self) -> None:
        if self._batch is not None:
            self._batch.cancel()
            self._batch = None
        self._queue.clear()
        self._runner.close()

    def statistics(self) -> DiffusionStatistics:
        return DiffusionStatistics(
            queued=len(self._queue),
            running=len(self._batch.live) if self._batch is not None else 0,
            batches_started=self._batches_started,
            last_batch_size=self._last_batch_size,
        )

    # -- internals --

    def _knows(self, request_id: str) -> bool:
        if self._batch is not None and request_id in self._batch.live:
            return True
        return any(j.request_id == request_id for j in self._queue)

    def _parse(self, request_id: str, inputs: dict[str, Any], p: dict[str, Any]) -> _Job:
        prompt = inputs.get("prompt", p.get("prompt"))
        negative = inputs.get("negative_prompt", p.get("negative_prompt"))
        label = inputs.get("class_label", p.get("class_label"))
        if self.style is CallStyle.PROMPT:
            if not isinstance(prompt, str):
                raise ValueError("prompt: a string is required")
            if negative is not None and not isinstance(negative, str):
                raise ValueError("negative_prompt: expected a string")
            if negative is not None and "negative_prompt" not in self._accepts:
                raise ValueError(f"negative_prompt: {type(self.pipe).__name__} does not take one")
        else:
            prompt = negative = None
        if self.style is CallStyle.CLASS:
            label = _int(label if label is not None else 0, "class_label", 0, 1 << 31)
        else:
            label = None
        width, height = _size(p)
        guidance = p.get("guidance_scale")
        if guidance is not None:
            if "guidance_scale" not in self._accepts:
                raise ValueError(f"guidance_scale: {type(self.pipe).__name__} does not take one")
            if (
                isinstance(guidance, bool)
                or not isinstance(guidance, int | float)
                or not math.isfinite(guidance)
                or guidance < 0
            ):
                raise ValueError(f"guidance_scale: expected a number >= 0, got {guidance!r}")
            guidance = float(guidance)
        else:
            guidance = self._default_guidance
        seed = p.get("seed")
        return _Job(
            request_id=request_id,
            prompt=prompt,
            negative_prompt=negative,
            class_label=label,
            n=_int(p.get("n", 1), "n", 1, MAX_IMAGES_PER_REQUEST),
            width=width,
            height=height,
            steps=_int(
                p.get("num_inference_steps", self._default_steps),
                "num_inference_steps",
                1,
                MAX_INFERENCE_STEPS,
            ),
            guidance=guidance,
            seed=secrets.randbits(SEED_BITS)
            if seed is None
            else _int(seed, "seed", 0, (1 << SEED_BITS) - 1),
        )

    def _start_batch(self) -> Batch:
        head = self._queue.popleft()
        jobs, rest, images = [head], deque(), head.n
        while self._queue:
            job = self._queue.popleft()
            if (
                job.batch_key == head.batch_key
                and len(jobs) < self._max_batch
                and images + job.n <= self._max_batch_images
            ):
                jobs.append(job)
                images += job.n
            else:
                rest.append(job)
        self._queue = rest
        self._batches_started += 1
        self._last_batch_size = len(jobs)
        batch = Batch(
            self.pipe, jobs, self._call_kwargs(jobs), "callback_on_step_end" in self._accepts
        )
        self._runner.submit(batch)
        return batch

    def _call_kwargs(self, jobs: list[_Job]) -> dict[str, Any]:
        import torch

        head = jobs[0]
        generators = []
        for job in jobs:
            gen = torch.Generator("cpu").manual_seed(job.seed)
            generators += [gen] * job.n  # one stream per request: image j is its j-th draw
        kw: dict[str, Any] = {
            "num_inference_steps": head.steps,
            "generator": generators,
            "output_type": "np",
        }
        if self.style is CallStyle.PROMPT:
            kw["prompt"] = [j.prompt for j in jobs for _ in range(j.n)]
            if head.negative_prompt is not None:
                kw["negative_prompt"] = [j.negative_prompt for j in jobs for _ in range(j.n)]
            if "num_images_per_prompt" in self._accepts:
                kw["num_images_per_prompt"] = 1
        elif self.style is CallStyle.CLASS:
            kw["class_labels"] = [j.class_label for j in jobs for _ in range(j.n)]
        else:
            kw["batch_size"] = len(generators)
        if head.width is not None and {"width", "height"} <= self._accepts:
            kw["width"], kw["height"] = head.width, head.height
        if head.guidance is not None and "guidance_scale" in self._accepts:
            kw["guidance_scale"] = head.guidance
        return kw

    def _final_outputs(self, batch: Batch, images: np.ndarray, total: int) -> list[EngineOutput]:
        outs, row = [], 0
        for job in batch.jobs:
            mine, row = images[row : row + job.n], row + job.n
            if job.request_id not in batch.live:
                continue
            h, w = mine.shape[1:3]
            if job.width is not None and (w, h) != (job.width, job.height):
                error = (
                    f"{type(self.pipe).__name__} made {w}x{h} images; "
                    f"{job.width}x{job.height} was requested"
                )
                outs.append(EngineOutput(job.request_id, {}, finished=True, error=error))
                continue
            payload = {
                "images": np.ascontiguousarray(mine),
                "seed": job.seed,
                "batch_size": len(batch.jobs),
                "progress": 1.0,
                "step": total,
                "total": total,
            }
            outs.append(EngineOutput(job.request_id, payload, finished=True))
        return outs


def _call_style(class_name: str, sig: Any) -> CallStyle:
    for style in CallStyle:
        if style.value in sig:
            return style
    raise ConfigError(
        f"{class_name}: not an image pipeline this engine can call (no prompt, class_labels or batch_size)"
    )


def _default(sig: Any, name: str, fallback: Any) -> Any:
    param = sig.get(name)
    if param is None or param.default is inspect.Parameter.empty or param.default is None:
        return fallback
    return param.default


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _size(p: dict[str, Any]) -> tuple[int | None, int | None]:
    width, height = p.get("width"), p.get("height")
    size = p.get("size")
    if size is not None and (width is not None or height is not None):
        raise ValueError("give either size or width/height, not both")
    if size is not None:
        parts = size.lower().split("x") if isinstance(size, str) else []
        if len(parts) != 2 or not all(s.strip().isdigit() for s in parts):
            raise ValueError(f"size: expected 'WxH', got {size!r}")
        width, height = int(parts[0]), int(parts[1])
    if width is None and height is None:
        return None, None
    if width is None or height is None:
        raise ValueError("width and height go together")
    for name, v in (("width", width), ("height", height)):
        _int(v, name, SIDE_MULTIPLE_PX, MAX_SIDE_PX)
        if v % SIDE_MULTIPLE_PX:
            raise ValueError(f"{name}: must be a multiple of {SIDE_MULTIPLE_PX}, got {v}")
    return width, height
