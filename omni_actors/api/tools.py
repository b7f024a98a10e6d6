"""Function calling: which pipelines can call tools, refusing `tools` where they cannot, and the calls' shapes.

A pipeline can call tools when the stage that writes its text answer names a tool
parser (`StageSpec.tool_parser`, one of vLLM's: "hermes", "pythonic", ...). That
stage shows the request's tools to its chat template and reads the finished
answer with the parser (workers/engines/tool_calls.py); the last TextOutput
carries the calls, which chat answers as `message.tool_calls` with `finish_reason:
"tool_calls"`. Streamed, the answer goes out as the parser's streaming reading sees it: the
prose it knows is no call (`TextOutput.shown`; only what could begin a call waits, and
`unshown` is what is left of it at the end), and each call's pieces (`TextOutput.tool_parts`)
as `delta.tool_calls`: id and name first, then the arguments' text (the Responses API streams
them the same way, as a `function_call` item and its `function_call_arguments.delta` events, and
so does realtime, api/realtime/function_calls.py). The finished answer's reading stays the word on
what was called: a call the stream did not send goes whole at the end (`StreamedCalls.rest`), and
a streamed call it does not confirm is logged (`StreamedCalls.confirmed`).

Refused with a 400 / realtime `error` naming the field, never silently ignored:
- `tools` (non-empty) where the text stage names no parser;
- a `tool_choice` that demands a call ("required" or a named function), unless the
  caller can force one (`can_force`: chat and realtime) and the text stage guides its
  decoding (api/structured.py forces the call there; realtime through
  api/realtime/function_calls.py). "none" and "auto" are accepted ("none" keeps the tools
  from the model).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgspec

from omni_actors import logs
from omni_actors.api.chat_schemas import (
    ChatTool,
    DeltaFunction,
    DeltaToolCall,
    FunctionCall,
    FunctionDef,
    ToolCall,
)
from omni_actors.api.structured import guided
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.orchestrator.outputs import ToolCallOutput, ToolCallPart

log = logs.get(__name__)

PASSIVE_TOOL_CHOICES = ("none", "auto")
"""`tool_choice` values that never demand a call on their own."""


def tool_parser(pipeline: PipelineConfig) -> str | None:
    """The tool parser of the stage writing the pipeline's text answer; None: it cannot call tools."""
    for spec in pipeline.stages:
        if spec.final_output and spec.final_output_type == "text" and spec.tool_parser:
            return spec.tool_parser
    return None


def tools_refusal(pipeline: PipelineConfig, tools: Any, tool_choice: Any, prefix: str = "",
                  can_force: bool = False) -> tuple[str, str] | None:
    """(message, param) when the request asks for tools this pipeline cannot call, else None.

    `tools`/`tool_choice` are the client's values (None or msgspec UNSET when absent);
    `prefix` goes before the field name in `param` (realtime: "session."); `can_force`: the
    caller forces calls by guided decoding where the stage offers it (chat, realtime).
    """
    asks_tools = isinstance(tools, list | tuple) and len(tools) > 0
    demands_call = isinstance(tool_choice, dict) or (
        isinstance(tool_choice, str) and tool_choice not in PASSIVE_TOOL_CHOICES)
    if asks_tools and tool_parser(pipeline) is None:
        return (f"model {pipeline.name!r} cannot call tools here (its text stage has no tool parser); "
                "send the request without `tools`", prefix + "tools")
    if demands_call and not (can_force and tool_parser(pipeline) is not None and guided(pipeline)):
        return (f"model {pipeline.name!r} cannot call tools on demand (forcing a call is not offered): "
                "`tool_choice` must be 'auto' or 'none'", prefix + "tool_choice")
    return None


def chat_shaped(tools: Iterable[Any]) -> list[ChatTool]:
    """Flat function tools ({name, description, parameters}: realtime's, the Responses API's) in
    chat's shape (a `function` wrapper), which the checks and the stage read."""
    return [ChatTool(type="function", function=FunctionDef(
        name=t.name, description=t.description, parameters=t.parameters, strict=getattr(t, "strict", None)))
        for t in tools]


def chat_shaped_choice(choice: Any) -> Any:
    """A flat named `tool_choice` ({"type": "function", "name"}) in chat's shape; other values as they are."""
    if isinstance(choice, dict) and "function" not in choice and isinstance(choice.get("name"), str):
        return {"type": choice.get("type"), "function": {"name": choice["name"]}}
    return choice


def stage_tools(tools: list[ChatTool] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools the text stage is shown, as OpenAI writes them (none for `tool_choice` "none")."""
    return msgspec.to_builtins(tools) if tools and tool_choice != "none" else None


def message_tool_calls(calls: tuple[ToolCallOutput, ...]) -> list[ToolCall]:
    return [ToolCall(c.id, FunctionCall(c.name, c.arguments)) for c in calls]


def delta_tool_calls(calls: tuple[ToolCallOutput, ...]) -> list[DeltaToolCall]:
    return [DeltaToolCall(i, DeltaFunction(c.name, c.arguments), c.id, "function") for i, c in enumerate(calls)]


def delta_tool_parts(parts: tuple[ToolCallPart, ...]) -> list[DeltaToolCall]:
    return [DeltaToolCall(p.index, DeltaFunction(p.name, p.arguments), p.id, "function" if p.id else None)
            for p in parts]


class StreamedCalls:
    """The calls a stream sent in pieces, checked against the finished answer's reading."""

    def __init__(self) -> None:
        self.calls: dict[int, list[str]] = {}
        """index -> [name, arguments so far]."""

    def add(self, parts: tuple[ToolCallPart, ...]) -> None:
        for p in parts:
            call = self.calls.setdefault(p.index, ["", ""])
            call[0] += p.name or ""
            call[1] += p.arguments or ""

    def rest(self, final: tuple[ToolCallOutput, ...]) -> list[DeltaToolCall]:
        """What of `final` is still to send whole: every call when none was streamed, else the calls
        past those streamed (a streamed call the reading does not confirm stays as sent, logged)."""
        if not self.calls:
            return delta_tool_calls(final)
        self.confirmed(final)
        return [d for d in delta_tool_calls(final) if d.index not in self.calls]

    def confirmed(self, final: tuple[ToolCallOutput, ...]) -> set[int]:
        """The indexes of the streamed calls that the finished reading `final` confirms (the same name,
        the same arguments); one it does not (or lacks) is logged."""
        ok = set()
        for i, (name, args) in self.calls.items():
            c = final[i] if i < len(final) else None
            if c is not None and name == c.name and same_json(args, c.arguments):
                ok.add(i)
            else:
                log.warning("tools.call_stream_differs", index=i, name=name, read=c is not None)
        return ok


def same_json(a: str, b: str) -> bool:
    """Whether two arguments' texts say the same (as JSON where both parse, else as text)."""
    return _json(a) == _json(b)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def unshown(final: str, shown: list[str]) -> str:
    """What of the answer's `final` text a stream has still to send, after the `shown` deltas
    (nothing when the finished reading disagrees with what was shown: that stands)."""
    sent = "".join(shown)
    return final[len(sent):] if final.startswith(sent) else ""
