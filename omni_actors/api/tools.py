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

As OpenAI refuses them, before anything runs (chat and the Responses API): tools that share a
name, `parameters` that are not an object's schema, a `strict` schema strict mode refuses, a forced
schema the decoder cannot follow (`check_tools`); tool results that answer no open call, and calls
left unanswered before the next message (`check_tool_messages`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable
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
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.structured import call_schema, decoder_refusal, guided
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


async def check_tools(tools: list[ChatTool] | None, tool_choice: Any, field: Callable[[int], str] = lambda i: (
        f"tools[{i}].function")) -> None:
    """400 for tools OpenAI refuses, naming the tool's field (`field(i)`: chat's `tools[i].function`; the
    Responses API's flat `tools[i]`): a name given twice (a call could not say which it means), `parameters`
    that are not an object's schema, a `strict` schema strict mode refuses (every object closed by
    `additionalProperties: false` and `required` listing each property), and, where `tool_choice`
    forces a call by guided decoding, a schema the decoder cannot follow (else the stage's refusal would
    name `response_format`, which the client never sent). The decoder's checks (about half a millisecond a
    schema) run off the loop."""
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools or ()):
        fn = tool.function
        if (first := seen.setdefault(fn.name, i)) != i:
            raise bad_request(f"tools[{first}] and tools[{i}] are both named {fn.name!r}; tool names must be "
                              "unique", f"{field(i)}.name")
        params = fn.parameters or {}
        if "type" in params and params["type"] != "object":
            raise _bad_schema(fn.name, f"schema must be a JSON Schema of 'type: \"object\"', got 'type: "
                              f"{json.dumps(params['type'])}'", field(i))
        if fn.strict and (why := strict_refusal(params, ())) is not None:
            raise _bad_schema(fn.name, why + " (strict mode)", field(i))
    if tool_choice == "required":
        forced = [t.function for t in tools or ()]
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        forced = [t.function for t in tools or () if t.function.name == tool_choice["function"].get("name")]
    else:
        return
    refused = await asyncio.to_thread(_decoder_refusals, [call_schema(fn.parameters) for fn in forced])
    if refused is not None:
        fn = forced[refused[0]]
        raise _bad_schema(fn.name, f"the decoder forcing the call cannot follow it: {refused[1]}",
                          field(seen[fn.name]))


def _decoder_refusals(schemas: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The first of `schemas` the decoder refuses, and why."""
    for n, schema in enumerate(schemas):
        if (why := decoder_refusal(schema)) is not None:
            return n, why
    return None


def _bad_schema(name: str, why: str, where: str) -> ApiError:
    return bad_request(f"Invalid schema for function {name!r}: {why}", f"{where}.parameters",
                       "invalid_function_parameters")


STRICT_MAX_DEPTH = 10
"""OpenAI's strict mode takes schemas up to this many levels of nesting."""


def strict_refusal(schema: Any, context: tuple[str, ...]) -> str | None:
    """Why OpenAI's strict mode refuses `schema` (None: it takes it): each object schema in it must set
    `additionalProperties: false` and list every property in `required`, nested at most STRICT_MAX_DEPTH."""
    if not isinstance(schema, dict):
        return None
    props = _dict(schema.get("properties"))
    if schema.get("type") == "object" or props:
        if schema.get("additionalProperties") is not False:
            return f"In context={context}, 'additionalProperties' is required to be supplied and to be false"
        required = schema.get("required")
        missing = [k for k in props if not isinstance(required, list) or k not in required]
        if missing:
            return (f"In context={context}, 'required' is required to be supplied and to be an array including "
                    f"every key in properties. Missing {missing[0]!r}")
    subschemas = [(("properties", k), v) for k, v in props.items()]
    subschemas += [((key, k), v) for key in ("$defs", "definitions") for k, v in _dict(schema.get(key)).items()]
    subschemas += [((key, str(n)), v) for key in ("anyOf", "allOf", "oneOf")
                   for n, v in enumerate(schema.get(key) if isinstance(schema.get(key), list) else ())]
    if "items" in schema:
        subschemas.append((("items",), schema["items"]))
    for path, sub in subschemas:
        if len(context) >= 2 * STRICT_MAX_DEPTH and isinstance(sub, dict):
            return f"In context={context}, the schema is nested more than {STRICT_MAX_DEPTH} levels deep"
        if (why := strict_refusal(sub, context + path)) is not None:
            return why
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def check_tool_messages(messages: Iterable[Any], param: Callable[[int, str], str] = lambda i, f: (
        f"messages[{i}].{f}")) -> None:
    """400, as OpenAI answers, for a conversation whose calls and results do not pair up: a `tool` message
    that answers no call of the assistant message before it (by `tool_call_id`), or a message after an
    assistant's `tool_calls` while some of them are unanswered. A conversation may end on unanswered
    calls (the model then goes on from its own call). `param(i, field)` names message i's field."""
    asked: dict[str, int] = {}
    """The ids of the last assistant message's calls -> that message's index; answered ones leave."""
    block = False
    """The messages since that assistant message are all its results so far."""
    for i, m in enumerate(messages):
        if m.role == "tool":
            if not block:
                raise bad_request("a tool result answers no call: it must follow an assistant message with "
                                  "`tool_calls` (or a function_call item)", param(i, "role"))
            if m.tool_call_id not in asked:
                raise bad_request(f"a tool result's call id {m.tool_call_id!r} answers none of the calls still "
                                  f"open before it ({sorted(asked)})", param(i, "tool_call_id"))
            del asked[m.tool_call_id]
            continue
        if asked:
            j = next(iter(asked.values()))
            raise bad_request("each call of an assistant message needs its result (a `tool` message or "
                              "function_call_output) before the next message; these calls have none: "
                              f"{', '.join(sorted(asked))}", param(j, "tool_calls"))
        calls = m.tool_calls if m.role == "assistant" else None
        asked, block = {c.id: i for c in calls or ()}, bool(calls)


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
    """One output's call pieces as one chunk's `delta.tool_calls`: each call (index) at most once, its pieces
    joined, as OpenAI sends them (one engine step can read a call's id and name and its arguments; two
    entries of one index in a chunk read as two calls to clients that take each chunk's list as it is)."""
    joined: dict[int, list[str | None]] = {}  # index -> [id, name, arguments], in the order first seen
    for p in parts:
        got = joined.setdefault(p.index, [None, None, None])
        got[0] = got[0] or p.id
        for i, piece in ((1, p.name), (2, p.arguments)):
            if piece is not None:
                got[i] = (got[i] or "") + piece
    return [DeltaToolCall(i, DeltaFunction(name, args), cid, "function" if cid else None)
            for i, (cid, name, args) in joined.items()]


class StreamedCalls:
    """The calls a stream sent in pieces, checked against the finished answer's reading."""

    def __init__(self) -> None:
        self.calls: dict[int, list[str]] = {}
        """index -> [name, arguments so far]."""
        self.ids: dict[int, str] = {}

    def add(self, parts: tuple[ToolCallPart, ...]) -> None:
        for p in parts:
            call = self.calls.setdefault(p.index, ["", ""])
            call[0] += p.name or ""
            call[1] += p.arguments or ""
            if p.id:
                self.ids.setdefault(p.index, p.id)

    def so_far(self) -> tuple[ToolCallOutput, ...]:
        """The calls as far as they were read (an answer cut before its finished reading found them)."""
        return tuple(ToolCallOutput(self.ids.get(i) or f"call_{uuid.uuid4().hex[:24]}", name, args)
                     for i, (name, args) in sorted(self.calls.items()) if name)

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
