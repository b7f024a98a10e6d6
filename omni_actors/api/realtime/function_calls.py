"""Realtime function calling: the tools a response shows the model, its calls as `function_call` items.

    inputs["tools"] = shown_tools(opts.tools, opts.tool_choice)   # None: no tools shown
    forced = forced_call(tools, tool_choice, "response.")   # structured_outputs forcing a call; None: none
    messages = conversation_messages(...)  (responses.build_request) # function items as chat writes them
    calls = CallItems(host, response_id, in_conversation, output)   # output: the response's items, in order
    await calls.read(out.tool_parts)          # each streamed text output's pieces of calls
    await calls.finish(final_calls)           # the answer ended: the finished reading's word
    await calls.close_open()                  # it ended otherwise: calls still open are incomplete

The pipeline reads calls as chat does (api/tools.py): the stage writing the text
answer shows the tools to its chat template, and while the answer streams its tool
parser's streaming reading shows the prose that is surely no call (the response sends
it as it comes) and the calls' pieces (`TextOutput.tool_parts`). A call becomes an output
item of type `function_call` (`name`, `call_id`) as soon as the parser reads its name:
`response.output_item.added` (status in_progress) and, in the conversation,
`conversation.item.created`; its arguments follow as `response.function_call_arguments.delta`
events as the model writes them. When the answer ends, the parser reads it whole and that
reading is the word on what was called: each streamed call gets `.done` (the streamed
arguments where the reading says the same, else the reading's, logged) and
`response.output_item.done`; a call the stream did not read is sent whole (`added`, its
arguments as one delta, `.done`, `output_item.done`); a streamed call the reading lacks (or an
answer cut short) ends `incomplete`, and is no call in the next request. The ids sent in
`added` are the ones kept. The client runs the function and sends a `function_call_output`
item with the same `call_id`; the next response's request carries both, as an assistant
message with `tool_calls` and a `tool` message.

`tool_choice` "required" or {"type": "function", "name"} forces a call as chat's does
(api/structured.py): the stage's decoding is guided to a call in the tools' schemas, answered
as calls (whole: a forced answer is read when it ends). A choice no offered tool meets (an
unknown name, "required" without tools) is an `error` event at the session.update or
response.create that makes it, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from omni_actors.api.errors import ApiError
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import Conversation, Item, new_id, render_item
from omni_actors.api.structured import forced_tool_calls
from omni_actors.api.tools import StreamedCalls, chat_shaped, chat_shaped_choice, stage_tools
from omni_actors.orchestrator.outputs import ToolCallOutput, ToolCallPart


class Host(Protocol):
    conversation: Conversation
    dialect: ev.Dialect

    async def send(self, event: ev.ServerEvent) -> None: ...


def shown_tools(tools: tuple[ce.FunctionTool, ...], tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools the text stage is shown, in chat's shape (api/tools.py; none for "none")."""
    return stage_tools(chat_shaped(tools), tool_choice)


def forced_call(tools: tuple[ce.FunctionTool, ...], tool_choice: Any, prefix: str) -> dict[str, Any] | None:
    """The `structured_outputs` that force the call `tool_choice` demands (None: it demands none);
    a BadEvent naming `prefix` + the field for a choice no offered tool meets.

    Only where api/tools.py lets the pipeline force calls (`tools_refusal(..., can_force=True)`
    refuses demands elsewhere). Realtime names a function flat, {"type": "function", "name"};
    chat nests it in `function`, so chat's `tool_choice.function.name` is realtime's `tool_choice.name`.
    """
    if isinstance(tool_choice, dict):
        name = tool_choice.get("name")
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise ce.BadEvent('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                              param=prefix + "tool_choice")
    try:
        # (realtime has no parallel_tool_calls setting)
        return forced_tool_calls(chat_shaped(tools), chat_shaped_choice(tool_choice), None)
    except ApiError as err:
        chat_param = err.param or "tool_choice"
        param = prefix + chat_param.replace("tool_choice.function.", "tool_choice.")
        raise ce.BadEvent(err.message.replace(chat_param, param), code=err.code or "invalid_value",
                          param=param) from None


def add_function_item(messages: list[dict[str, Any]], item: Item) -> None:
    """A function_call item joins the assistant message of the calls before it (chat's `tool_calls`);
    a function_call_output item is a `tool` message answering its `call_id`. A call left incomplete
    (its answer was cut short) is none."""
    if item.type == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output or ""})
        return
    if item.status == "incomplete":
        return
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments or ""}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


@dataclass
class _Open:
    """A function_call item sent and not closed yet: the response's output `index`, the item it follows
    in the conversation (`prev`)."""

    item: Item
    index: int
    prev: str | None


class CallItems:
    """One response's function_call items, appended to its `output` (the items in output order, which
    the response's message item shares): added as they are read, closed when the answer ends."""

    def __init__(self, host: Host, response_id: str, in_conversation: bool, output: list[Item]) -> None:
        self.host = host
        self.response_id = response_id
        self.in_conversation = in_conversation
        self.output = output
        self.seen = StreamedCalls()
        """The streamed calls' names and arguments, checked against the finished reading."""
        self.streamed: dict[int, _Open] = {}
        """By the call's index in the answer: the streamed calls not closed yet."""

    async def read(self, parts: tuple[ToolCallPart, ...]) -> None:
        """A streamed text output's pieces of calls: a call's item is added when its id and name are
        read, then its arguments go out as they come."""
        for p in parts:
            call = self.streamed.get(p.index)
            if call is None:
                if p.id is None or p.name is None:
                    continue  # (a piece of a call whose start was not read: the end sends that call whole)
                call = self.streamed[p.index] = await self._add(p.id, p.name)
            self.seen.add((p,))
            if p.arguments:
                call.item.arguments = (call.item.arguments or "") + p.arguments
                await self.host.send(ev.FunctionCallArgumentsDelta(**self._ids(call), delta=p.arguments))

    async def finish(self, final: tuple[ToolCallOutput, ...]) -> None:
        """The answer ended and was read for calls (`final`, the reading's word): each streamed call it
        confirms is done as streamed, one it reads otherwise is done as read, the calls not streamed
        are sent whole, and a streamed call it lacks ends incomplete."""
        confirmed = self.seen.confirmed(final)
        for i, c in enumerate(final):
            call = self.streamed.pop(i, None)
            if call is None:
                call = await self._add(c.id, c.name)
                call.item.arguments = c.arguments
                await self.host.send(ev.FunctionCallArgumentsDelta(**self._ids(call), delta=c.arguments))
            elif i not in confirmed:
                call.item.name, call.item.arguments = c.name, c.arguments
            await self._close(call, "completed")
        await self.close_open()

    async def close_open(self) -> None:
        """The calls still open end incomplete (the answer was cut short, or its reading lacks them)."""
        while self.streamed:
            await self._close(self.streamed.pop(next(iter(self.streamed))), "incomplete")

    def _ids(self, call: _Open) -> dict[str, Any]:
        return {"response_id": self.response_id, "item_id": call.item.id, "output_index": call.index,
                "call_id": call.item.call_id}

    async def _add(self, call_id: str, name: str) -> _Open:
        """A new function_call item (no arguments yet), added to the output (and conversation)."""
        item = Item(id=new_id("item"), role=None, type="function_call", status="in_progress",
                    call_id=call_id, name=name, arguments="")
        h = self.host
        call = _Open(item, len(self.output), None)
        self.output.append(item)
        await h.send(ev.OutputItemAdded(response_id=self.response_id, output_index=call.index,
                                        item=render_item(item, h.dialect)))
        if self.in_conversation:
            call.prev = h.conversation.add(item)
            await h.send(ev.ItemCreated(previous_item_id=call.prev, item=render_item(item, h.dialect)))
        return call

    async def _close(self, call: _Open, status: str) -> None:
        h, item = self.host, call.item
        if status == "completed":
            await h.send(ev.FunctionCallArgumentsDone(**self._ids(call), name=item.name or "",
                                                      arguments=item.arguments or ""))
        item.status = status
        rendered = render_item(item, h.dialect)
        await h.send(ev.OutputItemDone(response_id=self.response_id, output_index=call.index, item=rendered))
        if h.dialect == "ga" and self.in_conversation:
            await h.send(ev.ItemDone(previous_item_id=call.prev, item=rendered))
