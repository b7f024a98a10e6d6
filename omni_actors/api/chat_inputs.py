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

Decoding runs in a thread (`off_loop`); a part that cannot be decoded is a
400 naming it, e.g. `messages[2].content[1].input_audio.data`.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from omni_actors.api.audio_codec import decode_audio
from omni_actors.api.chat_schemas import ChatMessage, ImageUrlPart, InputAudioPart, TextPart
from omni_actors.api.errors import bad_request

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
    from PIL import Image, UnidentifiedImageError

    head, sep, data = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise bad_request("only data URLs (data:image/...;base64,...) are accepted; this server "
                          "fetches nothing", param, "unsupported_url")
    if not head.endswith(";base64"):
        raise bad_request("data URL must be base64-encoded", param, "invalid_image")
    raw = _b64(data, param)
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise bad_request(f"image of {width}x{height} pixels is over the limit of "
                                  f"{MAX_IMAGE_PIXELS} pixels", param, "image_too_large")
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except UnidentifiedImageError:
        raise bad_request("cannot decode image: not a format this server reads (PNG, JPEG, WebP, GIF, ...)",
                          param, "invalid_image") from None
    except (OSError, Image.DecompressionBombError) as err:
        raise bad_request(f"cannot decode image: {err}", param, "invalid_image") from None


def chat_param(message: int, part: int, leaf: str) -> str:
    """Where a chat request holds a message's content part: `messages[i].content[j].<leaf>`."""
    return f"messages[{message}].content[{part}].{leaf}"


def build_chat_inputs(messages: list[ChatMessage], param: Callable[[int, int, str], str] = chat_param) -> dict[str, Any]:
    """Normalize messages and hoist their media to top-level arrays (see the module docstring).
    `param(message, part, leaf)` names a part that cannot be decoded (another route's shape)."""
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
            entry["content"] = msg.content or ""
            out.append(entry)
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(msg.content):
            match part:
                case TextPart(text=text):
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
        entry["content"] = parts
        out.append(entry)
    inputs["messages"] = out
    return inputs
