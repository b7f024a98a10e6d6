"""Reading and checking a /v1/videos create request: form or JSON fields, size, frames, first frame.

What a model accepts comes from its family's declared `engine_defaults`
(`diffusion_caps.stage_facts`, with the deploy's engine_extras on top), so a bad request is a 400
naming the field before any job is queued.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import numpy as np
from aiohttp import web

from omni_actors.api.calls import orchestrator
from omni_actors.api.chat_inputs import open_image
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.files import file_bytes
from omni_actors.api.image_upright import readable, upright
from omni_actors.api.images import size_sides
from omni_actors.api.multipart import BodyBudget, form_parts, misplaced_part

FIELDS = frozenset({"prompt", "model", "size", "seconds", "input_reference", "input_reference[image_url]",
                    "input_reference[file_id]", "num_frames", "num_inference_steps", "guidance_scale", "seed",
                    "negative_prompt"})
NUMERIC_FIELDS = frozenset({"seconds", "num_frames", "num_inference_steps", "guidance_scale", "seed", "strength"})
"""Fields a JSON body may give as numbers (a form carries every field as text)."""
MAX_SIDE_PX = 4096
DEFAULT_SECONDS = "4"




async def read_fields(request: web.Request, known: frozenset[str] = FIELDS,
                      upload_field: str = "input_reference") -> tuple[dict[str, str], bytes | None]:
    """The form's (or JSON body's) fields, all `known`, and the bytes of the `upload_field` file part;
    a JSON object in `upload_field` becomes `upload_field[key]` fields, as the SDK's forms name them."""
    if request.content_type == "application/json":
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            raise ApiError(400, f"request body is not valid JSON: {err}", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object", None)
        ref = body.pop(upload_field, None)
        if isinstance(ref, dict):
            body.update({f"{upload_field}[{k}]": v for k, v in ref.items()})
        elif ref is not None:
            raise bad_request(f"{upload_field}: expected an object in JSON; upload a file as "
                              "multipart/form-data", upload_field)
        fields = {k: v for k, v in body.items() if v is not None}
        check_known(fields, known)
        return {k: _json_text(k, v) for k, v in fields.items()}, None
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send "
                       "multipart/form-data or JSON", None, "unsupported_media_type")
    fields: dict[str, str] = {}
    upload: bytes | None = None
    budget = BodyBudget(int(orchestrator(request).deploy.server.max_body_mb * 1024 * 1024))
    async for part in form_parts(request):
        name = part.name or ""
        check_known({name: ""}, known)
        if name in fields or (name == upload_field and upload is not None):
            raise bad_request(f"form field `{name}` is given twice", name)
        hint = f", or give `{upload_field}[image_url]` / `{upload_field}[file_id]` as text" if (
            upload_field == "input_reference") else f", or give `{upload_field}[id]` as text"
        if (misplaced := misplaced_part(part, name, name == upload_field, hint)) is not None:
            raise misplaced
        data = await budget.read(part)
        if name == upload_field:
            upload = bytes(data)
        else:
            fields[name] = data.decode("utf-8", errors="replace").strip()
    return fields, upload


def _json_text(name: str, value: Any) -> str:
    """A JSON field as the text a form would carry it in: a string, or a number where one is meant
    (a 400 naming the field for anything else, rather than a prompt of `["a"]` or a seed of `true`)."""
    if isinstance(value, str):
        return value
    if name in NUMERIC_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    kind = "a string or a number" if name in NUMERIC_FIELDS else "a string"
    raise bad_request(f"{name} must be {kind}, got {json.dumps(value)[:40]}", name, "invalid_type")


def check_known(fields: dict[str, Any], known: frozenset[str] = FIELDS) -> None:
    for name in fields:
        if name not in known:
            raise bad_request(f"unknown field `{name}`; expected {sorted(known)}", name, "unknown_parameter")


def parse_size(size: str, caps: dict[str, Any]) -> tuple[int, int]:
    sides = size_sides(size)
    if sides is None:
        raise bad_request(f"size {size!r} is not WIDTHxHEIGHT (e.g. 1280x720)", "size")
    width, height = sides
    m = int(caps["size_multiple"])
    if not (m <= width <= MAX_SIDE_PX and m <= height <= MAX_SIDE_PX) or width % m or height % m:
        raise bad_request(f"size {size!r}: this model makes sides that are multiples of {m}, "
                          f"from {m} to {MAX_SIDE_PX}", "size", "unsupported_size")
    return width, height


def reference_size(image: np.ndarray, default: tuple[int, int], multiple: int) -> tuple[int, int]:
    """The size of a video made from first frame `image` when the request gives none: the default size's pixel
    area at the image's aspect, each side rounded down to `multiple` (diffusers' Wan image-to-video recipe),
    within [multiple, MAX_SIDE_PX]. Before 2026-12-05 it was the default size itself, so a portrait photo
    was squeezed into a landscape video."""
    h, w = image.shape[:2]
    area = default[0] * default[1]
    top = MAX_SIDE_PX // multiple * multiple
    width, height = (min(top, max(multiple, math.isqrt(area * a // b) // multiple * multiple)) for a, b in ((w, h), (h, w)))
    return width, height


def parse_frames(fields: dict[str, str], seconds: str, caps: dict[str, Any]) -> int:
    """num_frames if given, else seconds x fps snapped to k * frame_multiple + 1."""
    k, top, fps = int(caps["frame_multiple"]), int(caps["max_frames"]), float(caps["fps"])
    try:
        secs = float(seconds)
    except ValueError:
        secs = math.nan
    if not (math.isfinite(secs) and secs > 0):
        raise bad_request(f"seconds {seconds!r} is not a positive number", "seconds")
    if "num_frames" in fields:
        n = opt_int(fields, "num_frames", 1, top)
        assert n is not None
        if k > 1 and n % k != 1:
            raise bad_request(f"num_frames {n}: this model makes k * {k} + 1 frames", "num_frames",
                              "unsupported_value")
        return n
    too_many = f"this model makes at most {top} frames ({top / fps:.2f} s)"
    if secs * fps > top + k:  # past the most frames, snapped or not (round(1e308 x fps) raised: a 500)
        raise bad_request(f"seconds {seconds}: over {top} frames at {fps:g} fps; {too_many}", "seconds",
                          "too_many_frames")
    n = max(1, round(secs * fps))
    if k > 1:
        n = max(1, round((n - 1) / k)) * k + 1
    if n > top:
        raise bad_request(f"seconds {seconds}: {n} frames at {fps:g} fps; {too_many}", "seconds", "too_many_frames")
    return n


async def referenced_file(request: web.Request, fields: dict[str, str], upload: bytes | None) -> bytes | None:
    """`upload`, or the bytes of the uploaded file that `input_reference[file_id]` names (one of the two)."""
    fid = fields.get("input_reference[file_id]")
    if fid is None:
        return upload
    if upload is not None or "input_reference[image_url]" in fields:
        raise bad_request("input_reference: give one of an image upload, image_url and file_id", "input_reference")
    return await file_bytes(request, fid, "input_reference")


def parse_reference(fields: dict[str, str], upload: bytes | None, caps: dict[str, Any]) -> np.ndarray | None:
    """The first frame a request gives (`upload`: its file part, or the file its file_id names), or None."""
    url = fields.get("input_reference[image_url]")
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
    """An uploaded image as uint8 [H, W, 3], upright by its EXIF orientation, 16-bit greyscale scaled
    (image_edits.readable); 400 naming `param` if it does not decode (open_image)."""
    img = open_image(data, param, f"{param}: the image", not_image=f"{param}: the upload is not an image this server decodes")
    return np.asarray(readable(upright(img)).convert("RGB"), dtype=np.uint8)


def opt_int(fields: dict[str, str], name: str, lo: int, hi: int) -> int | None:
    if name not in fields:
        return None
    try:
        value = int(fields[name])
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer in [{lo}, {hi}]", name)
    return value


def opt_float(fields: dict[str, str], name: str, lo: float, hi: float) -> float | None:
    if name not in fields:
        return None
    try:
        value = float(fields[name])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        raise bad_request(f"{name} must be a number in [{lo}, {hi}]", name)
    return value
