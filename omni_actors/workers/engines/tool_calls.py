"""Reading function calls out of an LLM stage's finished text with one of vLLM's tool parsers.

    parser = ToolCallReader("hermes", tokenizer)      # a name vLLM's ToolParserManager knows
    content, calls = parser.read(text, tools)         # calls: [{"id", "name", "arguments"}]

The parser name is the stage's `StageSpec.tool_parser` (the model's format: "hermes",
"pythonic", "llama3_json", ...). It runs in the worker, next to the tokenizer the
parsers need, once per finished request that declared tools. Calls leave as plain
dicts (msgpack on the bus, no vLLM types); `arguments` is a JSON string, as in
OpenAI's `tool_calls[].function.arguments`. Text the parser cannot read as a call
is content: a model that writes no valid call gives `(text, [])`.

While the answer streams, `reader.shown(tools)` gives a `ShownText`: each delta in, the part of
the text that is surely not a call out (the parser's own streaming reading, which holds back
whatever could begin a call), so an answer with tools offered still streams its prose, and the
pieces of calls as the parser sees them (`parts`: a call's index, id and name first, then its
arguments' text), which chat streams as OpenAI's `delta.tool_calls`.

`forced_calls(text)` reads an answer decoded under a forced `tool_choice`'s schema (a JSON
list of {"name", "parameters"}, api/structured.py) into the same call dicts.
"""

from __future__ import annotations

import json
import re
import uuid
from types import SimpleNamespace
from typing import Any

from omni_actors import logs

log = logs.get(__name__)


class ToolCallReader:
    """One vLLM tool parser class bound to a tokenizer; `read` is stateless per call."""

    def __init__(self, parser: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            self._cls = ToolParserManager.get_tool_parser(parser)
        except KeyError as exc:
            raise ValueError(f"unknown tool parser {parser!r}; vLLM has {ToolParserManager.list_registered()}") \
                from exc
        self._tokenizer = tokenizer
        try:  # a parser whose marker tokens this tokenizer lacks fails here, when the stage starts
            self._cls(tokenizer)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"tool parser {parser!r} does not fit this model's tokenizer: {exc}") from exc

    def shown(self, tools: list[dict[str, Any]]) -> ShownText:
        """A fresh streaming reader for one answer to a request declaring `tools`."""
        return ShownText(self._cls(self._tokenizer), _request(tools))

    def read(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, str]]]:
        """(content outside the calls or None, the calls) of a finished answer to a request declaring `tools`."""
        # A fresh parser per answer: vLLM's parsers keep streaming state on the instance.
        parser = self._cls(self._tokenizer)
        try:
            info = parser.extract_tool_calls(text, _request(tools))
        except Exception as exc:  # a third-party parser on model text: one answer's problem, never the engine's
            log.warning("tool_calls.unreadable", error=type(exc).__name__)
            return text, []
        if not info.tools_called:
            return text, []
        calls = [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
                 for call in info.tool_calls]
        return info.content, calls


def _request(tools: list[dict[str, Any]]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[], model="", tools=tools or None)


class ShownText:
    """One streaming answer through a tool parser's streaming reading: `feed` returns the text that
    may be shown now (never part of a call) and the calls' pieces seen so far. Once the parser sees
    a call begin, no more text is shown; once it fails, nothing more at all: the rest waits for the
    finished answer's `read`, which stays the one word on what is a call."""

    def __init__(self, parser: Any, request: Any) -> None:
        self._parser = parser
        self._request = request
        self._text = ""
        self._ids: list[int] = []
        self.done = False
        """A call began (or the parser failed): no more text is shown."""
        self.failed = False

    def feed(self, delta: str, delta_ids: list[int]) -> tuple[str, list[dict[str, Any]]]:
        """(text to show now, the calls' new pieces: {"index", and "id"/"name"/"arguments" as they come})."""
        if self.failed or not (delta or delta_ids):
            return "", []
        before, before_ids = self._text, self._ids
        self._text, self._ids = before + delta, before_ids + list(delta_ids)
        try:
            msg = self._parser.extract_tool_calls_streaming(
                before, self._text, delta, before_ids, self._ids, list(delta_ids), self._request
            )
            parts = [_part(tc) for tc in (msg.tool_calls if msg is not None else None) or ()]
        except Exception as exc:  # a third-party parser on model text: hold the rest for `read`
            log.warning("tool_calls.stream_unreadable", error=type(exc).__name__)
            self.done = self.failed = True
            return "", []
        shown = "" if msg is None or self.done else msg.content or ""
        self.done = self.done or bool(parts)
        return shown, [p for p in parts if len(p) > 1]


def _part(call: Any) -> dict[str, Any]:
    fn = call.function
    fn = fn if fn is None or not isinstance(fn, dict) else SimpleNamespace(**fn)
    part: dict[str, Any] = {"index": int(call.index)}
    if call.id:
        part["id"] = str(call.id)
    if fn is not None and getattr(fn, "name", None):
        part["name"] = str(fn.name)
    if fn is not None and getattr(fn, "arguments", None):
        part["arguments"] = str(fn.arguments)
    return part


def forced_calls(text: str, cut: bool = False) -> list[dict[str, str]] | None:
    """The calls of an answer whose decoding a forced `tool_choice` guided; None when it does not
    parse. `cut` (max_tokens ended it): the calls as far as they came, the last one's arguments
    cut where the tokens ended, as OpenAI answers (finish_reason "length"); [] before a first name."""
    try:
        items = json.loads(text)
    except ValueError:
        return _cut_calls(text) if cut else None
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "name": i["name"],
             "arguments": json.dumps(i.get("parameters", {}), ensure_ascii=False)} for i in items]


_CALL_HEAD = re.compile(r'\s*,?\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"parameters"\s*:\s*')
"""One item of the forced schema's list up to its arguments: `{"name": "f", "parameters": `."""
_ITEM_END = re.compile(r"\s*\}")


def _cut_calls(text: str) -> list[dict[str, str]]:
    """A forced answer's calls up to where max_tokens cut it (see forced_calls)."""
    body = text.lstrip()
    if not body.startswith("["):
        return []
    decoder, calls, pos = json.JSONDecoder(), [], 1
    while (head := _CALL_HEAD.match(body, pos)) is not None:
        name = json.loads(f'"{head.group(1)}"')
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        try:
            args, end = decoder.raw_decode(body, head.end())
        except ValueError:  # the cut is inside these arguments: they go as far as they came
            calls.append({"id": call_id, "name": name, "arguments": body[head.end():]})
            break
        calls.append({"id": call_id, "name": name, "arguments": json.dumps(args, ensure_ascii=False)})
        closed = _ITEM_END.match(body, end)
        if closed is None:
            break
        pos = closed.end()
    return calls
