"""Request and response bodies of the REST API as msgspec structs (the OpenAPI source).

Requests forbid unknown fields, so a typo is a 400 naming the field instead of
being silently ignored; ranges are `Meta` constraints, so they appear in
/openapi.json too. `read_body(request, Type)` decodes and validates in one pass.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from msgspec import Meta, Struct

from omni_actors.api.diffusion_caps import MAX_GUIDANCE_SCALE
from omni_actors.api.errors import ApiError, bad_request, from_validation
from omni_actors.models.diffusion.capabilities import DiffusionCaps

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
INT32_MAX = 2**31 - 1
"""Largest max_tokens or top_k accepted (what a 32-bit integer holds; no real request asks more)."""
TokenCount = Annotated[int, Meta(ge=1, le=INT32_MAX)]
TopK = Annotated[int, Meta(ge=-1, le=INT32_MAX)]
"""-1 (or 0) means no top-k filtering, as in vLLM."""
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
"""A 64-bit seed. Unbounded JSON integers would not fit the bus's msgpack frames."""
NonEmptyStr = Annotated[str, Meta(min_length=1)]
MAX_NAME_CHARS = 256
"""Longest identifier-like string a client sends (model, voice, name, user, ids, a stop sequence)."""
Name = Annotated[str, Meta(max_length=MAX_NAME_CHARS)]
MAX_INSTRUCTIONS_CHARS = 65_536
"""Longest `instructions` (a system prompt: ~16k tokens, more than small models' context)."""
Instructions = Annotated[str, Meta(max_length=MAX_INSTRUCTIONS_CHARS)]
MAX_TOOLS = 128
"""Most function tools one request or session may declare (OpenAI's own limit)."""
MAX_STOP = 4
"""Most stop sequences (OpenAI's limit)."""
MAX_METADATA = 16
"""Most metadata pairs (OpenAI's limit: 16, keys up to 64 characters, values up to 512)."""
_NO_NUL = "^[^\x00]*$"
"""Metadata keys and values hold no NUL: SQLite's JSON functions (a list's metadata filter) end text there."""
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64, pattern=_NO_NUL)],
                          Annotated[str, Meta(max_length=512, pattern=_NO_NUL)]], Meta(max_length=MAX_METADATA)]
MAX_CHOICES = 8
"""Most choices (`n`) one chat request may ask for; each runs as its own pipeline request."""


FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
"""OpenAI's rule for a function's name: letters, digits, underscores and dashes, at most 64."""


class RequestStruct(Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    pass


# ---- speech --------------------------------------------------------------------

SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]
MAX_VOICE_CHARS = 128


class VoiceRef(Struct, forbid_unknown_fields=True):
    """A custom voice by id (`{"id": "voice_..."}`), as OpenAI's SDK sends it."""

    id: Annotated[str, Meta(min_length=1, max_length=MAX_VOICE_CHARS)]


class SpeechRequest(RequestStruct):
    model: str
    input: Annotated[str, Meta(min_length=1, max_length=16384)]
    voice: Annotated[str, Meta(min_length=1, max_length=MAX_VOICE_CHARS)] | VoiceRef | None = None
    instructions: Instructions | None = None
    response_format: SpeechFormat = "mp3"
    speed: Annotated[float, Meta(ge=0.25, le=4.0)] = 1.0
    stream: bool = False
    stream_format: Literal["audio", "sse"] | None = None
    seed: Seed | None = None
    """Extension: a fixed seed makes the same request give the same audio (64-bit, as chat's and images')."""


class SpeechUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDelta(Struct, tag_field="type", tag="speech.audio.delta"):
    audio: str


class SpeechAudioDone(Struct, tag_field="type", tag="speech.audio.done"):
    usage: SpeechUsage


# ---- transcriptions --------------------------------------------------------------


class TranscriptionForm(Struct, kw_only=True):
    """POST /v1/audio/transcriptions, as multipart/form-data fields (documentation only)."""

    file: bytes
    model: str
    response_format: Literal["json", "text", "srt", "vtt", "verbose_json"] = "json"
    stream: bool = False
    language: Name | None = None
    prompt: Instructions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    timestamp_granularities: list[Literal["segment", "word"]] | None = msgspec.field(
        default=None, name="timestamp_granularities[]")
    """With verbose_json: "word" adds `words` (models that time words), "segment" (the default) `segments`."""
    chunking_strategy: str | None = None
    """"auto", or a server_vad object as JSON (the SDK sends its members as `chunking_strategy[type]`,
    `chunking_strategy[threshold]`, ...): checked, then left to the recognizer, which windows long audio itself."""


class TranscriptionUsage(Struct):
    type: Literal["duration"]
    seconds: int


class Transcription(Struct):
    text: str
    usage: TranscriptionUsage


class TranscriptionSegment(Struct):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionWord(Struct):
    word: str
    start: float
    end: float


class TranscriptionVerbose(Struct, omit_defaults=True):
    """response_format "verbose_json"."""

    task: Literal["transcribe"]
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment]
    usage: TranscriptionUsage
    words: list[TranscriptionWord] | None = None


class TranscriptTextDelta(Struct, tag_field="type", tag="transcript.text.delta"):
    delta: str


class TranscriptTextDone(Struct, tag_field="type", tag="transcript.text.done"):
    text: str
    usage: None = None
    """OpenAI's is token usage (the SDK types it so); no recognizer here reports one to the route."""


# ---- images --------------------------------------------------------------------


class DiffusionFields(RequestStruct):
    """Diffusion fields; also accepted at the top level of an image request."""

    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=MAX_GUIDANCE_SCALE)] | None = None
    negative_prompt: str | None = None
    seed: Seed | None = None


class ImageRequest(RequestStruct):
    prompt: NonEmptyStr
    model: Name | None = None
    n: Annotated[int, Meta(ge=1, le=10)] = 1
    size: Name | None = None
    """"WIDTHxHEIGHT" (e.g. "512x512") or "auto" (the pipeline's default)."""
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    quality: Literal["auto", "low", "medium", "high", "xhigh", "max", "standard", "hd"] | None = None
    """OpenAI's quality names, accepted and without effect: a diffusion model's cost and detail are set by
    `num_inference_steps` (docs/media.md)."""
    style: Literal["vivid", "natural"] | None = None
    """DALL-E 3's style, accepted and without effect: say the style in the prompt."""
    user: Name | None = None
    safety_identifier: Name | None = None
    """OpenAI's successor to `user` (a stable id of the end user), taken and unused."""
    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=MAX_GUIDANCE_SCALE)] | None = None
    negative_prompt: str | None = None
    seed: Seed | None = None
    stream: bool = False
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None
    """Previews sent before the final image when streaming (OpenAI allows 0-3)."""
    stream_progress: bool = False
    """This server's extension, with `stream`: a `<prefix>.progress` event (ImageProgressEvent) per
    denoising step, the last one's (phase "decode") as decoding starts, before the images (OpenAI's SDK
    passes them through)."""
    background: Literal["auto", "opaque", "transparent"] | None = None
    """"auto" and "opaque" are what a model makes; "transparent" is a 400 except on a layered model (its
    layers are RGBA)."""
    moderation: Literal["auto", "low"] | None = None
    """Accepted without effect: this server runs no moderation model."""
    output_compression: Annotated[int, Meta(ge=0, le=100)] | None = None
    """JPEG / WebP quality 0-100 (PIL's scale; unset: PIL's defaults, 75 and 80); PNG is lossless and ignores it."""
    extra_body: DiffusionFields | None = None


class ImageData(Struct, omit_defaults=True):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImagesResponse(Struct, omit_defaults=True):
    created: int
    data: list[ImageData]
    output_format: str
    size: str
    expires_at: int | None = None
    """Unix time the `url`s stop answering (extra to OpenAI's fields; only with response_format url)."""


class ImageStreamEvent(Struct, omit_defaults=True):
    """`image_generation.partial_image` / `image_generation.completed` (and the `image_edit.*` twins)."""

    type: str
    b64_json: str
    created_at: int
    size: str
    output_format: str
    background: str = "opaque"
    quality: str = "auto"
    partial_image_index: int | None = None


class ImageProgressEvent(Struct):
    """`image_generation.progress` / `image_edit.progress` (asked for with `stream_progress`): `step` of `total`
    denoising steps done, `progress` in [0, 1], `phase` "denoise" or "decode"."""

    type: str
    step: int
    total: int
    progress: float
    phase: str
    created_at: int


# ---- models, health, errors --------------------------------------------------------


class Model(Struct, omit_defaults=True, kw_only=True):
    object: Literal["model"]
    """Required, so that omit_defaults keeps it (OpenAI's clients read it)."""
    id: str
    created: int
    owned_by: str
    pipeline: str
    """The pipeline served under this name (extra to OpenAI's fields)."""
    output_types: list[str]
    """What the pipeline can produce: "text", "audio", "image", ..."""
    capabilities: DiffusionCaps | None = None
    """A diffusion pipeline's tasks and accepted inputs (read from its pipeline class)."""
    voices: list[str] | None = None
    """Built-in speech voices, for pipelines that speak (extra to OpenAI's fields)."""
    custom_voices: bool | None = None
    """For pipelines that speak: whether they speak in a custom voice (`voice={"id": "voice_..."}`);
    a model with no built-in `voices` speaks only in one (extra to OpenAI's fields)."""
    features: list[str] | None = None
    """Optional API features the pipeline serves (extra to OpenAI's fields): "tools" (function calling),
    "json_output" (response_format / text.format JSON), "forced_tool_calls" (tool_choice required or
    named), "word_timestamps" (transcription words), "full_duplex" (served only as realtime sessions
    that listen and speak at once)."""
    session_limit: int | None = None
    """A full-duplex model's most realtime sessions at once, as its replicas sized their slots (extra)."""


class ModelList(Struct):
    data: list[Model]
    object: Literal["list"] = "list"


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    error: ErrorDetail


class UnhealthyStage(Struct, omit_defaults=True):
    stage_id: int
    model_stage: str
    pipeline: str | None = None
    """The model id of the stage's pipeline (a server with several pipelines)."""


class Health(Struct, omit_defaults=True):
    status: Literal["ok", "unavailable", "loading"]
    """"loading": `omni-run` listens while its models load (api/loading.py)."""
    draining: bool = False
    unhealthy_stages: list[UnhealthyStage] = []


def _is_json(mime: str) -> bool:
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


_LONE_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")
"""A high-surrogate escape (an even run of backslashes before it) with no low-surrogate escape after it."""


def lone_surrogate(body: bytes, err: msgspec.DecodeError) -> ApiError | None:
    """The 400 for a lone high-surrogate escape ("\\ud800"), which msgspec reports as "Input data was
    truncated" within 6 bytes of the body's end and as "unexpected end of escaped utf-16 surrogate pair"
    elsewhere; None for any other decode error."""
    text = str(err)
    if isinstance(err, msgspec.ValidationError) or not (text == "Input data was truncated" or "surrogate" in text):
        return None
    found = _LONE_SURROGATE.search(body)
    if found is None:
        return None
    return bad_request(f"request body is not valid JSON: invalid \\u escape: lone UTF-16 surrogate "
                       f"{found.group(1).decode()} at byte {found.start(1)} (a high surrogate \\ud800-\\udbff "
                       "must be followed by a low one, \\udc00-\\udfff)", None, "invalid_json")


async def read_body(request: web.Request, typ: type[Struct]) -> Struct:
    """Read the JSON body and decode it into `typ`; a 400 names the offending field.

    The body is read first, so an oversized one is a 413 whatever its type; a declared
    Content-Type other than JSON is then a 415 (a missing one is taken as JSON).
    """
    try:
        body = await request.read()
    except web.RequestPayloadError as err:  # a body aiohttp cannot decode (Content-Encoding, chunking)
        cause = err.__cause__
        detail = cause.message if isinstance(cause, HttpProcessingError) else str(err)
        raise ApiError(400, f"cannot read the request body: {detail}", None, "invalid_body", close=True) from None
    if hdrs.CONTENT_TYPE in request.headers and not _is_json(request.content_type):
        raise ApiError(415, f"Content-Type {request.content_type!r} is not supported; send application/json",
                       None, "unsupported_media_type")
    if not body.strip():
        raise bad_request("request body is empty; expected a JSON object", None, "invalid_json")
    try:
        return msgspec.json.decode(body, type=typ)
    except msgspec.DecodeError as err:  # ValidationError is a subclass: both become 400
        raise lone_surrogate(body, err) or from_validation(err, typ) from None
    except RecursionError:  # (msgspec's decoder recurses per level: thousands deep exhaust the stack)
        raise bad_request("request body is nested too deeply", None, "invalid_json") from None
