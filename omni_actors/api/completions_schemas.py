"""Legacy text completions (POST /v1/completions) request and response bodies as msgspec structs.

The request forbids unknown fields and constrains its ranges as chat's does (chat_schemas.py);
`prompt` is one of OpenAI's four shapes (a string, strings, token ids, lists of token ids), read
by `prompts` in completions.py. Responses and stream chunks are OpenAI's `text_completion` shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from omni_actors.api.chat_schemas import StopSequence, StreamOptions, Usage
from omni_actors.api.schemas import (
    INT32_MAX,
    MAX_CHOICES,
    MAX_STOP,
    Name,
    Penalty,
    Probability,
    RequestStruct,
    Seed,
    Temperature,
    TokenCount,
    TopK,
)

__all__ = ["Completion", "CompletionChoice", "CompletionChunk", "CompletionRequest", "Usage"]

TokenId = Annotated[int, Meta(ge=0, le=INT32_MAX)]
MAX_PROMPTS = 64
"""Most prompts one request may batch (each prompt's `n` choices run as their own pipeline requests)."""
DEFAULT_MAX_TOKENS = 16
"""OpenAI's default `max_tokens` for text completions (chat's default is the model's whole budget)."""
MAX_LOGPROBS = 5
"""OpenAI's most `logprobs` for text completions."""

PromptItem = str | TokenId | list[TokenId]
"""One item of a list `prompt`: all strings, all token ids (one prompt) or all lists of ids (several)."""


class CompletionRequest(RequestStruct):
    model: Name
    prompt: str | Annotated[list[PromptItem], Meta(max_length=1 << 20)]
    max_tokens: TokenCount | None = None
    """null reads as OpenAI's default, DEFAULT_MAX_TOKENS."""
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    stop: StopSequence | Annotated[list[StopSequence], Meta(max_length=MAX_STOP)] | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = None
    """null is false, as OpenAI reads it."""
    stream_options: StreamOptions | None = None
    echo: bool | None = None
    """The prompt's text before the completion's (string prompts; token-id prompts are a 400)."""
    user: Name | None = None
    """Accepted, no effect."""
    # Served only at the value that asks for nothing this server lacks; else a 400 naming the field.
    suffix: str | None = None
    """Only null or "": no stage here fills in text between a prompt and a suffix."""
    best_of: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    """Only equal to `n` (or 1): no stage ranks candidates by log-probability."""
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    """The sampled tokens' log-probabilities and this many alternatives each (a vLLM text stage only)."""
    logit_bias: dict[str, Any] | None = None
    """As chat's: applied by a vLLM text stage; elsewhere only null or {}."""
    # vLLM's extra sampling fields, as `vllm bench serve` and vLLM's clients send them in the body.
    top_k: TopK | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None


FinishReason = Literal["stop", "length"]


class CompletionLogprobs(Struct):
    """OpenAI's legacy shape: per token its text, log-probability, likeliest alternatives (text -> logprob)
    and where its text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(Struct):
    text: str
    index: int
    finish_reason: FinishReason | None
    """null on a streamed chunk until the choice's last one."""
    logprobs: CompletionLogprobs | None = None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: None = None
    """Null, as chat's (chat_schemas.py)."""


class CompletionChunk(Struct):
    """A streamed piece: the choices' new text (a choice's last chunk has its finish_reason), or, with
    `stream_options.include_usage`, the last chunk: no choices, the usage."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: None = None
