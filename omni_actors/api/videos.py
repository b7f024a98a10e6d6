"""/v1/videos: OpenAI's video API (jobs), as the openai SDK's `client.videos` calls it.

    POST   /v1/videos                   create: multipart (or JSON) -> Video, `queued`, at once
    POST   /v1/videos/sync              the same request, answered with the MP4 when it is made (a job
                                        deleted meanwhile: 404 video_deleted; stopped: 503 server_stopped)
    GET    /v1/videos                   list: after, limit, order -> {"data", "has_more", ...}
    GET    /v1/videos/{id}              retrieve: status and progress
    DELETE /v1/videos/{id}              delete: a running job is aborted between steps
    GET    /v1/videos/{id}/content      download: variant=video (MP4) | thumbnail (JPEG) | spritesheet (JPEG grid)
    POST   /v1/videos/{id}/remix        {"prompt"} -> a new job, `remixed_from_video_id` set
    POST   /v1/videos/extensions        a video continued: video_derive.py
    POST   /v1/videos/edits             a video edited: video_derive.py (refused: no family edits video)

A remix makes a completed video again with a new prompt: the same model, size, frames,
steps, guidance, negative prompt, first frame and seed (the one the source ran with), so
the starting noise is the same and the new prompt steers it.

Create fields: prompt (required), model, size "WxH" (default: the model's; with a first frame,
its aspect at the default's area: video_request.reference_size), seconds (a
number; frames = seconds x fps, snapped to what the model makes), input_reference (an
image upload, or `input_reference[image_url]` as a data: URL), and beyond OpenAI's:
num_frames, num_inference_steps, guidance_scale, seed, negative_prompt. What the model
accepts (sizes, frame counts, a first frame) is checked here, before a job is queued,
from the family's declared `engine_defaults` (models/video); a refusal is a 400 naming
the field. The first frame crosses the bus as a uint8 array (shared memory past the
inline threshold), never as base64.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import msgspec
from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import (
    PIPELINES_KEY,
    drop_none,
    model_id,
    orchestrator,
    require_outputs,
    route_model,
)
from omni_actors.api.diffusion_caps import (
    MAX_GUIDANCE_SCALE,
    require_input,
    served_caps,
    stage_facts,
)
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.paging import newest_first
from omni_actors.api.schemas import RequestStruct, read_body
from omni_actors.api.video_jobs import RANK, VideoJobs
from omni_actors.api.video_request import (
    DEFAULT_SECONDS,
    decode_image,
    opt_float,
    opt_int,
    parse_frames,
    parse_reference,
    parse_size,
    read_fields,
    reference_size,
    referenced_file,
)
from omni_actors.api.videos_store import VARIANTS, JobRow, VideoStore, new_job_id
from omni_actors.media.mp4 import read_mp4, write_spritesheet
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.store import get_store
from omni_actors.workers.engines.video import MAX_INFERENCE_STEPS


class _Slot:
    """The app's video jobs, set at start-up when the served pipeline makes video."""

    jobs: VideoJobs | None = None


JOBS_KEY = web.AppKey("video_jobs", _Slot)
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
        # The first pipeline that makes video runs the jobs; others never open the data directory for this.
        orch = next((o for o in app[PIPELINES_KEY].all if "video" in o.pipeline.output_types()), None)
        if orch is not None:
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
    app.router.add_post("/v1/videos/{video_id}/remix", remix)
    # Imported here: video_derive builds on this module (jobs_of, to_video).
    from omni_actors.api import video_derive

    video_derive.add_routes(app)


def jobs_of(request: web.Request) -> VideoJobs:
    """The server's video jobs; a 400 saying what the model makes when it makes no video."""
    jobs = request.app[JOBS_KEY].jobs
    if jobs is None:
        require_outputs(orchestrator(request), {"video"}, "model")
        raise bad_request("this server has no video jobs", "model", "unsupported_modality")
    return jobs


def video_model(request: web.Request, fields: dict[str, str]) -> tuple[Orchestrator, str]:
    """The pipeline and model id a job request names (`model`, default: the served one); a 400 naming
    `model` unless it is the one that runs this server's video jobs."""
    orch, model = route_model(request, fields.get("model"), {"video"})  # (names every pipeline if none makes video)
    jobs = jobs_of(request)
    if orch is not jobs.orch:
        raise bad_request(f"video jobs run on model {model_id(jobs.orch)!r} only", "model", "unsupported_modality")
    return orch, model


def json_response(body: msgspec.Struct, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def to_video(row: JobRow) -> Video:
    error = None
    if row.status == "failed":
        error = VideoError(row.error_code or "failed", row.error_message or "generation failed", row.error_param)
    return Video(id=row.id, object="video", model=row.model, status=row.status, progress=row.progress,
                 created_at=row.created_at, completed_at=row.completed_at, expires_at=None,
                 prompt=row.prompt, size=row.size, seconds=row.seconds, remixed_from_video_id=row.remixed_from,
                 error=error)


def not_completed(row: JobRow, param: str, need: str) -> ApiError:
    """The 409 for a job that is not completed: `video_not_ready` while it may still be, `video_failed`
    (with its error) when it never will be."""
    if row.status == "failed":
        return ApiError(409, f"video {row.id} failed ({row.error_code}: {row.error_message}); {need}",
                        param, "video_failed")
    return ApiError(409, f"video {row.id} is {row.status}; {need}", param, "video_not_ready")


# -- create -------------------------------------------------------------------------------------


async def _submit(request: web.Request) -> str:
    fields, upload = await read_fields(request)
    orch, model = video_model(request, fields)
    caps = stage_facts(orch)
    prompt = fields.get("prompt")
    if not prompt:
        raise bad_request("prompt is required", "prompt", "missing_required_parameter")
    width, height = parse_size(fields.get("size") or caps.get("default_size") or "832x480", caps)
    seconds = fields.get("seconds") or DEFAULT_SECONDS
    num_frames = parse_frames(fields, seconds, caps)
    if "num_frames" in fields:  # it decides the clip's length, whatever `seconds` says
        seconds = f"{num_frames / float(caps['fps']):g}"
    image = parse_reference(fields, await referenced_file(request, fields, upload), caps)
    if image is not None and not fields.get("size"):  # at the first frame's aspect
        width, height = reference_size(image, (width, height), int(caps["size_multiple"]))
    params = drop_none({
        "width": width, "height": height, "num_frames": num_frames,
        "num_inference_steps": opt_int(fields, "num_inference_steps", 1, MAX_INFERENCE_STEPS),
        "guidance_scale": opt_float(fields, "guidance_scale", 0.0, MAX_GUIDANCE_SCALE),
        "seed": opt_int(fields, "seed", 0, (1 << 63) - 1),
    })
    inputs = drop_none({"prompt": prompt, "negative_prompt": fields.get("negative_prompt"), "image": image})
    takes = served_caps(orch)  # what the call takes (HunyuanVideo-1.5's has no guidance_scale: was dropped unsaid)
    require_input(takes, "guidance_scale", params.get("guidance_scale"))
    require_input(takes, "negative_prompt", inputs.get("negative_prompt"))
    job_id = new_job_id()
    jobs_of(request).create(job_id, inputs, params, model=model, prompt=prompt, size=f"{width}x{height}",
                            seconds=seconds)
    return job_id


async def create(request: web.Request) -> web.Response:
    job_id = await _submit(request)
    row = jobs_of(request).store.get(job_id)
    assert row is not None
    return json_response(to_video(row))


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
        raise sync_failure(job_id, row)
    return web.FileResponse(jobs.store.path(job_id), headers={"Content-Type": "video/mp4",
                                                               "X-Video-Id": job_id})


SYNC_STATUS = {"RequestRejected": 400, "server_stopped": 503, "server_restarted": 503, "WorkerDied": 503,
               "StageUnavailable": 503, "RequestTimeout": 504}
"""The status a sync call answers for a job that ended with this error code (others: 500, the server's fault)."""


def sync_failure(job_id: str, row: JobRow | None) -> ApiError:
    """What `/v1/videos/sync` answers for a job that did not complete (header X-Video-Id: the job). A job
    deleted while the call waited (its row gone, or failed `cancelled`: only a delete cancels a job here;
    an abort of the server's own fails with its reason) is a 404 `video_deleted`; one the server stopped
    a 503 `server_stopped`; a refusal a 400; else the job's error, as `retrieve` shows it."""
    headers = {"X-Video-Id": job_id}
    if row is None or row.error_code == "cancelled":
        return ApiError(404, f"video {job_id} was deleted while this request waited for it", None,
                        "video_deleted", headers=headers)
    code = row.error_code or "failed"
    return ApiError(SYNC_STATUS.get(code, 500), f"video generation failed: {row.error_message}", row.error_param,
                    code, headers=headers)


class RemixBody(RequestStruct):
    prompt: str


async def remix(request: web.Request) -> web.Response:
    jobs = jobs_of(request)
    source = _job(request)
    body = await read_body(request, RemixBody)
    if not body.prompt.strip():
        raise bad_request("prompt is required", "prompt", "missing_required_parameter")
    if source.status != "completed":
        raise not_completed(source, "video_id", "only a completed video can be remixed")
    if source.request is None or source.seed is None:
        raise bad_request(f"video {source.id} was made before this server kept what a remix needs; "
                          "create it again", "video_id", "unsupported_value")
    if source.request.get("extends"):
        raise bad_request(f"video {source.id} is an extension; remix its source, then extend that",
                          "video_id", "unsupported_value")
    if source.request.get("edits"):
        raise bad_request(f"video {source.id} is an edit; edit its source again with the new prompt",
                          "video_id", "unsupported_value")
    if source.model != model_id(jobs.orch):
        raise bad_request(f"video {source.id} was made by model {source.model!r}; this server makes video "
                          f"with {model_id(jobs.orch)!r}", "video_id", "unsupported_value")
    image = None
    if source.request.get("reference"):
        path = jobs.store.path(source.id, "reference")
        if not path.is_file():
            raise ApiError(404, f"video {source.id}: its first frame is gone", "video_id", "not_found")
        image = await off_loop(lambda: decode_image(path.read_bytes(), "video_id"))
    inputs = drop_none({"prompt": body.prompt, "negative_prompt": source.request.get("negative_prompt"),
                        "image": image})
    job_id = new_job_id()
    jobs.create(job_id, inputs, {**source.request["params"], "seed": source.seed}, model=source.model,
                prompt=body.prompt, size=source.size, seconds=source.seconds, remixed_from=source.id)
    row = jobs.store.get(job_id)
    assert row is not None
    return json_response(to_video(row))


# -- read, list, delete, download ---------------------------------------------------------------


def _job(request: web.Request) -> JobRow:
    job_id = request.match_info["video_id"]
    row = jobs_of(request).store.get(job_id)
    if row is None:
        raise ApiError(404, f"no video with id {job_id!r}", "video_id", "not_found")
    return row


async def retrieve(request: web.Request) -> web.Response:
    """Query extensions for clients that would rather wait than poll: `wait_s` (up to MAX_WAIT_S)
    with `past` (a status; default in_progress): answer once the job's status is past it; with
    `progress_past` (0-99) as well: once its progress is past that (a progress bar's next value)."""
    row = _job(request)
    if "wait_s" in request.query:
        query = dict(request.query)
        wait_s = opt_float(query, "wait_s", 0.0, MAX_WAIT_S) or 0.0
        past = request.query.get("past", "in_progress")
        if past not in RANK:
            raise bad_request(f"past must be one of {sorted(RANK)}", "past")
        progress = opt_int(query, "progress_past", 0, 99)
        await jobs_of(request).wait_past(row.id, past, wait_s, progress)
        row = _job(request)
    resp = json_response(to_video(row))
    if row.status in ("queued", "in_progress"):
        resp.headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)
    return resp


async def list_videos(request: web.Request) -> web.Response:
    q = request.query
    order = "desc" if newest_first(q) else "asc"
    limit = opt_int(dict(q), "limit", 1, LIST_MAX) or 20
    try:
        rows, more = jobs_of(request).store.page(q.get("after"), limit, order)
    except KeyError:
        raise bad_request(f"after: no video with id {q.get('after')!r}", "after") from None
    data = [to_video(r) for r in rows]
    return json_response(VideoList(object="list", data=data, has_more=more, first_id=data[0].id if data else None,
                           last_id=data[-1].id if data else None))


async def delete(request: web.Request) -> web.Response:
    jobs = jobs_of(request)
    row = _job(request)
    if jobs.cancel(row.id):
        await jobs.wait(row.id)  # aborted between steps; its end is recorded
    if not jobs.store.delete(row.id):  # another delete of it removed the row while this one waited
        raise ApiError(404, f"no video with id {row.id!r}", "video_id", "not_found")
    return json_response(VideoDeleted(id=row.id, object="video.deleted", deleted=True))


async def content(request: web.Request) -> web.StreamResponse:
    row = _job(request)
    variant = request.query.get("variant", "video")
    if variant not in VARIANTS:
        raise bad_request(f"variant {variant!r} is not available; expected one of {', '.join(VARIANTS)}",
                          "variant", "unsupported_value")
    if row.status != "completed":
        raise not_completed(row, "video_id", "its content is ready once it is completed")
    store = jobs_of(request).store
    path = store.path(row.id, variant)
    if variant == "spritesheet" and not path.is_file() and store.path(row.id).is_file():
        made: BaseException | None = None
        try:
            await off_loop(_spritesheet_of, store.path(row.id), path)  # a job finished before spritesheets
        except Exception as err:  # (its MP4 unlinked by a delete meanwhile, perhaps)
            made = err
        # A delete while it was being made unlinked the job's files before this one was renamed into
        # place: the job is gone, so is its spritesheet.
        if store.get(row.id) is None:
            path.unlink(missing_ok=True)
            raise ApiError(404, f"no video with id {row.id!r}", "video_id", "not_found")
        if made is not None:
            raise made
    if not path.is_file():
        raise ApiError(404, f"video {row.id}: its {variant} file is gone", "video_id", "not_found")
    kind = "video/mp4" if variant == "video" else "image/jpeg"
    return web.FileResponse(path, headers={"Content-Type": kind})


def _spritesheet_of(video: Path, path: Path) -> None:
    """Write `video`'s spritesheet at `path` (through a file of this call's own, then renamed)."""
    part = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
    try:
        write_spritesheet(part, read_mp4(video).frames)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
