"""/v1/videos: OpenAI's video API (jobs), as the openai SDK's `client.videos` calls it.

    POST   /v1/videos                   create: multipart (or JSON) -> Video, `queued`, at once
    POST   /v1/videos/sync              the same request, answered with the MP4 when it is made
    GET    /v1/videos                   list: after, limit, order -> {"data", "has_more", ...}
    GET    /v1/videos/{id}              retrieve: status and progress
    DELETE /v1/videos/{id}              delete: a running job is aborted between steps
    GET    /v1/videos/{id}/content      download: variant=video (MP4) | thumbnail (JPEG)

Create fields: prompt (required), model, size "WxH" (default: the model's), seconds (a
number; frames = seconds x fps, snapped to what the model makes), input_reference (an
image upload, or `input_reference[image_url]` as a data: URL), and beyond OpenAI's:
num_frames, num_inference_steps, guidance_scale, seed, negative_prompt. What the model
accepts (sizes, frame counts, a first frame) is checked here, before a job is queued,
from the family's declared `engine_defaults` (models/video); a refusal is a 400 naming
the field. The first frame crosses the bus as a uint8 array (shared memory past the
inline threshold), never as base64.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import uuid
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.calls import drop_none, orchestrator, require_model, require_outputs
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.video_jobs import RANK, VideoJobs
from omni_actors.api.videos_store import JobRow, VideoStore
from omni_actors.store import get_store
from omni_actors.workers.engines.video import DEFAULTS, MAX_INFERENCE_STEPS


class _Slot:
    """The app's video jobs, set at start-up when the served pipeline makes video."""

    jobs: VideoJobs | None = None


JOBS_KEY = web.AppKey("video_jobs", _Slot)
FIELDS = frozenset({"prompt", "model", "size", "seconds", "input_reference", "input_reference[image_url]",
                    "input_reference[file_id]", "num_frames", "num_inference_steps", "guidance_scale", "seed",
                    "negative_prompt"})
READ_CHUNK = 1 << 16
MAX_SIDE_PX = 4096
DEFAULT_SECONDS = "4"
LIST_MAX = 100
MAX_WAIT_S = 600.0
POLL_AFTER_MS = 1000
"""What `retrieve` tells the SDK's poll helper to wait between polls of an unfinished job."""


class VideoError(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    param: str | None = None


class Video(msgspec.Struct):
    id: str
    object: str
    model: str
    status: str
    progress: int
    created_at: int
    completed_at: int | None
    expires_at: int | None
    prompt: str | None
    size: str
    seconds: str
    remixed_from_video_id: str | None
    error: VideoError | None


class VideoList(msgspec.Struct):
    object: str
    data: list[Video]
    has_more: bool
    first_id: str | None
    last_id: str | None


class VideoDeleted(msgspec.Struct):
    id: str
    object: str
    deleted: bool


def add_routes(app: web.Application) -> None:
    slot = app[JOBS_KEY] = _Slot()

    async def start(app: web.Application) -> None:
        from omni_actors.api.app import ORCH_KEY  # app.py imports this module; look it up late

        orch = app[ORCH_KEY]
        if "video" in orch.pipeline.output_types():  # others never open the data directory for this
            slot.jobs = VideoJobs(orch, VideoStore(get_store()))
            slot.jobs.recover()

    async def stop(app: web.Application) -> None:
        if slot.jobs is not None:
            await slot.jobs.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    app.router.add_post("/v1/videos", create)
    app.router.add_post("/v1/videos/sync", create_sync)
    app.router.add_get("/v1/videos", list_videos)
    app.router.add_get("/v1/videos/{video_id}", retrieve)
    app.router.add_delete("/v1/videos/{video_id}", delete)
    app.router.add_get("/v1/videos/{video_id}/content", content)


def jobs_of(request: web.Request) -> VideoJobs:
    """The server's video jobs; a 400 saying what the model makes when it makes no video."""
    jobs = request.app[JOBS_KEY].jobs
    if jobs is None:
        require_outputs(orchestrator(request), {"video"}, "model")
        raise bad_request("this server has no video jobs", "model", "unsupported_modality")
    return jobs


def _json(body: msgspec.Struct, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def to_video(row: JobRow) -> Video:
    error = None
    if row.status == "failed":
        error = VideoError(row.error_code or "failed", row.error_message or "generation failed", row.error_param)
    return Video(id=row.id, object="video", model=row.model, status=row.status, progress=row.progress,
                 created_at=row.created_at, completed_at=row.completed_at, expires_at=None,
                 prompt=row.prompt, size=row.size, seconds=row.seconds, remixed_from_video_id=None, error=error)


# -- create -------------------------------------------------------------------------------------


async def _submit(request: web.Request) -> str:
    orch = orchestrator(request)
    fields, upload = await _read_fields(request)
    model = require_model(orch, fields.get("model"))
    require_outputs(orch, {"video"}, "model")
    caps = capabilities(orch)
    prompt = fields.get("prompt")
    if not prompt:
        raise bad_request("prompt is required", "prompt", "missing_required_parameter")
    width, height = _size(fields.get("size") or caps.get("default_size") or "832x480", caps)
    seconds = fields.get("seconds") or DEFAULT_SECONDS
    num_frames = _frames(fields, seconds, caps)
    if "seconds" not in fields and "num_frames" in fields:  # the clip's length is what was asked
        seconds = f"{num_frames / float(caps['fps']):g}"
    image = _reference(fields, upload, caps)
    params = drop_none({
        "width": width, "height": height, "num_frames": num_frames,
        "num_inference_steps": _opt_int(fields, "num_inference_steps", 1, MAX_INFERENCE_STEPS),
        "guidance_scale": _opt_float(fields, "guidance_scale", 0.0, 100.0),
        "seed": _opt_int(fields, "seed", 0, (1 << 63) - 1),
    })
    inputs = drop_none({"prompt": prompt, "negative_prompt": fields.get("negative_prompt"), "image": image})
    job_id = f"video_{uuid.uuid4().hex}"
    jobs_of(request).create(job_id, inputs, params, model=model, prompt=prompt,
                                 size=f"{width}x{height}", seconds=seconds)
    return job_id


async def create(request: web.Request) -> web.Response:
    job_id = await _submit(request)
    row = jobs_of(request).store.get(job_id)
    assert row is not None
    return _json(to_video(row))


async def create_sync(request: web.Request) -> web.StreamResponse:
    jobs = jobs_of(request)
    job_id = await _submit(request)
    try:
        await jobs.wait(job_id)
    except BaseException:  # the client left: the job is not wanted any more
        jobs.cancel(job_id)
        raise
    row = jobs.store.get(job_id)
    if row is None or row.status != "completed":
        message = row.error_message if row is not None else "the job was deleted"
        raise ApiError(500, f"video generation failed: {message}", None,
                       row.error_code if row is not None else "deleted")
    return web.FileResponse(jobs.store.path(job_id), headers={"Content-Type": "video/mp4",
                                                               "X-Video-Id": job_id})


def capabilities(orch: Any) -> dict[str, Any]:
    """What the served family declared it makes, with the deploy's engine_extras on top."""
    spec = next(s for s in orch.pipeline.stages if s.final_output)
    return {**DEFAULTS, "image_input": "none", **spec.engine_defaults,
            **orch.deploy.stage(spec.stage_id).engine_extras}


async def _read_fields(request: web.Request) -> tuple[dict[str, str], bytes | None]:
    if request.content_type == "application/json":
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            raise ApiError(400, f"request body is not valid JSON: {err}", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object", None)
        ref = body.pop("input_reference", None)
        if isinstance(ref, dict):
            body.update({f"input_reference[{k}]": v for k, v in ref.items()})
        elif ref is not None:
            raise bad_request("input_reference: expected {\"image_url\": ...} in JSON; upload a file "
                              "as multipart/form-data", "input_reference")
        fields = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items() if v is not None}
        _known(fields)
        return fields, None
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send "
                       "multipart/form-data or JSON", None, "unsupported_media_type")
    fields: dict[str, str] = {}
    upload: bytes | None = None
    max_bytes, total = int(orchestrator(request).deploy.server.max_body_mb * 1024 * 1024), 0
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        name = part.name or ""
        _known({name: ""})
        data = bytearray()
        while chunk := await part.read_chunk(READ_CHUNK):
            data += chunk
            total += len(chunk)
            if total > max_bytes:
                raise ApiError(413, f"request body is over the limit of {max_bytes} bytes", None,
                               "body_too_large", close=True)
        if name == "input_reference":
            upload = bytes(data)
        else:
            fields[name] = data.decode("utf-8", errors="replace").strip()
    return fields, upload


def _known(fields: dict[str, Any]) -> None:
    for name in fields:
        if name not in FIELDS:
            raise bad_request(f"unknown field `{name}`; expected {sorted(FIELDS)}", name, "unknown_parameter")


def _size(size: str, caps: dict[str, Any]) -> tuple[int, int]:
    parts = size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise bad_request(f"size {size!r} is not WIDTHxHEIGHT (e.g. 1280x720)", "size")
    width, height = int(parts[0]), int(parts[1])
    m = int(caps["size_multiple"])
    if not (m <= width <= MAX_SIDE_PX and m <= height <= MAX_SIDE_PX) or width % m or height % m:
        raise bad_request(f"size {size!r}: this model makes sides that are multiples of {m}, "
                          f"from {m} to {MAX_SIDE_PX}", "size", "unsupported_size")
    return width, height


def _frames(fields: dict[str, str], seconds: str, caps: dict[str, Any]) -> int:
    """num_frames if given, else seconds x fps snapped to k * frame_multiple + 1."""
    k, top, fps = int(caps["frame_multiple"]), int(caps["max_frames"]), float(caps["fps"])
    try:
        secs = float(seconds)
    except ValueError:
        secs = math.nan
    if not (math.isfinite(secs) and secs > 0):
        raise bad_request(f"seconds {seconds!r} is not a positive number", "seconds")
    if "num_frames" in fields:
        n = _opt_int(fields, "num_frames", 1, top)
        assert n is not None
        if k > 1 and n % k != 1:
            raise bad_request(f"num_frames {n}: this model makes k * {k} + 1 frames", "num_frames",
                              "unsupported_value")
        return n
    n = max(1, round(secs * fps))
    if k > 1:
        n = max(1, round((n - 1) / k)) * k + 1
    if n > top:
        raise bad_request(f"seconds {seconds}: {n} frames at {fps:g} fps; this model makes at most {top} "
                          f"frames ({top / fps:.2f} s)", "seconds", "too_many_frames")
    return n


def _reference(fields: dict[str, str], upload: bytes | None, caps: dict[str, Any]) -> np.ndarray | None:
    url = fields.get("input_reference[image_url]")
    if fields.get("input_reference[file_id]"):
        raise bad_request("input_reference.file_id: this server has no file store; upload the image",
                          "input_reference", "unsupported_value")
    if url is not None:
        if not url.startswith("data:") or "," not in url:
            raise bad_request("input_reference.image_url: only data: URLs are accepted (this server "
                              "downloads nothing)", "input_reference", "unsupported_value")
        try:
            upload = base64.b64decode(url.split(",", 1)[1], validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("input_reference.image_url: not valid base64", "input_reference") from None
    mode = caps.get("image_input", "none")
    if upload is None:
        if mode == "required":
            raise bad_request("input_reference is required: this model makes video from a first frame "
                              "and a prompt", "input_reference", "missing_required_parameter")
        return None
    if mode == "none":
        raise bad_request("input_reference: this model makes video from text only", "input_reference",
                          "unsupported_value")
    return decode_image(upload, "input_reference")


def decode_image(data: bytes, param: str) -> np.ndarray:
    """An uploaded image as uint8 [H, W, 3]; 400 naming `param` if it does not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise bad_request(f"{param}: the upload is not an image this server decodes ({err})", param,
                          "invalid_image") from None


def _opt_int(fields: dict[str, str], name: str, lo: int, hi: int) -> int | None:
    if name not in fields:
        return None
    try:
        value = int(fields[name])
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer in [{lo}, {hi}]", name)
    return value


def _opt_float(fields: dict[str, str], name: str, lo: float, hi: float) -> float | None:
    if name not in fields:
        return None
    try:
        value = float(fields[name])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        raise bad_request(f"{name} must be a number in [{lo}, {hi}]", name)
    return value


# -- read, list, delete, download ---------------------------------------------------------------


def _job(request: web.Request) -> JobRow:
    job_id = request.match_info["video_id"]
    row = jobs_of(request).store.get(job_id)
    if row is None:
        raise ApiError(404, f"no video with id {job_id!r}", "video_id", "not_found")
    return row


async def retrieve(request: web.Request) -> web.Response:
    """Query extensions for clients that would rather wait than poll: `wait_s` (up to MAX_WAIT_S)
    with `past` (a status; default in_progress): answer once the job's status is past it."""
    row = _job(request)
    if "wait_s" in request.query:
        wait_s = _opt_float(dict(request.query), "wait_s", 0.0, MAX_WAIT_S) or 0.0
        past = request.query.get("past", "in_progress")
        if past not in RANK:
            raise bad_request(f"past must be one of {sorted(RANK)}", "past")
        await jobs_of(request).wait_past(row.id, past, wait_s)
        row = _job(request)
    resp = _json(to_video(row))
    if row.status in ("queued", "in_progress"):
        resp.headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)
    return resp


async def list_videos(request: web.Request) -> web.Response:
    q = request.query
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order must be asc or desc", "order")
    limit = _opt_int(dict(q), "limit", 1, LIST_MAX) or 20
    try:
        rows, more = jobs_of(request).store.page(q.get("after"), limit, order)
    except KeyError:
        raise bad_request(f"after: no video with id {q.get('after')!r}", "after") from None
    data = [to_video(r) for r in rows]
    return _json(VideoList(object="list", data=data, has_more=more, first_id=data[0].id if data else None,
                           last_id=data[-1].id if data else None))


async def delete(request: web.Request) -> web.Response:
    jobs = jobs_of(request)
    row = _job(request)
    if jobs.cancel(row.id):
        await jobs.wait(row.id)  # aborted between steps; its end is recorded
    jobs.store.delete(row.id)
    return _json(VideoDeleted(id=row.id, object="video.deleted", deleted=True))


async def content(request: web.Request) -> web.StreamResponse:
    row = _job(request)
    variant = request.query.get("variant", "video")
    if variant not in ("video", "thumbnail"):
        raise bad_request(f"variant {variant!r} is not available; expected video or thumbnail", "variant",
                          "unsupported_value")
    if row.status != "completed":
        raise ApiError(409, f"video {row.id} is {row.status}; its content is ready once it is completed",
                       "video_id", "video_not_ready")
    path = jobs_of(request).store.path(row.id, variant)
    if not path.is_file():
        raise ApiError(404, f"video {row.id}: its {variant} file is gone", "video_id", "not_found")
    kind = "video/mp4" if variant == "video" else "image/jpeg"
    return web.FileResponse(path, headers={"Content-Type": kind})
