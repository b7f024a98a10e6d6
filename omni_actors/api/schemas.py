"""Request and response bodies of the REST API as msgspec structs (the OpenAPI source).

Requests forbid unknown fields, so a typo is a 400 naming the field instead of
being silently ignored; ranges are `Meta` constraints, so they appear in
/openapi.json too. `read_body(request, Type)` decodes and validates in one pass.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from msgspec import Meta, Struct

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
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
                     Meta(max_length=MAX_METADATA)]
MAX_CHOICES = 8
"""Most choices (`n`) one chat request may ask for; each runs as its own pipeline request."""


class _Req(Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    pass


# ---- chat ----------------------------------------------------------------------


class TextPart(_Req, tag_field="type", tag="text"):
    text: str


class ImageUrl(_Req):
    url: str
    """A data URL (`data:image/png;base64,...`); remote URLs are not fetched."""
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(_Req, tag_field="type", tag="image_url"):
    image_url: ImageUrl


class InputAudio(_Req):
    data: str
    """Base64 audio. `pcm16` is raw little-endian 16-bit mono at 24 kHz."""
    format: Literal["wav", "pcm16", "mp3", "flac"]


class InputAudioPart(_Req, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


ContentPart = TextPart | ImageUrlPart | InputAudioPart


class AudioRef(_Req):
    id: Name


class CalledFunction(_Req):
    name: Name
    arguments: str
    """JSON text, as the model wrote it."""


class CalledTool(_Req):
    """A call an earlier assistant turn made (sent back with the `tool` message answering it)."""

    id: Name
    function: CalledFunction
    type: Literal["function"] = "function"


class ChatMessage(_Req):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: Name | None = None
    audio: AudioRef | None = None
    tool_call_id: Name | None = None
    tool_calls: Annotated[list[CalledTool], Meta(max_length=MAX_TOOLS)] | None = None


class ChatAudioOptions(_Req):
    voice: Name | None = None
    format: Literal["wav", "mp3", "flac", "opus", "pcm16"] = "wav"


class StreamOptions(_Req):
    include_usage: bool = False


class ResponseFormat(_Req):
    """Only "text" is served; the handler refuses JSON modes by name (no guided decoding here)."""

    type: Name
    json_schema: dict[str, Any] | None = None


FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
"""OpenAI's rule for a function's name: letters, digits, underscores and dashes, at most 64."""


class FunctionDef(_Req):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Req):
    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(_Req):
    model: Name
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    modalities: list[Literal["text", "audio"]] | None = None
    audio: ChatAudioOptions | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    seed: Seed | None = None
    stop: Name | Annotated[list[Name], Meta(max_length=MAX_STOP)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # Function calling: refused by name unless the pipeline's text stage can call tools (api/tools.py).
    tools: Annotated[list[ChatTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: Name | None = None
    # Accepted for client compatibility and ignored (this server stores nothing, has one tier).
    store: bool | None = None
    metadata: Metadata | None = None
    service_tier: Name | None = None
    logprobs: Literal[False] | None = None


class ChatAudio(Struct):
    id: str
    data: str
    expires_at: int
    transcript: str


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ResponseMessage(Struct):
    role: Literal["assistant"]
    content: str | None
    audio: ChatAudio | None = None
    tool_calls: list[ToolCall] | None = None


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(Struct):
    index: int
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"


class DeltaAudio(Struct, omit_defaults=True):
    id: str
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class DeltaToolCall(Struct):
    """A whole call in one delta (the answer is parsed when it ends)."""

    index: int
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


# ---- speech --------------------------------------------------------------------

SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]
MAX_VOICE_CHARS = 128


class VoiceRef(Struct, forbid_unknown_fields=True):
    """A custom voice by id (`{"id": "voice_..."}`), as OpenAI's SDK sends it."""

    id: Annotated[str, Meta(min_length=1, max_length=MAX_VOICE_CHARS)]


class SpeechRequest(_Req):
    model: str
    input: Annotated[str, Meta(min_length=1, max_length=16384)]
    voice: Annotated[str, Meta(min_length=1, max_length=MAX_VOICE_CHARS)] | VoiceRef | None = None
    instructions: Instructions | None = None
    response_format: SpeechFormat = "mp3"
    speed: Annotated[float, Meta(ge=0.25, le=4.0)] = 1.0
    stream: bool = False
    stream_format: Literal["audio", "sse"] | None = None
    seed: int | None = None
    """Extension: a fixed seed makes the same request give the same audio."""


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
    response_format: Literal["json", "text"] = "json"
    stream: bool = False
    language: Name | None = None
    prompt: Instructions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None


class TranscriptionUsage(Struct):
    type: Literal["duration"]
    seconds: int


class Transcription(Struct):
    text: str
    usage: TranscriptionUsage


class TranscriptTextDelta(Struct, tag_field="type", tag="transcript.text.delta"):
    delta: str


class TranscriptTextDone(Struct, tag_field="type", tag="transcript.text.done"):
    text: str


# ---- images --------------------------------------------------------------------


class DiffusionFields(_Req):
    """Diffusion fields; also accepted at the top level of an image request."""

    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0)] | None = None
    negative_prompt: str | None = None
    seed: Seed | None = None


class ImageRequest(_Req):
    prompt: NonEmptyStr
    model: Name | None = None
    n: Annotated[int, Meta(ge=1, le=10)] = 1
    size: Name | None = None
    """"WIDTHxHEIGHT" (e.g. "512x512") or "auto" (the pipeline's default)."""
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    quality: Name | None = None
    style: Name | None = None
    user: Name | None = None
    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0)] | None = None
    negative_prompt: str | None = None
    seed: Seed | None = None
    stream: bool = False
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None
    """Previews sent before the final image when streaming (OpenAI allows 0-3)."""
    background: str | None = None
    moderation: str | None = None
    output_compression: Annotated[int, Meta(ge=0, le=100)] | None = None
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


# ---- models, health, errors --------------------------------------------------------


class Model(Struct, omit_defaults=True):
    id: str
    created: int
    owned_by: str
    pipeline: str
    """The pipeline served under this name (extra to OpenAI's fields)."""
    output_types: list[str]
    """What the pipeline can produce: "text", "audio", "image", ..."""
    capabilities: DiffusionCaps | None = None
    """A diffusion pipeline's tasks and accepted inputs (read from its pipeline class)."""
    object: Literal["model"] = "model"
    voices: list[str] | None = None
    """Built-in speech voices, for pipelines that speak (extra to OpenAI's fields)."""


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
    status: Literal["ok", "unavailable"]
    draining: bool = False
    unhealthy_stages: list[UnhealthyStage] = []


def _is_json(mime: str) -> bool:
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


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
        raise from_validation(err) from None
