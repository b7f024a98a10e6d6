"""The DIFFUSION stage engine: any diffusers pipeline, compatible requests batched, one denoising step per `step()`.

The pipeline is loaded from a local diffusers folder by its model_index.json
`_class_name`. What it can do and how it is called come from its `__call__`
signature (models/diffusion/capabilities.py), not from its name: text-to-image
pipelines take `prompt`, class-conditional ones `class_labels`, unconditional
ones `batch_size`; edit pipelines take `image` (and `mask_image`).

Stepping. A batch runs `pipe(...)` on the runner thread (diffusion_batch.py),
free: at the end of every denoising step it queues a progress report and goes
on; each `engine.step()` takes the next report, so the worker sees every step
in order. After the last step the thread runs on through the VAE decode and the
output conversion. Abort between steps: the step callback sees the stop flag
and raises, the pipeline call unwinds.

Requests: see diffusion_request.py for the fields. Batching: queued requests
with equal `batch_key` (size, steps, guidance, negative prompt or not, layers,
kind extras; never one with input images) share a batch, up to `max_num_seqs`
requests and engine_extras `max_batch_images` outputs.

Outputs per request: {"progress", "step", "total", "phase", "batch_size"} after each
step, "phase" "denoise", with {"preview": uint8 [n, H, W, 3]} at the steps a request
with `partial_images` gets one (diffusion_preview.py); the last step's is "phase" "decode"
(it goes as the VAE decode starts: the video engine's protocol; before 2026-12-04 the last
step had none, so `stream_progress` skipped it, and a 1-step request sent no progress at all);
then, finished, the output kind's arrays (diffusion_outputs.py;
for images {"images": uint8 [n, H, W, 3]}, a layered pipeline's n x layers RGBA
images flattened in order) with {"seed", "batch_size", "progress": 1.0, "step", "total"}.
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import structlog

from omni_actors.models.diffusion.capabilities import caps_from_params
from omni_actors.workers.engine import (
    TORCH_PRELOAD,
    EngineContext,
    EngineOutput,
    direct_load,
    timed,
)
from omni_actors.workers.engines.diffusion_batch import Batch, BatchedPipelineEngine
from omni_actors.workers.engines.diffusion_loading import load_pipeline
from omni_actors.workers.engines.diffusion_outputs import converter
from omni_actors.workers.engines.diffusion_request import DiffusionJob, int_in, parse_job

log = structlog.get_logger(__name__)

DEFAULT_MAX_BATCH_IMAGES = 16
"""Images one batch may hold (engine_extras `max_batch_images`); a bigger request runs alone."""


@dataclass(frozen=True)
class DiffusionStatistics:
    """A snapshot of the engine's queue and batches."""

    queued: int
    running: int
    """Live requests in the batch being denoised."""
    batches_started: int
    last_batch_size: int
    """Requests in the most recently started batch."""


class DiffusionEngine(BatchedPipelineEngine):
    """Runs one diffusers pipeline; see the module docstring."""

    ZYGOTE_PRELOAD = (*TORCH_PRELOAD, "diffusers.pipelines.pipeline_utils")

    KIND = "diffusion"
    UNITS = "images (n)"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        import torch

        if ctx.device == "cpu":
            torch.set_num_threads(1)
        with timed(ctx, "weights"):
            self.pipe = load_pipeline(ctx.model_path, ctx.device, ctx.dtype, direct_load(ctx))
        sig = inspect.signature(type(self.pipe).__call__).parameters
        self.caps = caps_from_params(type(self.pipe).__name__, list(sig)[1:])
        self._convert = converter(self.caps.output_kind)
        self._accepts = frozenset(sig)
        self._defaults = {
            "num_inference_steps": _default(sig, "num_inference_steps", 50),
            "guidance_scale": _default(sig, self.caps.guidance_param, None),
            "strength": _default(sig, "strength", None),
        }
        self._max_batch = max(1, ctx.max_num_seqs)
        self._max_batch_images = int_in(
            ctx.engine_extras.get("max_batch_images", DEFAULT_MAX_BATCH_IMAGES),
            "engine_extras.max_batch_images",
            1,
            1 << 16,
        )
        self._batches_started = 0
        self._last_batch_size = 0

    # -- StageEngine --

    def step(self) -> list[EngineOutput]:
        if self._batch is None:
            if not self._queue:
                return []
            self._batch = self._start_batch()
        batch = self._batch
        report = batch.wait_report()
        if report[0] in ("progress", "decoding"):  # a step done; "decoding": the last, the decode starts
            done, total = report[1], report[2]
            preview = report[3] if report[0] == "progress" else None
            payload = {
                "progress": done / total,
                "step": done,
                "total": total,
                "phase": "denoise" if report[0] == "progress" else "decode",
                "batch_size": len(batch.jobs),
            }
            outs, row = [], 0
            for j in batch.jobs:
                mine = dict(payload)
                if preview is not None and j.previews and done in _preview_steps(j):
                    mine["preview"] = np.ascontiguousarray(preview[row : row + j.n])
                row += j.n
                if j.request_id in batch.live:
                    outs.append(EngineOutput(j.request_id, mine))
            return outs
        self._batch = None
        if report[0] != "timeout":
            batch.join()  # it has reported its end; let it finish freeing tensors first
        if report[0] in ("error", "timeout", "oom"):
            return self._batch_failed(batch, report)
        outs = self._final_outputs(batch, report[1], report[2])
        log.debug("diffusion.batch_done", size=len(batch.jobs), **batch.timings_ms())
        return outs

    def statistics(self) -> DiffusionStatistics:
        return DiffusionStatistics(
            queued=len(self._queue),
            running=len(self._batch.live) if self._batch is not None else 0,
            batches_started=self._batches_started,
            last_batch_size=self._last_batch_size,
        )

    # -- internals --

    def _parse(self, request_id: str, inputs: dict[str, Any], p: dict[str, Any]) -> DiffusionJob:
        job = parse_job(request_id, inputs, p, self.caps, self._accepts, self._defaults)
        strength = job.strength if job.strength is not None else self._defaults["strength"]
        if job.images and strength is not None and _strength_steps(type(self.pipe), job.steps, strength) == 0:
            raise ValueError(
                f"strength: {strength:g} of {job.steps} num_inference_steps leaves no step to run in "
                f"{type(self.pipe).__name__}; raise strength or num_inference_steps"
            )
        return job

    def _asked(self, job: DiffusionJob) -> str:
        size = f"{job.width}x{job.height}" if job.width and job.height else "the default size"
        return f"{size} with {job.n} image{'s' if job.n != 1 else ''}"

    def _start_batch(self) -> Batch:
        head, alone = self._next_head()
        jobs, rest, images = [head], deque(), head.n
        while self._queue:
            job = self._queue.popleft()
            if (
                not alone
                and self._may_join(job)
                and not self.caps.one_prompt
                and job.batch_key == head.batch_key
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
        log.debug("diffusion.batch_started", size=len(jobs), queued=len(rest))
        batch = Batch(
            self.pipe,
            jobs,
            self._call_kwargs(jobs),
            "callback_on_step_end" in self._accepts,
            self._convert,
            frozenset(s for j in jobs for s in _preview_steps(j)),
            report_decode=True,
        )
        self._runner.submit(batch)
        return batch

    def _call_kwargs(self, jobs: list[DiffusionJob]) -> dict[str, Any]:
        import torch

        head = jobs[0]
        generators = []
        for job in jobs:
            gen = torch.Generator("cpu").manual_seed(job.seed)
            generators += [gen] * job.n  # one stream per request: output j is its j-th draw
        kw: dict[str, Any] = {
            "num_inference_steps": head.steps,
            "generator": generators,
            "output_type": "pt" if not self.caps.layered else "pil",  # "pt": to uint8 on the device
            **head.extras,
        }
        accepts = self._accepts
        if "prompt" in accepts:
            kw["prompt"] = [j.prompt for j in jobs for _ in range(j.n)]
            if head.negative_prompt is not None:
                kw["negative_prompt"] = [j.negative_prompt for j in jobs for _ in range(j.n)]
            if "num_images_per_prompt" in accepts:
                kw["num_images_per_prompt"] = 1
        elif "class_labels" in accepts:
            kw["class_labels"] = [j.class_label for j in jobs for _ in range(j.n)]
        else:
            kw["batch_size"] = len(generators)
        if head.images or self.caps.one_prompt:  # such a job runs alone (see batch_key, _start_batch)
            kw["prompt"] = head.prompt  # one prompt; the pipeline repeats it num_images_per_prompt times
            kw["num_images_per_prompt"] = head.n
            kw["generator"] = generators[0]
            if head.negative_prompt is not None:
                kw["negative_prompt"] = head.negative_prompt
        if head.images:
            pil = [_pil(im).convert(self.caps.image_mode) for im in head.images]
            kw["image"] = pil if self.caps.max_input_images > 1 or self.caps.image_list else pil[0]
            if head.mask is not None:
                kw["mask_image"] = _pil(head.mask)
        if head.width is not None and {"width", "height"} <= accepts:
            kw["width"], kw["height"] = head.width, head.height
        if head.guidance is not None and self.caps.guidance_param in accepts:
            kw[self.caps.guidance_param] = head.guidance
        if head.layers is not None:
            kw["layers"] = head.layers
        if head.strength is not None:
            kw["strength"] = head.strength
        return kw

    def _final_outputs(
        self, batch: Batch, arrays: dict[str, np.ndarray], total: int
    ) -> list[EngineOutput]:
        outs, row = [], 0
        for job in batch.jobs:
            mine = {k: a[row : row + job.n] for k, a in arrays.items()}
            row += job.n
            if job.request_id not in batch.live:
                continue
            images = mine.get("images")
            if images is not None and images.ndim == 5:  # layered: n stacks of layers, one image each
                images = mine["images"] = images.reshape(-1, *images.shape[2:])
            h, w = images.shape[1:3] if images is not None else (None, None)
            if images is not None and job.width is not None and (w, h) != (job.width, job.height):
                error = (
                    f"{type(self.pipe).__name__} made {w}x{h} images; "
                    f"{job.width}x{job.height} was requested"
                )
                outs.append(EngineOutput(job.request_id, {}, finished=True, error=error))
                continue
            payload = {
                **{k: np.ascontiguousarray(a) for k, a in mine.items()},
                "seed": job.seed,
                "batch_size": len(batch.jobs),
                "progress": 1.0,
                "step": total,
                "total": total,
            }
            outs.append(EngineOutput(job.request_id, payload, finished=True))
        return outs


def _default(sig: Any, name: str, fallback: Any) -> Any:
    param = sig.get(name)
    if param is None or param.default is inspect.Parameter.empty or param.default is None:
        return fallback
    return param.default


def _strength_steps(cls: type, steps: int, strength: float) -> int | None:
    """The denoising steps `cls` runs at `strength` out of `steps`, by its own `get_timesteps` (pipelines
    round differently: Stable Diffusion's keeps int(steps x strength) and fails a request left with none,
    Qwen-Image's and FLUX.2 Klein's keep one for all but a vanishing strength); None for a pipeline without one
    (or whose method wants more than this stand-in). The method only
    slices its scheduler's timesteps, so it runs here on a stand-in scheduler holding `steps` of them."""
    get_timesteps = getattr(cls, "get_timesteps", None)
    if get_timesteps is None:
        return None
    stand_in = SimpleNamespace(scheduler=SimpleNamespace(timesteps=list(range(steps)), order=1))
    try:
        return int(get_timesteps(stand_in, steps, strength, "cpu")[1])
    except (AttributeError, TypeError, IndexError):  # a get_timesteps that wants more than the stand-in has
        return None  # not known here: the pipeline's call is left to judge


def _preview_steps(job: DiffusionJob) -> set[int]:
    """The steps after which `job` gets a preview: its `previews` spread evenly before the last step."""
    k, total = job.previews, job.steps
    return {round((i + 1) * total / (k + 1)) for i in range(k)} & set(range(1, total))


def _pil(arr: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(arr[..., 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
