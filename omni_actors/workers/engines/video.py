"""The video and audio generation stage engine: diffusers text/image-to-video and text-to-audio pipelines.

Same stepping as the image engine (`diffusion_batch`): a batch runs `pipe(...)` on
the runner thread, paused after every denoising step, so each `step()` advances
one step and abort lands between steps; after the last step the batch reports
"decoding" and runs on through the VAE decode.

What the pipeline makes is read from its `__call__` signature: `num_frames` ->
video (frames, plus an audio track when the result carries one, as LTX-2's does),
`audio_end_in_s` -> audio; an `image` parameter -> it takes a first frame.

Request (inputs win for prompt/negative_prompt/image):
    inputs  prompt, negative_prompt, image (uint8 [H, W, 3]; crosses the bus in shared memory),
            video (an edit's source, uint8 [F, H, W, 3]: the pipeline re-makes it, video_edit.py;
            on a pipeline that takes a first frame, the source's, or `image` in its place)
    params  width, height | size "WxH", num_frames (video), seconds (audio),
            num_inference_steps, guidance_scale, seed, strength (an edit's, default 0.7)

engine_extras (family defaults from the pipeline registration, deploy overrides):
    fps             frames per second of the made video (default 16)
    size_multiple   width and height must be multiples of it (default 16)
    frame_multiple  num_frames must be k * frame_multiple + 1 (default 4; 1 = any)
    max_frames      largest num_frames (default 257)
    max_seconds     longest audio clip (default 47.0; never past the model's own window,
                    transformer sample_size x VAE hop / rate, which every call fills whatever its length)
    audio_rate_hz   sample rate of the audio (default: the pipeline's vae/vocoder config)
    max_batch       requests per pipeline call (default max_num_seqs; 1 for pipelines that cannot batch)
    image_batches   "module:function" that readies the pipeline for several first frames a call and
                    returns how to make its `image` for them (or None where it cannot); without it
                    a request with a first frame runs alone (image-to-video pipelines take one image)

Outputs: {"progress", "step", "total", "phase": "denoise"|"decode"} while running; then, finished,
video {"frames": uint8 [F, H, W, 3], "fps", "seed", ["audio": float32 [C, S], "sample_rate"]}
or audio {"audio": float32 [C, S], "sample_rate", "seed"}.
"""

from __future__ import annotations

import functools
import inspect
import math
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.config.pipeline import resolve
from omni_actors.errors import ConfigError
from omni_actors.workers.engine import (
    TORCH_PRELOAD,
    EngineContext,
    EngineOutput,
    direct_load,
    timed,
)
from omni_actors.workers.engines import video_edit
from omni_actors.workers.engines.diffusion_batch import Batch, BatchedPipelineEngine
from omni_actors.workers.engines.diffusion_loading import load_pipeline
from omni_actors.workers.engines.diffusion_outputs import rounded_uint8

log = logs.get(__name__)

MAX_SIDE_PX = 4096
MAX_INFERENCE_STEPS = 1000
SEED_BITS = 63
CONVERT_BLOCK_VALUES = 1 << 18
"""Float frame values converted to uint8 per block, in whole rows (1 MiB of float32: stays in a core's cache)."""
DEFAULT_SECONDS = 10.0
"""A clip's length when a request names none (or the model's window, if shorter)."""
DEFAULTS: dict[str, Any] = {
    "fps": 16,
    "size_multiple": 16,
    "frame_multiple": 4,
    "max_frames": 257,
    "max_seconds": 47.0,
}


@dataclass(frozen=True)
class _Job:
    request_id: str
    prompt: str
    negative_prompt: str | None
    image: np.ndarray | None
    width: int | None
    height: int | None
    num_frames: int | None
    seconds: float | None
    steps: int
    guidance: float | None
    seed: int
    video: np.ndarray | None = None
    """An edit's source frames, uint8 [F, H, W, 3] (video_edit.py)."""
    strength: float = 1.0

    @property
    def batch_key(self) -> tuple[Any, ...]:
        # An edit runs alone: its latents and schedule are its own. (A first frame: the engine's `_key`.)
        alone = self.request_id if self.video is not None else None
        return (self.width, self.height, self.num_frames, self.seconds, self.steps, self.guidance,
                self.negative_prompt is not None, self.image is not None, alone)


class VideoEngine(BatchedPipelineEngine):
    """Runs one video or audio diffusers pipeline; see the module docstring."""

    ZYGOTE_PRELOAD = (*TORCH_PRELOAD, "diffusers.pipelines.pipeline_utils")

    KIND = "video"
    UNITS = "frames (seconds)"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        import torch

        if ctx.device == "cpu":
            torch.set_num_threads(1)
        with timed(ctx, "weights"):
            self.pipe = load_pipeline(ctx.model_path, ctx.device, ctx.dtype, direct_load(ctx))
        name = type(self.pipe).__name__
        sig = inspect.signature(type(self.pipe).__call__).parameters
        self._accepts = frozenset(sig)
        self.makes_video = "num_frames" in sig
        self.makes_audio = "audio_end_in_s" in sig
        self._frames_on_device = ctx.device != "cpu"
        if not (self.makes_video or self.makes_audio) or "prompt" not in sig:
            raise ConfigError(f"{name}: not a text-to-video or text-to-audio pipeline (no prompt, "
                              "num_frames or audio_end_in_s in its __call__)")
        self.edits = video_edit.can_edit(self.pipe)
        image = sig.get("image")
        self.takes_image = image is not None
        self.needs_image = image is not None and image.default is inspect.Parameter.empty
        extras = {**DEFAULTS, **ctx.engine_extras}
        self.fps = _number(extras["fps"], "engine_extras.fps", 1, 240)
        self._size_multiple = _int(extras["size_multiple"], "engine_extras.size_multiple", 1, 256)
        self._frame_multiple = _int(extras["frame_multiple"], "engine_extras.frame_multiple", 1, 64)
        self._max_frames = _int(extras["max_frames"], "engine_extras.max_frames", 1, 100_000)
        self._max_seconds = min(_number(extras["max_seconds"], "engine_extras.max_seconds", 0.1, 3600),
                                _audio_window_s(self.pipe))
        self._audio_rate = extras.get("audio_rate_hz") or _audio_rate(self.pipe)
        self._default_steps = _default(sig, "num_inference_steps", 50)
        self._default_guidance = _default(sig, "guidance_scale", None)
        self._max_batch = _int(extras.get("max_batch", max(1, ctx.max_num_seqs)), "engine_extras.max_batch",
                               1, 1024)
        self.batches_started = 0
        hook = extras.get("image_batches")
        self._first_frames = resolve(hook)(self.pipe) if hook and self.takes_image else None
        """How to make `image` for a batch of first frames; None: each request with one runs alone."""

    # -- StageEngine --

    def step(self) -> list[EngineOutput]:
        if self._batch is None:
            if not self._queue:
                return []
            self._batch = self._start_batch()
        else:
            self._batch.release()
        batch = self._batch
        report = batch.wait_report()
        if report[0] in ("progress", "decoding"):
            done, total = report[1], report[2]
            payload = {"progress": done / total, "step": done, "total": total,
                       "phase": "denoise" if report[0] == "progress" else "decode"}
            return [EngineOutput(j.request_id, dict(payload)) for j in batch.jobs if j.request_id in batch.live]
        self._batch = None
        if report[0] != "timeout":
            batch.join()
        if report[0] in ("error", "timeout", "oom"):
            return self._batch_failed(batch, report)
        return self._final_outputs(batch, report[1], report[2])

    # -- internals --

    def _parse(self, request_id: str, inputs: dict[str, Any], p: dict[str, Any]) -> _Job:
        prompt = inputs.get("prompt", p.get("prompt"))
        if not isinstance(prompt, str):
            raise ValueError("prompt: a string is required")
        negative = inputs.get("negative_prompt", p.get("negative_prompt"))
        if negative is not None and (not isinstance(negative, str) or "negative_prompt" not in self._accepts):
            raise ValueError("negative_prompt: expected a string the pipeline takes")
        image = inputs.get("image")
        if image is not None:
            if not self.takes_image:
                raise ValueError(f"image: {type(self.pipe).__name__} makes video from text only")
            image = np.asarray(image)
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise ValueError(f"image: expected uint8 [H, W, 3], got {image.dtype} {image.shape}")
        width, height = self._size(p)
        video, strength = self._edit_source(inputs.get("video"), p)
        if video is not None and self.takes_image:  # an edit is conditioned on its source's first frame
            video, image = video_edit.first_frame(video, image)
        elif image is None and self.needs_image:
            raise ValueError(f"image: {type(self.pipe).__name__} needs a first frame (input_reference)")
        num_frames = seconds = None
        if video is not None:
            num_frames = self._frames(video.shape[0])
            if (width, height) not in ((None, None), (video.shape[2], video.shape[1])):
                raise ValueError(f"size: {width}x{height} is not the source video's "
                                 f"{video.shape[2]}x{video.shape[1]}")
            width, height = self._size({"width": video.shape[2], "height": video.shape[1]})
        elif self.makes_video:
            num_frames = self._frames(p.get("num_frames"))
        else:
            seconds = _number(p.get("seconds", min(DEFAULT_SECONDS, self._max_seconds)), "seconds", 0.1,
                              self._max_seconds)
        if "guidance_scale" in p and "guidance_scale" not in self._accepts:  # (dropped unsaid before 2026-12-05)
            raise ValueError(f"guidance_scale: {type(self.pipe).__name__} does not take one (its guider sets it)")
        guidance = p.get("guidance_scale", self._default_guidance)
        if guidance is not None:
            guidance = _number(guidance, "guidance_scale", 0.0, 100.0)
        seed = p.get("seed")
        return _Job(
            request_id=request_id, prompt=prompt, negative_prompt=negative, image=image,
            width=width, height=height, num_frames=num_frames, seconds=seconds,
            steps=_int(p.get("num_inference_steps", self._default_steps), "num_inference_steps", 1,
                       MAX_INFERENCE_STEPS),
            guidance=guidance,
            seed=secrets.randbits(SEED_BITS) if seed is None else _int(seed, "seed", 0, (1 << SEED_BITS) - 1),
            video=video, strength=strength,
        )

    def _edit_source(self, video: Any, p: dict[str, Any]) -> tuple[np.ndarray | None, float]:
        """An edit's source frames and strength, checked (None when the request is no edit)."""
        if video is None:
            if "strength" in p:
                raise ValueError("strength: only an edit (a source video) takes one")
            return None, 1.0
        if not self.edits:
            raise ValueError(f"video: {type(self.pipe).__name__} cannot edit a video")
        video = np.asarray(video)
        if video.dtype != np.uint8 or video.ndim != 4 or video.shape[3] != 3:
            raise ValueError(f"video: expected uint8 [F, H, W, 3], got {video.dtype} {video.shape}")
        strength = _number(p.get("strength", video_edit.DEFAULT_STRENGTH), "strength", 0.01, 1.0)
        return video, strength

    def _size(self, p: dict[str, Any]) -> tuple[int | None, int | None]:
        if not self.makes_video:
            return None, None
        width, height = p.get("width"), p.get("height")
        if isinstance(p.get("size"), str):
            parts = p["size"].lower().split("x")
            if len(parts) != 2 or not all(s.isdigit() for s in parts):
                raise ValueError(f"size: expected 'WxH', got {p['size']!r}")
            width, height = int(parts[0]), int(parts[1])
        if width is None and height is None:
            return None, None
        m = self._size_multiple
        for name, v in (("width", width), ("height", height)):
            _int(v, name, m, MAX_SIDE_PX)
            if v % m:
                raise ValueError(f"size: {name} {v} is not a multiple of {m}, which this model needs")
        return width, height

    def _frames(self, n: Any) -> int | None:
        if n is None:
            return None
        n = _int(n, "num_frames", 1, self._max_frames)
        k = self._frame_multiple
        if k > 1 and n % k != 1:
            raise ValueError(f"num_frames: {n} is not k * {k} + 1, which this model needs")
        return n

    def _key(self, job: _Job) -> tuple[Any, ...]:
        """Jobs of equal keys share a pipeline call."""
        alone = job.image is not None and (self._first_frames is None or job.width is None)
        return (*job.batch_key, job.request_id if alone else None)

    def _asked(self, job: _Job) -> str:
        size = f"{job.width}x{job.height}" if job.width and job.height else "the default size"
        if job.num_frames:
            return f"{size} with {job.num_frames} frames"
        return f"{size} for {job.seconds:g} s" if job.seconds else size

    def _start_batch(self) -> Batch:
        head, alone = self._next_head()
        jobs, rest = [head], deque()
        while self._queue:
            job = self._queue.popleft()
            if not alone and self._may_join(job) and self._key(job) == self._key(head) and len(jobs) < self._max_batch:
                jobs.append(job)
            else:
                rest.append(job)
        self._queue = rest
        self.batches_started += 1
        prepare = None
        if head.video is not None:
            prepare = functools.partial(video_edit.prepare, self.pipe, head.video, head.strength, head.steps,
                                        head.seed, float(self.fps))
        batch = Batch(self.pipe, jobs, self._call_kwargs(jobs), "callback_on_step_end" in self._accepts,
                      convert=self._convert, report_decode=True, prepare=prepare)
        self._runner.submit(batch)
        return batch

    def _call_kwargs(self, jobs: list[_Job]) -> dict[str, Any]:
        import torch

        head = jobs[0]
        kw: dict[str, Any] = {
            "prompt": [j.prompt for j in jobs],
            "num_inference_steps": head.steps,
            "generator": [torch.Generator("cpu").manual_seed(j.seed) for j in jobs],
            # "pt" on a GPU: the frames are rounded to uint8 there (a quarter of the bytes cross to the
            # host, no float pass on one CPU thread); on CPU numpy's blocked rounding is faster.
            "output_type": "pt" if self.makes_video and self._frames_on_device else "np",
        }
        if head.negative_prompt is not None:
            kw["negative_prompt"] = [j.negative_prompt for j in jobs]
        if head.guidance is not None and "guidance_scale" in self._accepts:
            kw["guidance_scale"] = head.guidance
        if self.makes_video:
            if head.width is not None:
                kw["width"], kw["height"] = head.width, head.height
            if head.num_frames is not None:
                kw["num_frames"] = head.num_frames
            if "frame_rate" in self._accepts:
                kw["frame_rate"] = float(self.fps)
            if "num_videos_per_prompt" in self._accepts:
                kw["num_videos_per_prompt"] = 1
        else:
            kw["audio_end_in_s"] = head.seconds
            if "num_waveforms_per_prompt" in self._accepts:
                kw["num_waveforms_per_prompt"] = 1
        if head.image is not None and len(jobs) > 1:
            assert self._first_frames is not None and head.width is not None and head.height is not None
            kw["image"] = self._first_frames([j.image for j in jobs], head.width, head.height)
        elif head.image is not None:
            from PIL import Image

            kw["image"] = Image.fromarray(head.image)
        return kw

    def _convert(self, result: Any) -> dict[str, Any]:
        """The pipeline's result as plain arrays (on the runner thread, once per batch)."""
        out: dict[str, Any] = {}
        if self.makes_video:
            out["frames"] = _video_uint8(result.frames, channels_first=self._frames_on_device)
        audio = getattr(result, "audio", None) if self.makes_video else result.audios
        if audio is not None:
            out["audio"] = _float_audio(audio)
        return out

    def _final_outputs(self, batch: Batch, made: dict[str, Any], total: int) -> list[EngineOutput]:
        outs = []
        for row, job in enumerate(batch.jobs):
            if job.request_id not in batch.live:
                continue
            payload: dict[str, Any] = {"seed": job.seed, "progress": 1.0, "step": total, "total": total}
            if "frames" in made:
                frames = np.ascontiguousarray(made["frames"][row])
                f, h, w = frames.shape[:3]
                want = (job.num_frames or f, job.height or h, job.width or w)
                if (f, h, w) != want:
                    error = (f"{type(self.pipe).__name__} made {f} frames of {w}x{h}; "
                             f"{want[0]} frames of {want[2]}x{want[1]} were requested")
                    outs.append(EngineOutput(job.request_id, {}, finished=True, error=error))
                    continue
                payload.update(frames=frames, fps=self.fps)
            if "audio" in made:
                payload.update(audio=np.ascontiguousarray(made["audio"][row]),
                               sample_rate=int(self._audio_rate))
            outs.append(EngineOutput(job.request_id, payload, finished=True))
        return outs


def _video_uint8(frames: Any, channels_first: bool = False) -> np.ndarray:
    """Pipeline frames (float [0, 1] numpy/torch [B, F, H, W, C], or lists of PIL) as uint8 [B, F, H, W, 3].

    `channels_first`: torch frames as output_type "pt" gives them, [B, F, C, H, W] on the pipeline's
    device, rounded to uint8 there (the same values as the numpy rounding below)."""
    if isinstance(frames, list):
        frames = np.stack([np.stack([np.asarray(im) for im in video]) for video in frames])
    elif channels_first:
        b, f = frames.shape[:2]
        frames = rounded_uint8(frames.flatten(0, 1)).contiguous().cpu().numpy()
        frames = frames.reshape(b, f, *frames.shape[1:])
    elif not isinstance(frames, np.ndarray):
        frames = frames.float().cpu().numpy()
    if frames.dtype != np.uint8:
        frames = _float_to_uint8(frames)
    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, axis=-1)
    return frames


def _float_to_uint8(frames: np.ndarray) -> np.ndarray:
    """`(clip(frames, 0, 1) * 255).round()` as uint8 [..., H, W, C], bit for bit, a few rows at a time.

    The one-line form makes three temporaries of the float video and reads it four times; diffusers'
    frames are also not contiguous (Wan's are [B, F, H, W, C] views of [B, C, F, H, W] memory), and
    `astype` keeps that layout, so the outputs then made a transposing copy. On CPU, for a 720p
    49-frame video (530 MB of float32), that cost 0.4-2.7 s after the pipeline returned, this 0.13 s
    (scripts/bench_video_handoff.py). Here each block of rows of a frame goes through one reused
    scratch buffer laid out as the frames are, and only the uint8 result is allocated."""
    *lead, h, w, c = frames.shape
    out = np.empty(frames.shape, np.uint8)
    if out.size == 0:
        return out
    rows = max(1, CONVERT_BLOCK_VALUES // (w * c))
    # Laid out in memory as a block of the frames is (the arithmetic then runs along contiguous rows;
    # the copy into `out` interleaves the channels), in the one-line form's result type.
    scratch = np.empty_like(frames[(0,) * len(lead)][:rows], np.result_type(frames.dtype, 255.0), order="K")
    # Channel planes (Wan's layout) interleave one channel at a time: numpy's own order for a copy
    # between layouts ran an inner loop over the 3 channels, 3x slower.
    planar = c > 1 and scratch.strides[-1] != scratch.itemsize
    for index in np.ndindex(*lead):
        src, dst = frames[index], out[index]
        for r0 in range(0, h, rows):
            block = src[r0 : r0 + rows]
            buf = scratch[: block.shape[0]]
            np.clip(block, 0.0, 1.0, out=buf)
            np.multiply(buf, 255.0, out=buf)
            np.rint(buf, out=buf)
            rows_out = dst[r0 : r0 + rows]
            if planar:
                for ch in range(c):
                    np.copyto(rows_out[..., ch], buf[..., ch], casting="unsafe")
            else:
                np.copyto(rows_out, buf, casting="unsafe")
    return out


def _float_audio(audio: Any) -> np.ndarray:
    """Pipeline audio (numpy or torch, [B, C, S] or [B, S]) as float32 [B, C, S]."""
    if not isinstance(audio, np.ndarray):
        audio = audio.float().cpu().numpy()
    audio = audio.astype(np.float32, copy=False)
    return audio[:, None, :] if audio.ndim == 2 else audio


def _audio_window_s(pipe: Any) -> float:
    """The longest clip an audio pipeline's latent window holds (StableAudioPipeline's own cap); inf if unknown."""
    size = getattr(getattr(getattr(pipe, "transformer", None), "config", None), "sample_size", None)
    vae = getattr(pipe, "vae", None)
    hop, rate = getattr(vae, "hop_length", None), getattr(getattr(vae, "config", None), "sampling_rate", None)
    if not all(isinstance(v, int) and v > 0 for v in (size, hop, rate)):
        return math.inf
    return size * hop / rate


def _audio_rate(pipe: Any) -> int | None:
    for part in ("vocoder", "audio_vae", "vae"):
        cfg = getattr(getattr(pipe, part, None), "config", None)
        for key in ("output_sampling_rate", "sampling_rate", "sample_rate"):
            rate = getattr(cfg, key, None) if cfg is not None else None
            if isinstance(rate, int):
                return rate
    return None


def _default(sig: Any, name: str, fallback: Any) -> Any:
    param = sig.get(name)
    if param is None or param.default is inspect.Parameter.empty or param.default is None:
        return fallback
    return param.default


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise ValueError(f"{name}: expected a number in [{lo}, {hi}], got {value!r}")
    return float(value)
