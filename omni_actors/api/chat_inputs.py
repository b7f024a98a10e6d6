"""Chat messages -> the pipeline's `inputs`: text kept, audio and images decoded to arrays.

The convention every pipeline's chat entry stage reads:

    inputs = {
      "messages": [
        {"role": "user", "content": "plain text"},
        {"role": "user", "content": [
            {"type": "text", "text": "..."},
            {"type": "input_audio", "array": "audio", "sample_rate": 16000},
            {"type": "image", "array": "image"},
        ]},
      ],
      "audio": float32 mono [-1, 1],   "sample_rate": int,   # the last user message's audio
      "image": uint8 [H, W, 3],                              # the last user message's image
      "audio_1": ..., "image_1": ...                         # earlier ones, numbered in order
    }

An assistant turn's earlier `tool_calls` and a tool message's `tool_call_id` stay on
their message as OpenAI writes them; the request's `tools` (api/tools.py) are added
by the chat route as `inputs["tools"]`.

A media part names the top-level key holding its array ("array"): the bus
carries arrays only as top-level payload values (shared memory or inline), so
arrays are hoisted out of the message list instead of nested in it. A pipeline
that only understands the latest utterance reads `inputs["audio"]` directly.

A `file` part (`file_id` of an upload, which the route reads first: `file_ids`, or
`file_data`) is an image or audio, whichever its bytes decode as.

Decoding runs in a thread (`off_loop`); a part that cannot be decoded is a
400 naming it, e.g. `messages[2].content[1].input_audio.data`.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from omni_actors.api.audio_codec import decode_audio
from omni_actors.api.chat_schemas import (
    ChatMessage,
    FilePart,
    FileRef,
    ImageUrlPart,
    InputAudioPart,
    RefusalPart,
    TextPart,
)
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.image_upright import readable, upright

MAX_IMAGE_PIXELS = 40_000_000
"""Largest input image (width x height) decoded; past it a 400 before any pixel is decoded
(a 40 MP image is already 120 MB as RGB; vision encoders resize far below that)."""


def _b64(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("not valid base64", param, "invalid_base64") from None


def decode_data_url(url: str, param: str) -> np.ndarray:
    """A `data:image/...;base64,` URL -> uint8 RGB [H, W, 3]."""
    head, sep, data = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise bad_request("only data URLs (data:image/...;base64,...) are accepted; this server "
                          "fetches nothing", param, "unsupported_url")
    if not head.endswith(";base64"):
        raise bad_request("data URL must be base64-encoded", param, "invalid_image")
    return decode_image(_b64(data, param), param)


CLIENT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
"""The PIL decoders a client's bytes may reach (a phone's MPO opens as JPEG). Not every format PIL
knows: its EPS decoder runs Ghostscript on the bytes, and others are rarely exercised parsers."""
UNREADABLE_IMAGE = "not a format this server reads (PNG, JPEG, WebP, GIF, ...)"
_OBJECT_REPR = re.compile(r"\s*<[^<>]* object at 0x[0-9a-fA-F]+>")


def image_problem(err: Exception) -> str:
    """What PIL found wrong with bytes it could not open, fit for a client: its own "cannot identify image
    file <_io.BytesIO object at 0x7fcc...>" names our in-memory buffer, a Python object's repr."""
    from PIL import UnidentifiedImageError

    if isinstance(err, UnidentifiedImageError):
        return UNREADABLE_IMAGE
    return _OBJECT_REPR.sub("", str(err)).strip() or type(err).__name__


def open_image(raw: bytes, param: str, what: str, not_image: str | None = None) -> Any:
    """`raw` decoded by PIL (loaded), or a 400 naming `param`: `image_too_large` past MAX_IMAGE_PIXELS,
    checked from its header before any pixel is decoded (and PIL's own guard, which raises a
    DecompressionBombError past twice its limit); `invalid_image` if it is no image PIL reads. The one
    opening of a client's image: chat parts, edit uploads and masks, a video's first frame. `not_image`:
    the invalid_image message's start (default "<what> does not decode as an image")."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(raw), formats=CLIENT_IMAGE_FORMATS)
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise bad_request(f"{what} is {img.width}x{img.height} pixels, over the limit of {MAX_IMAGE_PIXELS}",
                              param, "image_too_large")
        img.load()
        return img
    except Image.DecompressionBombError:
        raise bad_request(f"{what} is over the limit of {MAX_IMAGE_PIXELS} pixels", param,
                          "image_too_large") from None
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise bad_request(f"{not_image or f'{what} does not decode as an image'}: {image_problem(err)}", param,
                          "invalid_image") from None


def decode_image(raw: bytes, param: str) -> np.ndarray:
    """Image file bytes -> uint8 RGB [H, W, 3], upright and readable (image_upright); a 400 naming `param`
    if they are none (open_image)."""
    img = readable(upright(open_image(raw, param, "image", not_image="cannot decode image")))
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def _file(ref: FileRef, files: dict[str, bytes], where: str) -> tuple[str, Any]:
    """A file part's contents as ("image", array) or ("audio", (samples, rate))."""
    if (ref.file_id is None) == (ref.file_data is None):
        raise bad_request("a file part needs exactly one of file_id and file_data", where, "invalid_file")
    if ref.file_id is not None:
        raw = files[ref.file_id]
    else:
        data = ref.file_data or ""
        raw = _b64(data.partition(",")[2] if data.startswith("data:") else data, f"{where}.file_data")
    try:
        return "image", decode_image(raw, where)
    except ApiError as err:
        if err.code != "invalid_image":  # an image, but over the size limit: that is the answer
            raise
    try:
        return "audio", decode_audio(raw, None, where)
    except ApiError as err:
        if err.code != "invalid_audio":  # audio, but over a limit, silent, ...: that is the answer
            raise
        raise bad_request("the file is neither an image nor audio this server reads (PNG, JPEG, WebP, ...; "
                          "WAV, FLAC, MP3, OGG); PDFs and text files are not read", where, "invalid_file") from None


def chat_param(message: int, part: int, leaf: str) -> str:
    """Where a chat request holds a message's content part: `messages[i].content[j].<leaf>`."""
    return f"messages[{message}].content[{part}].{leaf}"


def file_ids(messages: list[ChatMessage], param: Callable[[int, int, str], str] = chat_param) -> list[tuple[str, str]]:
    """(upload id, its param) of every `file` part given by `file_id`, for the route to read first."""
    return [(part.file.file_id, param(i, j, "file.file_id")) for i, msg in enumerate(messages)
            if isinstance(msg.content, list) for j, part in enumerate(msg.content)
            if isinstance(part, FilePart) and part.file.file_id is not None]


def build_chat_inputs(messages: list[ChatMessage], param: Callable[[int, int, str], str] = chat_param,
                      files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Normalize messages and hoist their media to top-level arrays (see the module docstring).
    `param(message, part, leaf)` names a part that cannot be decoded (another route's shape);
    `files`: the bytes of the uploads `file` parts name (`file_ids`)."""
    last_user = max((i for i, msg in enumerate(messages) if msg.role == "user"), default=-1)
    inputs: dict[str, Any] = {}
    counts = {"audio": 0, "image": 0}

    def key_for(kind: str, in_last_user: bool) -> str:
        if in_last_user and kind not in inputs:
            return kind
        counts[kind] += 1
        return f"{kind}_{counts[kind]}"

    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        entry: dict[str, Any] = {"role": msg.role}
        if msg.name is not None:
            entry["name"] = msg.name
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        if msg.tool_calls:  # (chat templates read them as OpenAI writes them)
            entry["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in msg.tool_calls]
        if msg.content is None or isinstance(msg.content, str):
            said = msg.refusal or (msg.audio.transcript if msg.audio is not None else None)
            entry["content"] = msg.content or said or ""
            out.append(entry)
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(msg.content):
            match part:
                case TextPart(text=text) | RefusalPart(refusal=text):
                    parts.append({"type": "text", "text": text})
                case InputAudioPart(input_audio=audio):
                    where = param(i, j, "input_audio.data")
                    raw = _b64(audio.data, where)
                    samples, rate = decode_audio(raw, audio.format, where)
                    key = key_for("audio", i == last_user)
                    inputs[key] = samples
                    if key == "audio":
                        inputs["sample_rate"] = rate
                    parts.append({"type": "input_audio", "array": key, "sample_rate": rate})
                case ImageUrlPart(image_url=image):
                    key = key_for("image", i == last_user)
                    inputs[key] = decode_data_url(image.url, param(i, j, "image_url.url"))
                    parts.append({"type": "image", "array": key})
                case FilePart(file=ref):
                    kind, value = _file(ref, files or {}, param(i, j, "file"))
                    key = key_for(kind, i == last_user)
                    if kind == "image":
                        inputs[key] = value
                        parts.append({"type": "image", "array": key})
                    else:
                        inputs[key], rate = value
                        if key == "audio":
                            inputs["sample_rate"] = rate
                        parts.append({"type": "input_audio", "array": key, "sample_rate": rate})
        entry["content"] = parts
        out.append(entry)
    inputs["messages"] = out
    return inputs
