"""What the served diffusion stage can do, for the routes and `/v1/models` (read once, without torch).

`served_caps(orch)` is None for a pipeline without a DIFFUSION stage; otherwise
the capabilities of the diffusers folder that stage loads (see
models/diffusion/capabilities.py). `require_task` is the one place a route asks
"can this model do X?" and answers a 400 saying what the model does.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

from omni_actors.api.errors import bad_request
from omni_actors.config.pipeline import ExecutionType
from omni_actors.errors import ConfigError
from omni_actors.models.diffusion.capabilities import DiffusionCaps, VideoFacts, folder_caps
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.workers.engines.video import DEFAULTS as VIDEO_DEFAULTS

ROUTE_FOR_TASK = {
    "image-edit": "/v1/images/edits",
    "image-to-layers": "/v1/images/edits",
    "inpaint": "/v1/images/edits",
    "text-to-video": "/v1/videos",
    "image-to-video": "/v1/videos",
    "text-to-audio": "/v1/audio/generations",
}
"""Where a task is served when it is not text-to-image."""
MAX_GUIDANCE_SCALE = 100.0
"""Largest `guidance_scale` the image and video routes take; past it a request is a 400 naming the field
(released checkpoints use about 1-20; before 2026-12-05 any finite value, 1e300 too, reached the pipeline)."""


def served_caps(orch: Orchestrator) -> DiffusionCaps | None:
    for stage in orch.pipeline.stages:
        if stage.execution_type is ExecutionType.DIFFUSION and orch.deploy.model:
            root = Path(orch.deploy.model).expanduser()
            caps = _caps(str(root / stage.subdir if stage.subdir else root))
            return _as_routed(caps, orch) if caps is not None and caps.output_kind == "video" else caps
    return None


def stage_facts(orch: Orchestrator) -> dict[str, Any]:
    """What the served (final) stage's family declared it makes (its `engine_defaults`: sides,
    frames, whether a first frame is needed), with the deploy's engine_extras on top: what the
    video and audio routes check a request against."""
    spec = next(s for s in orch.pipeline.stages if s.final_output)
    return {**VIDEO_DEFAULTS, "image_input": "none", **spec.engine_defaults,
            **orch.deploy.stage(spec.stage_id).engine_extras}


def _as_routed(caps: DiffusionCaps, orch: Orchestrator) -> DiffusionCaps:
    """A video pipeline's capabilities as /v1/videos serves them: the family's side multiple, whether
    it needs a first frame (an image-to-video family refuses a request without one), its frames."""
    facts = stage_facts(orch)
    image = str(facts["image_input"])
    video_tasks = {"required": ["image-to-video"], "none": ["text-to-video"]}.get(
        image, ["text-to-video", "image-to-video"])
    tasks = video_tasks + [t for t in caps.tasks if t not in ("text-to-video", "image-to-video")]
    inputs = [i for i in caps.inputs if i != "image"] + (["image"] if image != "none" else [])
    video = VideoFacts(fps=float(facts["fps"]), max_frames=int(facts["max_frames"]),
                       frame_multiple=int(facts["frame_multiple"]))
    return msgspec.structs.replace(caps, tasks=tuple(tasks), inputs=tuple(inputs), image_input=image,
                                   size_multiple=int(facts["size_multiple"]), video=video)


@functools.cache
def _caps(folder: str) -> DiffusionCaps | None:
    try:
        return folder_caps(folder)
    except ConfigError:
        return None  # the worker reports the folder's problem at start; routes then skip the check


def require_task(orch: Orchestrator, caps: DiffusionCaps | None, tasks: set[str], route: str) -> None:
    """400 unless the served pipeline does one of `tasks`, saying what it does and where."""
    if caps is None or tasks & set(caps.tasks):
        return
    where = sorted({ROUTE_FOR_TASK.get(t, "/v1/images/generations") for t in caps.tasks})
    raise bad_request(
        f"model {orch.deploy.server.served_model_name or orch.pipeline.name!r} ({caps.pipeline_class}) "
        f"cannot serve {route}: it does {', '.join(caps.tasks)} (use {', '.join(where)})",
        "model", "unsupported_task")


def require_size(caps: DiffusionCaps | None, width: int | None, height: int | None) -> None:
    """400 naming `size` when the served pipeline cannot make sides of this length."""
    if caps is None or width is None or height is None:
        return
    m = caps.size_multiple
    if width % m or height % m:
        raise bad_request(f"size {width}x{height}: {caps.pipeline_class} makes sides that are multiples of {m}",
                          "size", "invalid_size")


def require_input(caps: DiffusionCaps | None, name: str, value: object) -> None:
    """400 naming `name` when a request gives an input (say negative_prompt) the pipeline does not take."""
    if caps is not None and value is not None and name not in caps.inputs:
        raise bad_request(f"{name}: {caps.pipeline_class} does not take one", name, "unsupported_parameter")
