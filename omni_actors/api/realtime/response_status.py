"""What a Realtime response reports beside its output: usage, failure details, rate limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_actors.api.errors import from_exception
from omni_actors.orchestrator.core import Orchestrator

AUDIO_TOKENS_PER_S = 10
"""Usage estimate for audio: tokens per second (the pipeline reports no token counts)."""


def rate_limits(orch: Orchestrator) -> list[dict[str, Any]]:
    """Room left in the entry stage's queue: what a client can still ask of the pipeline now."""
    entry = orch.statistics().stages[0]
    return [{"name": "requests", "limit": entry.queue_limit,
             "remaining": max(0, entry.queue_limit - entry.in_flight), "reset_seconds": 0.0}]


def failed(code: str, message: str, kind: str = "server_error") -> dict[str, Any]:
    """status_details of a failed response; `kind` is the OpenAI error type (the REST routes' for
    the same error: a request a stage refused is the client's `invalid_request_error`)."""
    return {"type": "failed", "error": {"type": kind, "code": code, "message": message}}


def rest_failure(err: BaseException) -> dict[str, Any]:
    """status_details of a response failed by `err`, with the type and code REST answers it with
    (api/errors.py from_exception: a stage's refusal is invalid_request_error / rejected_by_stage)."""
    api = from_exception(err)
    return failed(api.code or "server_error", api.message if api.status < 500 else str(err), api.type)


@dataclass
class Usage:
    input_text: int = 0
    input_audio: int = 0
    output_text: int = 0
    output_audio: int = 0
    prompt_tokens: int | None = None
    """The text stage's own count of its prompt, when it reports one: it replaces the estimate."""

    def render(self) -> dict[str, Any]:
        text_in, audio_in = self.input_text, self.input_audio
        if self.prompt_tokens is not None:
            audio_in = min(audio_in, self.prompt_tokens)
            text_in = self.prompt_tokens - audio_in
        i, o = text_in + audio_in, self.output_text + self.output_audio
        return {"total_tokens": i + o, "input_tokens": i, "output_tokens": o,
                "input_token_details": {"text_tokens": text_in, "audio_tokens": audio_in,
                                        "cached_tokens": 0},
                "output_token_details": {"text_tokens": self.output_text, "audio_tokens": self.output_audio}}
