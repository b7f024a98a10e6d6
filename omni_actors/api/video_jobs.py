"""Running video jobs: submit to the orchestrator, record progress, encode the MP4, store the outcome.

One asyncio task per job follows the job's request stream: progress chunks move
the row's `progress` (denoising steps to DENOISE_PERCENT, the decode to
DECODED_PERCENT, then the MP4 encode to 100); the final chunk's frames (and audio
track) are encoded off the event loop into the data directory; any failure ends
the job `failed` with a reason, and the request is aborted in the engine however
the job ended (a no-op on an ended stream). `cancel` aborts the request in the engine
(between denoising steps) and ends the task: the job fails `cancelled`, the one code that says
its client gave it up; an abort the server made itself fails it with its reason, like any other request error.
The job's request stream is bounded by what the job declared it makes (`output_bytes`: its frames, an audio
track, a progress report a step) on top of `server.stream_buffer_mb`: the task reads every output as the event
loop hands it on, but the loop may hand on several at once, and the slow-reader bound, sized for clients that
stop reading, must not abort a job whose video is simply larger than it. Admission is the stage's own bounded
queue: past it, `create` is a 429 and no row is written. An extension (`extends`) is
generated from its source's last frame; its finished frames (and audio) are joined onto
the source's (the job's `source` file, media/stitch.py) before the encode, and the
source file goes when the job ends, however it ends. An edit (`edits`) keeps its source's
audio track (or its lack of one) in place of any the model made. At start-up, jobs a gone
server left unfinished are marked failed; at shutdown, this server's unfinished
jobs are.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.png import encode_png
from omni_actors.api.videos_store import VideoStore
from omni_actors.errors import RequestAborted, RequestError
from omni_actors.media.mp4 import Clip, read_mp4, write_mp4, write_spritesheet, write_thumbnail
from omni_actors.media.stitch import extend
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import VideoOutput
from omni_actors.orchestrator.requests import CHUNK_OVERHEAD_BYTES, RequestSpec, RequestStream
from omni_actors.workers.engines.video import MAX_INFERENCE_STEPS

log = logs.get(__name__)

JOB_TIMEOUT_S = 6 * 3600.0
"""Longest one video job may run (queue wait included) before it fails."""
DENOISE_PERCENT = 90
"""`progress` when the last denoising step is done; the decode and the MP4 encode share the rest."""
DECODED_PERCENT = 95
RANK = {"queued": 0, "in_progress": 1, "completed": 2, "failed": 2}
JOB_EXIT_TIMEOUT_S = 10.0
"""Longest shutdown waits for a cancelled job task to record its end."""
AUDIO_BYTES_PER_S = 96_000 * 2 * 4
"""The most a second of a job's audio track takes as it crosses (float32 stereo at 96 kHz: past any family's)."""
PROGRESS_CHUNK_BYTES = CHUNK_OVERHEAD_BYTES + 16
"""What one progress report holds in a request's stream (its overhead and its `phase` string)."""


def output_bytes(params: dict[str, Any], seconds: str) -> int:
    """The most a job's outputs hold, all unread at once: its frames (uint8 [F, H, W, 3]), an audio track as
    long as the job (and a second more), and a progress report a denoising step (and the decode's)."""
    count, width, height = (int(params.get(k) or 0) for k in ("num_frames", "width", "height"))
    frames = count * width * height * 3
    try:
        audio_s = max(float(seconds), 0.0) + 1.0
    except ValueError:
        audio_s = 1.0
    steps = int(params.get("num_inference_steps") or MAX_INFERENCE_STEPS)
    return frames + int(audio_s * AUDIO_BYTES_PER_S) + (steps + 2) * PROGRESS_CHUNK_BYTES + CHUNK_OVERHEAD_BYTES


@dataclass(frozen=True)
class Made:
    """What the engine made for one job."""

    frames: np.ndarray
    fps: float
    audio: np.ndarray | None
    sample_rate: int | None
    seed: int | None = None


@dataclass(frozen=True)
class Soundtrack:
    """An edit's source audio track, which the edit keeps (None: the source had none)."""

    audio: np.ndarray | None
    """float32 [C, S]"""
    sample_rate: int | None


class VideoJobs:
    """This server's running video jobs; their state lives in the VideoStore."""

    def __init__(self, orch: Orchestrator, store: VideoStore) -> None:
        self.orch = orch
        self.store = store
        self._running: dict[str, tuple[asyncio.Task[None], RequestStream]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._cancelled: set[str] = set()
        """Jobs `cancel` aborted (a delete, a sync call's client gone): their end is `cancelled`."""
        self._closing = False

    def recover(self) -> None:
        lost = self.store.fail_orphans()
        if lost:
            log.warning("video.jobs_lost", count=len(lost))

    def create(self, job_id: str, inputs: dict[str, Any], params: dict[str, Any], *, model: str,
               prompt: str, size: str, seconds: str, remixed_from: str | None = None,
               extends: str | None = None, edits: str | None = None, soundtrack: Soundtrack | None = None) -> None:
        """Queue a job (its row first, so the task always has one); AdmissionError when full. The
        row keeps what a remix needs: the params, the negative prompt, whether a first frame came.
        `extends` (the source job's id, or "upload"): the job's `source` file is in place, and the
        frames made are joined onto it. `edits` (likewise): the job re-makes that video (inputs["video"])
        and keeps its `soundtrack`, whatever audio the model made."""
        request = {"params": {k: v for k, v in params.items() if k != "seed"},
                   "negative_prompt": inputs.get("negative_prompt"), "reference": inputs.get("image") is not None}
        if extends is not None:
            request["extends"] = extends
        if edits is not None:  # (its source frames are not kept: nothing remixes an edit)
            request["edits"] = edits
        self.store.insert(job_id, model, prompt, size, seconds, request, remixed_from)
        spec = RequestSpec(inputs=inputs, params=params, request_id=job_id, deadline_s=JOB_TIMEOUT_S,
                           stages=self.orch.pipeline.stages_for_outputs({"video"}))
        try:
            stream = self.orch.submit(spec)
        except BaseException:  # refused (a full queue): no client has seen this id
            self.store.delete(job_id, listed=False)
            raise
        if stream.max_bytes is not None:  # (set before the loop can hand on any output: none came yet)
            stream.max_bytes += output_bytes(params, seconds)
        # Nothing remixes an extension (its first frame is its source's last) or an edit: theirs is not kept.
        reference = inputs.get("image") if extends is None and edits is None else None
        task = asyncio.create_task(self._run(job_id, stream, reference, extends is not None, soundtrack),
                                   name=f"video-{job_id}")
        self._running[job_id] = (task, stream)
        log.info("video.queued", job=job_id, size=size)

    async def wait(self, job_id: str) -> None:
        """Until the job's task has recorded its end (at once if it is not running here)."""
        entry = self._running.get(job_id)
        if entry is not None:
            await asyncio.shield(entry[0])

    async def wait_past(self, job_id: str, status: str, timeout_s: float, progress: int | None = None) -> None:
        """Until the job's status is past `status` (queued < in_progress < completed | failed), or its
        progress past `progress` when given, it is not running here, or `timeout_s` passed
        (long-polling for clients that would rather not poll)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while job_id in self._running:
            row = self.store.get(job_id)
            if row is None or RANK.get(row.status, 2) > RANK.get(status, 2):
                return
            if progress is not None and row.progress > progress:
                return
            changed = self._changed.setdefault(job_id, asyncio.Event())
            try:
                async with asyncio.timeout_at(deadline):
                    await changed.wait()
            except TimeoutError:
                return

    def _touch(self, job_id: str) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()

    def cancel(self, job_id: str) -> bool:
        """Abort a running job (between denoising steps); False if it is not running here."""
        entry = self._running.get(job_id)
        if entry is None:
            return False
        self._cancelled.add(job_id)
        entry[1].abort()
        return True

    async def close(self) -> None:
        """Shutdown: abort this server's jobs and record them failed."""
        self._closing = True
        entries = list(self._running.values())
        for _, stream in entries:
            stream.abort()
        if entries:
            await asyncio.wait([t for t, _ in entries], timeout=JOB_EXIT_TIMEOUT_S)

    async def _run(self, job_id: str, stream: RequestStream, reference: np.ndarray | None,
                   extending: bool = False, soundtrack: Soundtrack | None = None) -> None:
        try:
            if reference is not None:  # kept for a remix, written while the job waits or denoises
                await off_loop(self._keep_reference, job_id, reference)
            made = await self._follow(job_id, stream)
            self.store.progress(job_id, DECODED_PERCENT)
            if soundtrack is not None:  # an edit's: its source's track, not what the model made
                made = Made(made.frames, made.fps, soundtrack.audio, soundtrack.sample_rate, made.seed)
            if extending:
                made = await off_loop(self._stitch, job_id, made)
            await off_loop(self._write, job_id, made)
            if self.store.complete(job_id, made.audio is not None, made.seed):
                log.info("video.completed", job=job_id, frames=len(made.frames))
            else:  # deleted while it was being encoded
                self.store.delete(job_id)
        except RequestAborted as err:
            if job_id in self._cancelled:
                self.store.fail(job_id, "cancelled", "the job was cancelled")
            elif self._closing or self.orch.draining:
                self.store.fail(job_id, "server_stopped", "the server stopped while this video was being made")
            else:  # the server's own abort (its output left unread past the stream's bound): not a delete
                log.warning("video.job_aborted", job=job_id, error=str(err))
                self.store.fail(job_id, type(err).__name__, str(err))
        except RequestError as err:
            self.store.fail(job_id, type(err).__name__, str(err))
        except asyncio.CancelledError:
            self.store.fail(job_id, "server_stopped", "the server stopped while this video was being generated")
            raise
        except OSError as err:  # the data directory refused a write (full, unwritable): no bug to trace
            log.error("video.job_storage_failed", job=job_id, error_type=type(err).__name__, error=str(err))
            why = err.strerror or type(err).__name__  # (not the path: the client has no business with it)
            self.store.fail(job_id, "storage_error", f"the server could not store this video ({why})")
        except Exception as err:  # the job's boundary: it fails with a reason, the server lives on
            log.exception("video.job_failed", job=job_id, error_type=type(err).__name__)
            self.store.fail(job_id, "internal_error", f"{type(err).__name__}: {err}")
        finally:
            # However the job ended (a failed reference write, a store error, an encode that raised),
            # the engine stops making it: a no-op on a stream that already ended.
            stream.abort()
            self._running.pop(job_id, None)
            self._cancelled.discard(job_id)
            self._touch(job_id)
            try:
                self._drop_leftovers(job_id, reference is not None)
            except OSError as err:  # the files folder itself is unusable: the job's row already says so
                log.warning("video.cleanup_failed", job=job_id, error_type=type(err).__name__)

    def _drop_leftovers(self, job_id: str, referenced: bool) -> None:
        """A finished job's temporary files, its source copy, and its first frame unless it completed."""
        for variant in ("video", "thumbnail", "spritesheet", "reference"):
            _tmp(self.store.path(job_id, variant)).unlink(missing_ok=True)
        self.store.path(job_id, "source").unlink(missing_ok=True)  # the MP4 now holds its frames
        if referenced:  # a first frame is kept for a remix, which needs a finished job
            row = self.store.get(job_id)
            if row is None or row.status != "completed":
                self.store.path(job_id, "reference").unlink(missing_ok=True)

    async def _follow(self, job_id: str, stream: RequestStream) -> Made:
        made: Made | None = None
        async for chunk in stream:
            out = chunk.output
            if not isinstance(out, VideoOutput):
                continue
            if out.frames is not None:
                made = Made(out.frames, out.fps or 16.0, out.audio, out.sample_rate, out.seed)
            elif out.progress is not None and out.progress.total:
                share = DENOISE_PERCENT * out.progress.fraction
                self.store.progress(job_id, int(share) if out.progress.phase != "decode" else DENOISE_PERCENT)
                self._touch(job_id)
        if made is None:
            raise RuntimeError("the pipeline ended without frames")
        return made

    def _stitch(self, job_id: str, made: Made) -> Made:
        source = read_mp4(self.store.path(job_id, "source"), made.sample_rate)
        joined = extend(source, Clip(made.frames, made.fps, made.audio, made.sample_rate))
        return Made(joined.frames, joined.fps, joined.audio, joined.sample_rate, made.seed)

    def _keep_reference(self, job_id: str, frame: np.ndarray) -> None:
        path = self.store.path(job_id, "reference")
        _tmp(path).write_bytes(encode_png(np.ascontiguousarray(frame, dtype=np.uint8)))
        os.replace(_tmp(path), path)

    def _write(self, job_id: str, made: Made) -> None:
        video, thumb = self.store.path(job_id, "video"), self.store.path(job_id, "thumbnail")
        write_mp4(_tmp(video), made.frames, made.fps, made.audio, made.sample_rate)
        write_thumbnail(_tmp(thumb), made.frames[0])
        sprites = self.store.path(job_id, "spritesheet")
        write_spritesheet(_tmp(sprites), made.frames)
        os.replace(_tmp(thumb), thumb)
        os.replace(_tmp(sprites), sprites)
        os.replace(_tmp(video), video)


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".part")

