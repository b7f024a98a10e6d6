"""Chat completions request and response bodies as msgspec structs (part of the OpenAPI source).

The request forbids unknown fields and constrains its ranges as every request in
schemas.py does; responses and stream chunks are OpenAI's shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from omni_actors.api.schemas import (
    MAX_CHOICES,
    MAX_NAME_CHARS,
    MAX_STOP,
    MAX_TOOLS,
    FunctionName,
    Instructions,
    Metadata,
    Name,
    Penalty,
    Probability,
    RequestStruct,
    Seed,
    Temperature,
    TokenCount,
    TopK,
)

StopSequence = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_CHARS)]
"""A stop sequence: an empty one would end every answer before it began (vLLM refuses it)."""
MAX_TOP_LOGPROBS = 20
"""OpenAI's most `top_logprobs`."""
MAX_PREDICTION_PARTS = 64
"""Most text parts a `prediction` may carry."""
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""OpenAI's reasoning efforts. Only "none" (or null) is served: no model here reasons before it answers,
and OpenAI refuses an effort for its models that do not reason (`check_unserved`)."""
Verbosity = Literal["low", "medium", "high"]
"""Only "medium" is served, OpenAI's only value for its models without the control (`check_unserved`)."""
CacheRetention = Literal["in_memory", "24h"]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
"""Only 0 is served: no stage here returns log-probabilities."""


CacheTtl = Literal["30m", "12h"]
ImageDetail = Literal["auto", "low", "high", "original"]
"""Accepted; an image reaches the model as the pipeline's processor reads it, whatever the detail."""


class CacheBreakpoint(RequestStruct):
    """A content part's `prompt_cache_breakpoint`: accepted with no effect, as `prompt_cache_key` is (no prompt
    cache is kept per request; vLLM's prefix cache works unasked)."""

    mode: Literal["explicit"]
    ttl: CacheTtl | None = None


class PromptCacheOptions(RequestStruct):
    """Accepted with no effect (see CacheBreakpoint), but `prewarm`, which asks for no answer (`check_prewarm`)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: CacheTtl | None = None
    prewarm: bool | None = None
    comparison_response_id: Name | None = None


class TextPart(RequestStruct, tag_field="type", tag="text"):
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class ImageUrl(RequestStruct):
    url: str
    """A data URL (`data:image/png;base64,...`); remote URLs are not fetched."""
    detail: ImageDetail | None = None


class ImageUrlPart(RequestStruct, tag_field="type", tag="image_url"):
    image_url: ImageUrl
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputAudio(RequestStruct):
    data: str
    """Base64 audio. `pcm16` is raw little-endian 16-bit mono at 24 kHz."""
    format: Literal["wav", "pcm16", "mp3", "flac"]


class InputAudioPart(RequestStruct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class FileRef(RequestStruct):
    file_id: Name | None = None
    """An upload's id (POST /v1/files)."""
    file_data: str | None = None
    """The file itself: base64, or a base64 data URL."""
    filename: Name | None = None


class FilePart(RequestStruct, tag_field="type", tag="file"):
    """A file: an image or audio this server reads (PDFs and text files are refused)."""

    file: FileRef


class RefusalPart(RequestStruct, tag_field="type", tag="refusal"):
    """An earlier assistant turn's refusal, sent back as its content (read as text)."""

    refusal: str


ContentPart = TextPart | ImageUrlPart | InputAudioPart | FilePart | RefusalPart


class AudioRef(RequestStruct):
    """An earlier answer's audio. OpenAI's shape is `{id}`; the SDK's `messages.append(message)` sends the
    whole answer's audio back, so its other fields are accepted too. The server keeps no audio: the turn
    reads as its text, else its `transcript`."""

    id: Name
    data: str | None = None
    expires_at: int | None = None
    transcript: str | None = None


class CalledFunction(RequestStruct):
    name: Name
    arguments: str
    """JSON text, as the model wrote it."""


class CalledTool(RequestStruct):
    """A call an earlier assistant turn made (sent back with the `tool` message answering it)."""

    id: Name
    function: CalledFunction
    type: Literal["function"] = "function"


class ChatMessage(RequestStruct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: Name | None = None
    audio: AudioRef | None = None
    tool_call_id: Name | None = None
    tool_calls: Annotated[list[CalledTool], Meta(max_length=MAX_TOOLS)] | None = None
    refusal: str | None = None
    """An earlier assistant turn's refusal (its text when `content` is null)."""
    # What the SDK's `message.model_dump()` adds to an answer sent back: accepted when empty.
    function_call: None = None
    annotations: list[Any] | None = None


class ChatAudioOptions(RequestStruct):
    voice: Name | None = None
    format: Literal["wav", "mp3", "flac", "opus", "pcm16"] = "wav"


class StreamOptions(RequestStruct):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    """Accepted; chunks are never padded (this server's streams need no obfuscation field)."""


class JsonSchemaFormat(RequestStruct):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None
    """Accepted; the schema is always enforced where it is served (guided decoding)."""


class ResponseFormat(RequestStruct):
    """"text", or JSON by guided decoding where the text stage can (api/structured.py)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None



class Prediction(RequestStruct):
    """Predicted output: a speed hint for models that draft from it; the answer is the same without it."""

    type: Literal["content"]
    content: Instructions | Annotated[list[TextPart], Meta(max_length=MAX_PREDICTION_PARTS)]


class ApproximateLocation(RequestStruct):
    city: Name | None = None
    country: Name | None = None
    region: Name | None = None
    timezone: Name | None = None


class UserLocation(RequestStruct):
    type: Literal["approximate"]
    approximate: ApproximateLocation


class WebSearchOptions(RequestStruct):
    """Read so that a well-formed one gets the 400 saying web search is not served (`check_unserved`)."""

    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: UserLocation | None = None


class FunctionDef(RequestStruct):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(RequestStruct):
    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(RequestStruct):
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
    stop: StopSequence | Annotated[list[StopSequence], Meta(max_length=MAX_STOP)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    stream: bool | None = None
    """null is false, as OpenAI reads it (clients that send every field send null for unset ones)."""
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # Function calling: refused by name unless the pipeline's text stage can call tools (api/tools.py).
    tools: Annotated[list[ChatTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: Name | None = None
    store: bool | None = None
    """true: the finished completion and its messages are kept (api/chat_stored.py); null is false, as OpenAI's."""
    metadata: Metadata | None = None
    """Kept with a stored completion (its list filters by it); otherwise no effect."""
    # Accepted for client compatibility: this server has one tier.
    service_tier: Name | None = None
    logprobs: bool | None = None
    """Only false: log-probabilities are not returned (true is a 400 naming the field)."""
    top_logprobs: TopLogprobs | None = None
    # Accepted with no effect, as OpenAI reads them for a model without the feature: no prompt cache is
    # kept per key or for a time (vLLM's prefix cache works unasked), no per-user policy, a speed hint.
    prompt_cache_key: Name | None = None
    prompt_cache_retention: CacheRetention | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: Name | None = None
    prediction: Prediction | None = None
    # Served only at the value that asks for nothing this server lacks; else a 400 naming the field.
    reasoning_effort: ReasoningEffort | None = None
    verbosity: Verbosity | None = None
    web_search_options: WebSearchOptions | None = None
    logit_bias: dict[str, Any] | None = None
    """{token id: bias from -100 to 100}, applied by a vLLM text stage; elsewhere only null or {} (a 400 naming it)."""
    functions: list[Any] | None = None
    """OpenAI's deprecated function calling: only null (a 400 pointing to `tools`)."""
    function_call: str | dict[str, Any] | None = None
    """Only null (a 400 pointing to `tool_choice`)."""
    moderation: dict[str, Any] | None = None
    """Only null: no moderation model runs here (a 400 naming the field)."""


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


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Struct):
    """A token of the answer: its text, log-probability, UTF-8 bytes and likeliest alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprob] | None
    refusal: None = None


class Choice(Struct):
    index: int
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    service_tier: Literal["default"] = "default"
    """The tier that served it, as OpenAI says it: this server has one."""
    system_fingerprint: None = None
    """OpenAI's backend configuration id, always in its answers: null here (as vLLM's), no fingerprint kept."""


class DeltaAudio(Struct, omit_defaults=True):
    id: str
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class DeltaFunction(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(Struct, omit_defaults=True):
    """A call, or a piece of one, in a streamed delta: a call's first piece carries its `id`, `type`
    and `function.name`, the next ones more `function.arguments` text (OpenAI's shape)."""

    index: int
    function: DeltaFunction
    id: str | None = None
    type: Literal["function"] | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    service_tier: Literal["default"] = "default"
    """As the completion says it (OpenAI sends it on every chunk)."""
    system_fingerprint: None = None
    """As the completion says it."""
