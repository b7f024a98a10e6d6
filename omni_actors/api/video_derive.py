"""Video jobs made from a video: `client.videos.extend` and `client.videos.edit`.

    POST /v1/videos/extensions   multipart: prompt, seconds, video (MP4 upload) | video[id] -> Video, queued
    POST /v1/videos/edits        multipart: prompt, video (MP4 upload) | video[id], [strength],
                                 [input_reference[image_url]] -> Video, queued

An extension continues a video: the source's last frame is the first frame (`image`) of a
new generation of `seconds` (frames snapped as create snaps them) at the source's size;
the finished MP4 is the source followed by the new frames less the first, which repeats
the conditioning frame (video_jobs joins them, media/stitch.py; audio from either part
becomes one track over the whole video). The job's `seconds` is the stitched total;
`remixed_from_video_id` stays null (OpenAI has no extended-from field; the row's request
keeps the source as `extends`). Beyond OpenAI's fields: num_frames (instead of seconds),
num_inference_steps, guidance_scale, seed, negative_prompt, as create takes them.

The source is a completed job of this server's model, its MP4 hard-linked (or copied)
into the new job's files so deleting the source later does not break the job; or an
uploaded MP4 (under the body limit, decoded under media/mp4.py's bounds) of a size the
model makes at the model's fps. A model that takes no first frame cannot continue a
video: a 400 naming `video`.

The pinned openai SDK (3.57) fails on `video={"id": ...}` before sending (its file
extraction wants a file at `video`); `video=openai.omit, extra_body={"video": {"id": ...}}`
sends the form field `video[id]` (how the SDK names a nested form field), which is read here.

An edit re-makes a completed (or uploaded) video under a new prompt, on the families that
declare `video_input` (Wan2.2 text- and image-to-video, LTX-2): the source's frames cross to
the engine as an array and are encoded, noised to `strength` (default 0.7; 1.0 ignores the
source) and denoised under the new prompt (workers/engines/video_edit.py). The result has the
source's size and frame count; its frame count must be one the model makes (k *
frame_multiple + 1); it keeps the source's audio track, or its lack of one, whatever audio
the model makes (LTX-2's). An image-to-video model is conditioned on the source's first frame, or
on `input_reference` (an `image_url` data: URL, as the SDK sends `extra_body={"input_reference":
{"image_url": ...}}`), which replaces the source's first frame; a text-only model refuses one
(400 naming `input_reference`). Models without `video_input` answer a 400 naming `video`:
diffusers' WanVideoToVideoPipeline does not fit Wan2.2's checkpoints (one transformer where
A14B has two experts; TI2V-5B's VAE has a spatial factor of 16, not the 8 it derives).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from omni_actors import logs
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import drop_none
from omni_actors.api.diffusion_caps import MAX_GUIDANCE_SCALE, stage_facts
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.video_jobs import Soundtrack, VideoJobs
from omni_actors.api.video_request import (
    opt_float,
    opt_int,
    parse_frames,
    parse_reference,
    parse_size,
    read_fields,
    referenced_file,
)
from omni_actors.api.videos import jobs_of, json_response, not_completed, to_video, video_model
from omni_actors.api.videos_store import JobRow, new_job_id
from omni_actors.media.mp4 import Clip, DecodeError, Scan, read_mp4, scan_mp4
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.workers.engines.video import MAX_INFERENCE_STEPS

log = logs.get(__name__)

EXTEND_FIELDS = frozenset({"prompt", "model", "seconds", "video", "video[id]", "num_frames",
                           "num_inference_steps", "guidance_scale", "seed", "negative_prompt"})
EDIT_FIELDS = frozenset({"prompt", "model", "video", "video[id]", "strength", "num_inference_steps",
                         "guidance_scale", "seed", "negative_prompt", "input_reference[image_url]",
                         "input_reference[file_id]"})
FPS_TOLERANCE = 1e-3
"""How far (frames per second) an uploaded source's rate may be from the model's."""
NO_EDIT = "this model cannot edit video (the Wan2.2 and LTX-2 families can); extend or remix the video instead"


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/videos/extensions", extend_video)
    app.router.add_post("/v1/videos/edits", edit_video)


async def extend_video(request: web.Request) -> web.Response:
    jobs, fields, upload, orch, model = await _derived_request(request, EXTEND_FIELDS)
    caps = stage_facts(orch)
    prompt = fields["prompt"]
    if "seconds" not in fields and "num_frames" not in fields:
        raise bad_request("seconds is required: the length of the new segment", "seconds",
                          "missing_required_parameter")
    num_frames = parse_frames(fields, fields.get("seconds", "1"), caps)
    if caps.get("image_input", "none") == "none":
        raise bad_request("video: this model cannot continue from a frame (it makes video from text only)",
                          "video", "unsupported_value")
    params = {
        "num_frames": num_frames,
        "num_inference_steps": opt_int(fields, "num_inference_steps", 1, MAX_INFERENCE_STEPS),
        "guidance_scale": opt_float(fields, "guidance_scale", 0.0, MAX_GUIDANCE_SCALE),
        "seed": opt_int(fields, "seed", 0, (1 << 63) - 1),
    }
    job_id = new_job_id()
    placed = jobs.store.path(job_id, "source")
    try:
        extends, scan = await _place_source(jobs, placed, fields, upload, model)
        _check_source(scan, caps)
        total = scan.frames + num_frames - 1
        params.update(width=scan.width, height=scan.height)
        inputs = drop_none({"prompt": prompt, "negative_prompt": fields.get("negative_prompt"), "image": scan.last})
        jobs.create(job_id, inputs, drop_none(params), model=model, prompt=prompt,
                    size=f"{scan.width}x{scan.height}", seconds=f"{total / float(caps['fps']):g}", extends=extends)
    except BaseException:
        placed.unlink(missing_ok=True)
        raise
    log.info("video.extension_queued", job=job_id, extends=extends, source_frames=scan.frames,
             new_frames=num_frames)
    row = jobs.store.get(job_id)
    assert row is not None
    return json_response(to_video(row))


async def edit_video(request: web.Request) -> web.Response:
    jobs, fields, upload, orch, model = await _derived_request(request, EDIT_FIELDS)
    caps = stage_facts(orch)
    prompt = fields["prompt"]
    if not caps.get("video_input"):
        raise bad_request(f"video: {NO_EDIT}", "video", "unsupported_value")
    params = {
        "strength": opt_float(fields, "strength", 0.01, 1.0),
        "num_inference_steps": opt_int(fields, "num_inference_steps", 1, MAX_INFERENCE_STEPS),
        "guidance_scale": opt_float(fields, "guidance_scale", 0.0, MAX_GUIDANCE_SCALE),
        "seed": opt_int(fields, "seed", 0, (1 << 63) - 1),
    }
    # An image-to-video model is conditioned on the source's first frame unless a reference replaces it.
    reference = (parse_reference(fields, await referenced_file(request, fields, None), caps)
                 if any(k.startswith("input_reference") for k in fields) else None)
    edits, clip = await _read_source(jobs, fields, upload, model)
    f, height, width = clip.frames.shape[:3]
    _check_source(Scan(width, height, f, clip.fps, clip.frames[-1]), caps)
    try:
        parse_frames({"num_frames": str(f)}, "1", caps)
    except ApiError as err:
        raise bad_request(f"video: the source has {f} frames; {err.message}", "video", "unsupported_value") from None
    params.update(width=width, height=height, num_frames=f)
    inputs = drop_none({"prompt": prompt, "negative_prompt": fields.get("negative_prompt"), "video": clip.frames,
                        "image": reference})
    job_id = new_job_id()
    jobs.create(job_id, inputs, drop_none(params), model=model, prompt=prompt, size=f"{width}x{height}",
                seconds=f"{f / float(caps['fps']):g}", edits=edits, soundtrack=Soundtrack(clip.audio, clip.sample_rate))
    log.info("video.edit_queued", job=job_id, edits=edits, frames=f)
    row = jobs.store.get(job_id)
    assert row is not None
    return json_response(to_video(row))


async def _derived_request(request: web.Request, allowed: frozenset[str]) -> tuple[
        VideoJobs, dict[str, str], bytes | None, Orchestrator, str]:
    """A video-from-a-video request read: (the jobs, its fields, an uploaded source, the pipeline, the
    model id); 400s for unknown fields, another model, or no prompt."""
    jobs = jobs_of(request)
    fields, upload = await read_fields(request, allowed, "video")
    orch, model = video_model(request, fields)
    if not fields.get("prompt", "").strip():
        raise bad_request("prompt is required", "prompt", "missing_required_parameter")
    return jobs, fields, upload, orch, model


async def _read_source(jobs: VideoJobs, fields: dict[str, str], upload: bytes | None, model: str) -> tuple[str, Clip]:
    """An edit's source, decoded: (what it edits: a job id or "upload", its frames)."""
    source_id = _source_id(fields, upload)
    if source_id is None:
        assert upload is not None
        return "upload", await _read(upload)
    row = _completed(jobs, source_id, model, "edited")
    path = jobs.store.path(row.id, "video")
    if not path.is_file():
        raise ApiError(404, f"video {row.id}: its video file is gone", "video", "not_found")
    return row.id, await _read(path)


async def _read(source: bytes | Path) -> Clip:
    return await _decoded(read_mp4, source)


def _source_id(fields: dict[str, str], upload: bytes | None) -> str | None:
    """The source job's id, or None for an upload; a 400 naming `video` for neither or both."""
    source_id = fields.get("video[id]")
    if source_id is None and upload is None:
        raise bad_request("video is required: an MP4 upload or {\"id\": a completed video's id}", "video",
                          "missing_required_parameter")
    if source_id is not None and upload is not None:
        raise bad_request("video: give an MP4 upload or an id, not both", "video")
    return source_id


def _completed(jobs: VideoJobs, source_id: str, model: str, verb: str) -> JobRow:
    """The completed job `source_id` of `model` (404, 409 or 400 naming `video` otherwise)."""
    row = jobs.store.get(source_id)
    if row is None:
        raise ApiError(404, f"no video with id {source_id!r}", "video", "not_found")
    if row.status != "completed":
        raise not_completed(row, "video", f"only a completed video can be {verb}")
    if row.model != model:
        raise bad_request(f"video {row.id} was made by model {row.model!r}; this server makes video with "
                          f"{model!r}", "video", "unsupported_value")
    return row


async def _place_source(jobs: VideoJobs, placed: Path, fields: dict[str, str], upload: bytes | None,
                        model: str) -> tuple[str, Scan]:
    """Put the source MP4 at `placed` (the new job's `source` file) and scan it: (what it extends, scan)."""
    source_id = _source_id(fields, upload)
    if source_id is None:
        assert upload is not None
        scan = await _scan(upload)
        await off_loop(_write, placed, upload)
        return "upload", scan
    row = _completed(jobs, source_id, model, "extended")
    path = jobs.store.path(row.id, "video")
    try:
        await off_loop(_link, path, placed)
    except FileNotFoundError:
        raise ApiError(404, f"video {row.id}: its video file is gone", "video", "not_found") from None
    return row.id, await _scan(placed)


async def _scan(source: bytes | Path) -> Scan:
    return await _decoded(scan_mp4, source)


async def _decoded(decode: Callable[[bytes | Path], Any], source: bytes | Path) -> Any:
    """`decode(source)` off the loop; a 400 naming `video` when the source does not decode."""
    try:
        return await off_loop(decode, source)
    except DecodeError as err:
        raise bad_request(f"video: the source is not a video this server reads: {err}", "video",
                          "invalid_video") from None


def _check_source(scan: Scan, caps: dict) -> None:
    """A 400 naming `video` unless the model makes video of the source's size at the source's fps."""
    try:
        parse_size(f"{scan.width}x{scan.height}", caps)
    except ApiError as err:
        raise bad_request(f"video: the source is {scan.width}x{scan.height}; {err.message}", "video",
                          "unsupported_size") from None
    fps = float(caps["fps"])
    if abs(scan.fps - fps) > FPS_TOLERANCE:
        raise bad_request(f"video: the source runs at {scan.fps:g} fps; this model makes {fps:g} fps", "video",
                          "unsupported_value")


def _link(source: Path, dest: Path) -> None:
    """`dest` as a hard link to `source`, or a copy where links cannot be made; whole or absent."""
    try:
        os.link(source, dest)
    except FileNotFoundError:
        raise
    except OSError:  # another file system, or one without hard links
        part = dest.with_name(dest.name + ".part")
        try:
            shutil.copyfile(source, part)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)


def _write(dest: Path, data: bytes) -> None:
    part = dest.with_name(dest.name + ".part")
    try:
        part.write_bytes(data)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
