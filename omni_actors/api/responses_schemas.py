"""The Responses API (`/v1/responses`) request and response bodies as msgspec structs (OpenAPI source too).

The request forbids unknown fields, as every request here does. Input items are one
struct whose `type` says which fields apply (a message may leave `type` out, so a tagged
union cannot tell them apart); api/responses_inputs.py checks each. Answers are OpenAI's
shapes: a `response` object whose `output` holds `message` and `function_call` items, and the
`response.*` stream events that build it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from omni_actors.api.chat_schemas import (
    CacheBreakpoint,
    CacheRetention,
    ImageDetail,
    InputAudio,
    PromptCacheOptions,
    ReasoningEffort,
    TopLogprobs,
    Verbosity,
)
from omni_actors.api.schemas import (
    MAX_TOOLS,
    FunctionName,
    Instructions,
    Metadata,
    Name,
    Probability,
    RequestStruct,
    Temperature,
    TokenCount,
)

MAX_INPUT_ITEMS = 2048
"""Most input items one request may carry (a long conversation sent back whole)."""
MAX_OUTPUT_PARTS = 64
"""Most parts one `function_call_output.output` may carry."""
MAX_INCLUDES = 16
"""Most `include` values one request may list (each of OpenAI's once, with room)."""
Includable = Literal["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                     "message.input_image.image_url", "computer_call_output.output.image_url",
                     "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"]
"""OpenAI's `include` values. This server's output has none of the items the others name, and input
images are listed as sent: each is accepted and changes nothing, except logprobs (responses_inputs.py)."""


class InputTextPart(RequestStruct, tag_field="type", tag="input_text"):
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None
    """Accepted with no effect (chat_schemas.CacheBreakpoint)."""


class OutputTextPart(RequestStruct, tag_field="type", tag="output_text"):
    """An earlier answer's text, sent back as an assistant message's content."""

    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(RequestStruct, tag_field="type", tag="refusal"):
    refusal: str


class InputImagePart(RequestStruct, tag_field="type", tag="input_image"):
    image_url: str | None = None
    """A data URL (`data:image/png;base64,...`); remote URLs and `file_id` are not fetched."""
    file_id: Name | None = None
    detail: ImageDetail | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputAudioItemPart(RequestStruct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


class InputFilePart(RequestStruct, tag_field="type", tag="input_file"):
    """An image or audio file: an upload's `file_id`, or `file_data` (base64 or a data URL);
    `file_url` is not fetched (a 400 naming it), and PDFs and text files are not read."""

    file_id: Name | None = None
    file_data: str | None = None
    filename: Name | None = None
    file_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


InputPart = InputTextPart | OutputTextPart | RefusalPart | InputImagePart | InputAudioItemPart | InputFilePart


class InputItem(RequestStruct):
    """A message (`role`, `content`), an earlier `function_call`, or a `function_call_output`."""

    type: Literal["message", "function_call", "function_call_output", "item_reference"] = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[InputPart] | None = None
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    call_id: Name | None = None
    name: FunctionName | None = None
    arguments: str | None = None
    output: str | Annotated[list[InputPart], Meta(max_length=MAX_OUTPUT_PARTS)] | None = None
    """A function call's result: text, or parts (their text is read; responses_inputs.py)."""
    phase: Literal["commentary", "final_answer"] | None = None
    """An output message's phase, as the SDK's `model_dump()` of `response.output` sends it back; ignored."""


class FunctionTool(RequestStruct, tag_field="type", tag="function"):
    name: FunctionName
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextFormat(RequestStruct):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")] | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextOptions(RequestStruct):
    format: TextFormat | None = None
    verbosity: Verbosity | None = None
    """Only "medium" (chat.check_unserved)."""


Summary = Literal["auto", "concise", "detailed"]


class ReasoningOptions(RequestStruct):
    """Only effort "none" (or null) is served (chat.check_unserved); a summary of no reasoning is none, as
    OpenAI gives at effort "none", so `summary` is accepted."""

    effort: ReasoningEffort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: Name | None = None


class StreamOptions(RequestStruct):
    include_obfuscation: bool | None = None
    """Accepted; events are never padded."""


class ResponseRequest(RequestStruct):
    model: Name
    input: str | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_INPUT_ITEMS)]
    instructions: Instructions | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    stream: bool | None = None
    store: bool | None = None
    """Unset or null: true (OpenAI's default)."""
    background: bool | None = None
    previous_response_id: Name | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    metadata: Metadata | None = None
    user: Name | None = None
    include: Annotated[list[Includable], Meta(max_length=MAX_INCLUDES)] | None = None
    service_tier: Name | None = None
    """Accepted for client compatibility: this server has one tier."""
    truncation: Literal["auto", "disabled"] | None = None
    """"auto": an input past the model's context drops the conversation's oldest items (responses_truncation.py);
    unset, null or "disabled": it is a 400."""
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    """The most function calls the answer keeps (its first ones; chat.Tally)."""
    reasoning: ReasoningOptions | None = None
    top_logprobs: TopLogprobs | None = None
    """Only 0 (chat.check_unserved)."""
    stream_options: StreamOptions | None = None
    """Only with `stream: true`."""
    # Accepted with no effect, as OpenAI reads them for a model without the feature (chat_schemas.py), and echoed.
    prompt_cache_key: Name | None = None
    prompt_cache_retention: CacheRetention | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    """Accepted with no effect, but `prewarm` (chat.check_prewarm); not echoed."""
    safety_identifier: Name | None = None
    conversation: Name | dict[str, Any] | None = None
    """A conversation's id, or {"id": ...}: its items go first, this response's join it (api/conversations.py)."""
    # OpenAI's, for features this server does not have: read only to be refused by name unless null or empty
    # (responses_inputs.NOT_SERVED).
    prompt: dict[str, Any] | None = None
    context_management: list[Any] | None = None
    logit_bias: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


# ---- answers ---------------------------------------------------------------------


class OutputText(Struct, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class MessageItem(Struct, tag_field="type", tag="message"):
    id: str
    status: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"


class FunctionCallItem(Struct, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


OutputItem = MessageItem | FunctionCallItem


class TokenDetails(Struct, frozen=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokenDetails(Struct, frozen=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: TokenDetails = TokenDetails()
    output_tokens_details: OutputTokenDetails = OutputTokenDetails()


class IncompleteDetails(Struct):
    reason: str


class ResponseError(Struct):
    code: str
    message: str


class ReasoningEcho(Struct, frozen=True):
    """A response's `reasoning`: what OpenAI shows for a model that does not reason."""

    effort: str | None = None
    summary: str | None = None


class ConversationRef(Struct):
    id: str


class Response(Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict[str, str] = {}
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    user: str | None = None
    background: bool = False
    truncation: Literal["auto", "disabled"] = "disabled"
    completed_at: int | None = None
    """When it completed (status `completed` only, as OpenAI sets it)."""
    service_tier: Literal["default"] = "default"
    """The tier that served it, as OpenAI says it: this server has one."""
    reasoning: ReasoningEcho = ReasoningEcho()
    top_logprobs: int = 0
    max_tool_calls: int | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    conversation: ConversationRef | None = None
    """The conversation it ran in (its items and the answer's were added to it)."""


class ResponseDeleted(Struct):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class InputItemList(Struct):
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool = False
    object: Literal["list"] = "list"


# ---- stream events (each with its place in the stream) ------------------------------


class _Event(Struct, kw_only=True, tag_field="type"):
    sequence_number: int


class ResponseCreated(_Event, tag="response.created"):
    response: Response


class ResponseQueued(_Event, tag="response.queued"):
    response: Response


class ResponseInProgress(_Event, tag="response.in_progress"):
    response: Response


class ResponseCompleted(_Event, tag="response.completed"):
    response: Response


class ResponseIncomplete(_Event, tag="response.incomplete"):
    response: Response


class ResponseFailed(_Event, tag="response.failed"):
    """A stream's end when its response failed (or, in the background, was cancelled: `response.status` says
    which)."""

    response: Response


class OutputItemAdded(_Event, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done"):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(_Event, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(_Event, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_Event, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class FunctionCallArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event, tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    name: str
    arguments: str


StreamEvent = (ResponseCreated | ResponseQueued | ResponseInProgress | ResponseCompleted | ResponseIncomplete
               | ResponseFailed | OutputItemAdded
               | OutputItemDone | ContentPartAdded | ContentPartDone | OutputTextDelta | OutputTextDone
               | FunctionCallArgumentsDelta | FunctionCallArgumentsDone)
