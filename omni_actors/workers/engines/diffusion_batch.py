"""Running diffusers batches on one long-lived thread that reports after every denoising step.

The batch runs free: after each step it queues a progress report and goes on,
so the device never waits for the worker thread to come round (a lock-step
handoff per step cost served requests about 10% on CPU and kept the GPU idle
between steps). The engine's `step()` takes one report at a time, in order.
Aborting sets a flag that the step callback checks: the pipeline call raises
and unwinds between steps.

A batch that runs out of accelerator memory reports "oom" (its memory is handed back to
the device once it has unwound): requests that were batched together go back to the head of
the queue to run one at a time, and one that fails alone is refused as too large (a 400
naming `size`), while the worker serves on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from omni_actors.errors import ConfigError
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

log = structlog.get_logger(__name__)

STEP_REPORT_TIMEOUT_S = 3600.0
"""Longest the engine waits for one denoising step (or the decode) of a batch."""
BATCH_EXIT_TIMEOUT_S = 60.0
"""Longest `abort`/`close` waits for a cancelled batch thread to unwind."""
BATCH_GATHER_S = 0.010
"""How long a part-full queue waits for more requests before a batch starts, when the requests held
while the last batch ran were more than are queued now (its peers are coming back) and the queue
started soon after that batch ended (BUSY_AFTER_BATCH_S). Clients whose images just came back send
their next requests a few milliseconds apart; starting at once ran the first arrival alone and the
rest as the next batch (an H200, SD-1.5-sized at 512 px, concurrency 4: batches of 1 and 3
alternating, and two replicas at concurrency 8 gave 1.15x one). A lone client (the last batch ran
alone and nothing queued behind it) never waits: no one else is coming, and the window cost it
10 ms a request. The window runs from the later of the batch's end and the queue's start.
engine_extras `batch_gather_ms` overrides it (0: never wait)."""
BUSY_AFTER_BATCH_S = 0.5
"""A request queued longer than this after the last batch ended finds an idle engine: it starts at once."""


class _Cancelled(Exception):
    """Raised inside the pipeline call to stop a batch between steps."""


def _failure(err: Exception) -> tuple[str, str]:
    """A failed batch's report: ("oom", what it tried to allocate) for an accelerator allocation
    failure, else ("error", the exception)."""
    import torch

    text = str(err)
    said = "out of memory" in text or "can't allocate memory" in text  # (the CPU allocator's words)
    if isinstance(err, torch.OutOfMemoryError) or (isinstance(err, RuntimeError) and said):
        # torch's message goes on about the process's memory; the first two sentences say what failed.
        return "oom", ". ".join(text.split(". ")[:2]).strip().rstrip(".")
    return "error", f"{type(err).__name__}: {err}"


def _return_device_memory() -> None:
    """Hand the failed batch's cached blocks back to the device (other stages may share it)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Runner:
    """The one long-lived thread that runs every batch.

    A fresh thread per batch ran diffusers on CUDA at about half speed (per-thread
    library state rebuilt each time: 0.76 vs 1.55 images/s at batch 1 on an H200),
    so batches queue up for this thread instead.
    """

    def __init__(self) -> None:
        self._batches: queue.Queue[Batch | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="diffusion-runner", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self._batches.put(batch)

    def _loop(self) -> None:
        while (batch := self._batches.get()) is not None:
            batch.run()
            batch.ended.set()  # after run() returned: its tensors are freed

    def close(self) -> None:
        self._batches.put(None)
        self._thread.join(BATCH_EXIT_TIMEOUT_S)


class Batch:
    """One `pipe(...)` call on the runner thread, paused after every denoising step."""

    def __init__(
        self,
        pipe: Any,
        jobs: list[Any],
        kwargs: dict[str, Any],
        use_callback: bool,
        convert: Callable[[Any], Any],
        preview_at: frozenset[int] = frozenset(),
        report_decode: bool = False,
        prepare: Callable[[], tuple[dict[str, Any], Callable[[], None]]] | None = None,
    ) -> None:
        """`convert` turns the pipeline's result into the "done" report's payload (images: the
        converter dict of diffusion_outputs.py; video/audio: video.py's); with `report_decode`
        the last step reports ("decoding", total, total) before the thread runs on through the decode.
        `prepare` runs on the runner thread before the call: (more call kwargs, an undo run after
        the call), e.g. a video edit's encoded source and swapped scheduler (video_edit.py)."""
        self.pipe = pipe
        self._prepare = prepare
        self._convert = convert
        self._preview_at = preview_at
        """Steps after which the latents are decoded into preview images (diffusion_preview.py)."""
        self._report_decode = report_decode
        self.jobs = jobs
        self.live = {j.request_id for j in jobs}
        self._kwargs = kwargs
        self._use_callback = use_callback
        self._reports: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stop = threading.Event()
        self.ended = threading.Event()
        self._marks: dict[str, float] = {}
        """time.perf_counter() at "start", "denoised" (last step), "decoded" (the call returned), "converted"."""

    def release(self) -> None:
        """Kept for callers written for lock-step batches: a batch runs free, there is nothing to release."""

    def wait_report(self) -> tuple[Any, ...]:
        """("progress", done, total, preview | None) | ("decoding", done, total)
        | ("done", converted, total) | ("error" | "timeout" | "oom", message).

        `converted` is the converter's payload (see diffusion_outputs.py), rows in call order."""
        try:
            return self._reports.get(timeout=STEP_REPORT_TIMEOUT_S)
        except queue.Empty:
            self._stop.set()  # if it ever reaches a step end again, it stops there
            return ("timeout", f"a diffusion step took longer than {STEP_REPORT_TIMEOUT_S} s")

    def cancel(self) -> None:
        """Stop the thread at its next step end and wait for it to unwind."""
        self._stop.set()
        self.join()

    def join(self) -> None:
        """Wait until the runner is done with this batch (its tensors freed)."""
        self.ended.wait(BATCH_EXIT_TIMEOUT_S)

    def timings_ms(self) -> dict[str, float]:
        """Where the batch's time went, for the debug log: denoising, the decode and postprocess
        after the last step, the output conversion, and the handoff until now (the worker has it)."""
        t = self._marks
        names = (("denoise_ms", "start", "denoised"), ("decode_ms", "denoised", "decoded"),
                 ("convert_ms", "decoded", "converted"))
        out = {name: round(1000 * (t[b] - t[a]), 2) for name, a, b in names if a in t and b in t}
        if "converted" in t:
            out["handoff_ms"] = round(1000 * (time.perf_counter() - t["converted"]), 2)
        return out

    def _pause(self, done: int, total: int, latents: Any = None) -> None:
        if self._stop.is_set():
            raise _Cancelled
        if done >= total:
            self._marks["denoised"] = time.perf_counter()
            if self._report_decode:
                self._reports.put(("decoding", done, total))
            return  # after the last step, run on through the decode
        preview = None
        if latents is not None and done in self._preview_at:
            from omni_actors.workers.engines.diffusion_preview import preview as decode

            preview = decode(self.pipe, latents, self._kwargs)  # None where it cannot (logged once)
        self._reports.put(("progress", done, total, preview))
        if self._stop.is_set():
            raise _Cancelled

    def run(self) -> None:
        undo: Callable[[], None] | None = None
        if self._prepare is not None:
            try:
                extra, undo = self._prepare()
            except Exception as err:  # a thread boundary: the batch fails, the worker lives on
                log.warning("diffusion.batch_failed", error=repr(err), requests=len(self.jobs))
                failed = _failure(err)
            else:
                failed = None
            if failed is not None:
                if failed[0] == "oom":
                    _return_device_memory()
                self._reports.put(failed)
                return
            self._kwargs = {**self._kwargs, **extra}
        try:
            self._call()
        finally:
            if undo is not None:
                undo()

    def _call(self) -> None:
        pipe = self.pipe
        scheduler = pipe.scheduler
        kwargs = dict(self._kwargs)
        if self._use_callback:

            def on_step_end(_pipe: Any, i: int, _t: Any, kw: dict[str, Any]) -> dict[str, Any]:
                self._pause(i + 1, len(scheduler.timesteps), kw.get("latents"))
                return {}

            kwargs["callback_on_step_end"] = on_step_end
        else:
            # No step callback in this pipeline: pause after each scheduler step instead, with the
            # step's new latents (its first output) for previews.
            step_fn, calls = scheduler.step, [0]

            def step_and_pause(*args: Any, **kw: Any) -> Any:
                out = step_fn(*args, **kw)
                calls[0] += 1
                self._pause(calls[0], len(scheduler.timesteps), out[0] if isinstance(out, tuple) else
                            getattr(out, "prev_sample", None))
                return out

            scheduler.step = step_and_pause
        report: tuple[Any, ...] | None = None
        try:
            self._marks["start"] = time.perf_counter()
            result = pipe(**kwargs)
            self._marks["decoded"] = time.perf_counter()
            report = ("done", self._convert(result), len(scheduler.timesteps))
            self._marks["converted"] = time.perf_counter()
        except _Cancelled:
            pass
        except Exception as err:  # a thread boundary: the batch fails, the worker lives on
            log.warning("diffusion.batch_failed", error=repr(err), requests=len(self.jobs))
            report = _failure(err)
        finally:
            if not self._use_callback:
                del scheduler.step
        if report is not None and report[0] == "oom":
            _return_device_memory()  # the call's frames (and their tensors) are gone by now
        # Report last: once it is read, the next batch may hook the scheduler.
        if report is not None:
            self._reports.put(report)


class BatchedPipelineEngine(StageEngine):
    """What the diffusion and video engines share: a queue of parsed jobs, at most one running
    Batch on one Runner thread, abort from the queue or between steps, close.

    Subclasses set `KIND` (for messages), parse a request into a job with `.request_id`
    (`_parse`), and start (`_start_batch`) and step batches themselves."""

    KIND = "pipeline"
    UNITS = "outputs"
    """What a request may ask fewer of when it does not fit (a memory refusal says it)."""
    _max_batch = 1
    """Requests one batch may hold; subclasses set it from the deploy."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        from omni_actors.workers.engines.torch_setup import cap_device_memory

        cap_device_memory(ctx)
        self._queue: deque[Any] = deque()
        self._running: Batch | None = None
        self._ended_at: float | None = None
        """When the last batch ended (monotonic), for the gather window."""
        self._queued_at: float | None = None
        """When the queue last went from empty to not (monotonic)."""
        self._held = 0
        """Most requests held at once (running and queued) since the running batch started."""
        self._held_last = 0
        """`_held` of the last batch that ended: how many requests are likely to come back together."""
        gather_ms = ctx.engine_extras.get("batch_gather_ms", BATCH_GATHER_S * 1000)
        if isinstance(gather_ms, bool) or not isinstance(gather_ms, int | float) or not 0 <= gather_ms <= 1000:
            raise ConfigError(f"engine_extras.batch_gather_ms must be a number of ms in [0, 1000], got {gather_ms!r}")
        self._gather_s = gather_ms / 1000
        self._runner_thread: Runner | None = None
        self._alone: set[str] = set()
        """Requests that ran out of memory in a batch with others: each runs alone next."""

    @property
    def _batch(self) -> Batch | None:
        return self._running

    @_batch.setter
    def _batch(self, batch: Batch | None) -> None:
        if batch is None and self._running is not None:
            self._ended_at = time.monotonic()
            self._held_last = self._held
        elif batch is not None:
            self._held = len(batch.live) + len(self._queue)
        self._running = batch

    def gather_s(self, now: float) -> float:
        """Wait out the rest of the gather window while fewer requests are queued than were held
        while the last batch ran, and the queue started in a busy spell (soon after that batch ended).
        0 for a lone client: its next request comes alone and starts at once."""
        if self._running is not None or not self._queue or self._ended_at is None or self._queued_at is None:
            return 0.0
        if len(self._queue) >= min(self._max_batch, self._held_last):
            return 0.0  # as many as last time (or a full batch): waiting cannot make the batch bigger
        if self._queued_at - self._ended_at > BUSY_AFTER_BATCH_S:
            return 0.0
        return max(0.0, max(self._queued_at, self._ended_at) + self._gather_s - now)

    @property
    def _runner(self) -> Runner:
        """Started with the first batch (not before the pipeline has loaded)."""
        if self._runner_thread is None:
            self._runner_thread = Runner()
        return self._runner_thread

    def _parse(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _asked(self, job: Any) -> str:
        """What `job` asked for, as a refusal for memory names it ("1024x1024, 4 images")."""
        raise NotImplementedError

    def _next_head(self) -> tuple[Any, bool]:
        """(the next batch's first job, whether it must run alone)."""
        head = self._queue.popleft()
        alone = head.request_id in self._alone
        self._alone.discard(head.request_id)
        return head, alone

    def _may_join(self, job: Any) -> bool:
        """Whether `job` may join another's batch (not while it waits to run alone)."""
        return job.request_id not in self._alone

    def _batch_failed(self, batch: Batch, report: tuple[Any, ...]) -> list[EngineOutput]:
        """Outputs for a batch that ended in ("error" | "timeout" | "oom", message): its live requests
        fail, except that requests out of memory together go back to the head of the queue, to run
        one at a time; one out of memory alone is refused (a 400 naming `size`)."""
        live = [j for j in batch.jobs if j.request_id in batch.live]
        if report[0] != "oom":
            return [EngineOutput(j.request_id, {}, finished=True, error=report[1]) for j in live]
        if len(live) > 1:
            log.warning(f"{self.KIND}.batch_out_of_memory", requests=len(live), then="one at a time")
            self._alone.update(j.request_id for j in live)
            self._queue.extendleft(reversed(live))
            return []
        return [EngineOutput(
            j.request_id, {}, finished=True, rejected=True,
            error=f"size: {self._asked(j)} needs more accelerator memory than this server has free "
                  f"({report[1]}); ask for a smaller size or fewer {self.UNITS}",
        ) for j in live]  # fmt: skip

    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any],
            streaming: bool = False) -> None:
        if streaming:
            raise ValueError(f"the {self.KIND} engine does not take streamed input")
        if self._knows(request_id):
            raise ValueError(f"request {request_id} is already running")
        job = self._parse(request_id, inputs, self.merged_sampling(params))
        if not self._queue:
            self._queued_at = time.monotonic()
        self._queue.append(job)
        if self._running is not None:
            self._held = max(self._held, len(self._running.live) + len(self._queue))

    def abort(self, request_id: str) -> None:
        self._queue = deque(j for j in self._queue if j.request_id != request_id)
        self._alone.discard(request_id)
        batch = self._batch
        if batch is not None and request_id in batch.live:
            batch.live.discard(request_id)
            if not batch.live:
                batch.cancel()
                self._batch = None
                log.info(f"{self.KIND}.batch_aborted", request_id=request_id)

    def has_work(self) -> bool:
        return self._batch is not None or bool(self._queue)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.cancel()
            self._batch = None
        self._queue.clear()
        self._alone.clear()
        if self._runner_thread is not None:
            self._runner_thread.close()

    def _knows(self, request_id: str) -> bool:
        if self._batch is not None and request_id in self._batch.live:
            return True
        return any(j.request_id == request_id for j in self._queue)
