"""What a chat answer accumulated as its pipeline wrote it (`Tally`): text, audio, transcript, token counts,
tool calls and the tokens' log-probabilities where asked; chat (api/chat.py, api/chat_stream.py) and the Responses API (api/responses_answer.py) read
their answers from it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.api.audio_codec import DEFAULT_SAMPLE_RATE
from omni_actors.api.chat_schemas import ChatAudio, ChoiceLogprobs, ResponseMessage, Usage
from omni_actors.api.chat_schemas import TokenLogprob as ApiTokenLogprob
from omni_actors.api.chat_schemas import TopLogprob as ApiTopLogprob
from omni_actors.api.tools import StreamedCalls, message_tool_calls
from omni_actors.orchestrator.outputs import (
    AudioOutput,
    TextOutput,
    TokenLogprob,
    ToolCallOutput,
    ToolCallPart,
)
from omni_actors.orchestrator.requests import StageChunk

AUDIO_TTL_S = 3600
"""`expires_at` of returned audio: now + this (the server keeps no audio; it is informational)."""


@dataclass
class Tally:
    """What a chat answer accumulated: text, audio, transcript, token counts."""

    text: list[str] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    transcript: list[str] = field(default_factory=list)
    sample_rate: int = DEFAULT_SAMPLE_RATE
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCallOutput, ...] = ()
    tool_content: str | None = None
    forced: bool = False
    """A forced `tool_choice` guided the answer (params["tool_calls_forced"]): its text is the calls' JSON,
    never content, so `content` is null, as in OpenAI's answers that call. Cut by max_tokens before a
    call's name, it answers no call, content null and finish_reason "length": the model wrote no call
    (a made-up one, even of a named function, would have a client run it with arguments that are not
    JSON), and OpenAI shows nothing of what a budget went on before the answer (its reasoning) either."""
    one_call: bool = False
    """`parallel_tool_calls: false` (params["one_tool_call"]): the answer keeps its first call only,
    whole and streamed, however many the parser read (OpenAI makes at most one)."""
    most_calls: int | None = None
    """The Responses API's `max_tool_calls`: the answer keeps its first this many calls, whole and streamed
    (OpenAI ignores any call past it)."""
    parts: tuple[ToolCallPart, ...] = ()
    """The pieces of calls in the last delta added (the first call's only, with `one_call`)."""
    read: StreamedCalls = field(default_factory=StreamedCalls)
    """With tools offered: the calls as the parser read them while the answer was written."""
    shown: list[str] = field(default_factory=list)
    """With tools offered: the text the parser read as no call."""
    logprobs: list[TokenLogprob] | None = None
    """With params["logprobs"]: the answer's tokens so far (their texts joined: `text`); else None."""

    @classmethod
    def of(cls, params: dict[str, Any], most_calls: int | None = None) -> Tally:
        """A tally for an answer to a pipeline call with these params (and `max_tool_calls`)."""
        return cls(forced=bool(params.get("tool_calls_forced")), one_call=bool(params.get("one_tool_call")),
                   most_calls=most_calls, logprobs=[] if params.get("logprobs") is not None else None)

    @property
    def cap(self) -> int | None:
        """Most calls the answer keeps (None: all)."""
        return 1 if self.one_call else self.most_calls

    def add_text(self, out: TextOutput) -> str:
        if not self.forced:
            self.text.append(out.text)
        cap = self.cap
        self.parts = out.tool_parts if cap is None else tuple(p for p in out.tool_parts if p.index < cap)
        self.read.add(self.parts)
        self.shown.append(out.shown)
        if self.logprobs is not None:
            self.logprobs.extend(out.logprobs)
        self.completion_tokens += out.tokens
        if out.prompt_tokens is not None:
            self.prompt_tokens = out.prompt_tokens
        if out.finish_reason == "length":
            self.finish_reason = "length"
        if out.tool_calls:  # (the answer's last delta; see api/tools.py)
            self.tool_calls = out.tool_calls if cap is None else out.tool_calls[:cap]
            self.tool_content = out.content
            self.finish_reason = "length" if out.finish_reason == "length" else "tool_calls"  # (a call cut short)
        elif out.finish_reason == "length" and self.read.calls:
            # Cut by max_tokens inside a call, which the finished reading cannot read: the calls as far as
            # the parser read them, as OpenAI answers a call cut short, and the text before them as content
            # (as streamed), never the call's markup as text.
            self.tool_calls, self.tool_content = self.read.so_far(), "".join(self.shown) or None
        return out.text

    def add_audio(self, out: AudioOutput, keep: bool = True) -> None:
        """Count an audio chunk; `keep` it for the whole-clip answer (streaming sends it on instead)."""
        self.sample_rate = out.sample_rate
        if keep:
            self.audio.append(out.audio)
        if out.transcript is not None:
            self.transcript.append(out.transcript)


def chunk_audio(chunk: StageChunk) -> AudioOutput | None:
    """The chunk's audio, if it carries samples or a transcript piece."""
    out = chunk.output
    return out if isinstance(out, AudioOutput) and (len(out.audio) or out.transcript is not None) else None


def usage_of(tallies: list[Tally]) -> Usage:
    """The prompt counted once, every choice's completion."""
    prompt = tallies[0].prompt_tokens
    completion = sum(t.completion_tokens for t in tallies)
    return Usage(prompt, completion, prompt + completion)


def chat_logprobs(tokens: list[TokenLogprob] | tuple[TokenLogprob, ...] | None) -> ChoiceLogprobs | None:
    """OpenAI's chat `logprobs` of these tokens (None: not asked); `bytes` is each token's text as UTF-8."""
    if tokens is None:
        return None
    return ChoiceLogprobs([ApiTokenLogprob(t.token, t.logprob, list(t.token.encode()),
                                           [ApiTopLogprob(a.token, a.logprob, list(a.token.encode())) for a in t.top])
                           for t in tokens])


def new_audio_id() -> str:
    return f"audio_{uuid.uuid4().hex[:24]}"


def answer_message(tally: Tally, audio: ChatAudio | None) -> ResponseMessage:
    """The assistant message a tally reads as (with its `audio`, made by the caller): its calls where it
    made some, else its text (null where a forced call guided it)."""
    if tally.tool_calls:
        return ResponseMessage(role="assistant", content=tally.tool_content, audio=audio,
                               tool_calls=message_tool_calls(tally.tool_calls))
    return ResponseMessage(role="assistant", content=None if tally.forced else "".join(tally.text), audio=audio)
