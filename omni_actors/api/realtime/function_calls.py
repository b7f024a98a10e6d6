"""Realtime function calling: the tools a response shows the model, its calls as `function_call` items.

    inputs["tools"] = shown_tools(opts.tools, opts.tool_choice)   # None: no tools shown
    forced = forced_call(tools, tool_choice, "response.")   # structured_outputs forcing a call; None: none
    messages = conversation_messages(...)  (responses.build_request) # function items as chat writes them
    item = await send_call(host, response_id, output_index, call, in_conversation)

The pipeline reads calls as chat does (api/tools.py): the stage writing the text
answer shows the tools to its chat template and reads the finished answer with its
tool parser, so a response that offers tools holds back the text that could be a call
until the answer ends (its prose goes out as it comes) and then sends the rest of the text
and the calls. A call becomes an output item of type
`function_call` (`name`, `call_id`): `response.output_item.added`, the arguments as
one `response.function_call_arguments.delta` (the parser reads the whole answer),
`.done`, `response.output_item.done`. The client runs the function and sends a
`function_call_output` item with the same `call_id`; the next response's request
carries both, as an assistant message with `tool_calls` and a `tool` message.

`tool_choice` "required" or {"type": "function", "name"} forces a call as chat's does
(api/structured.py): the stage's decoding is guided to a call in the tools' schemas, answered
as calls. A choice no offered tool meets (an unknown name, "required" without tools) is an
`error` event at the session.update or response.create that makes it, naming the field.
"""

from __future__ import annotations

from typing import Any, Protocol

from omni_actors.api.errors import ApiError
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import Conversation, Item, new_id, render_item
from omni_actors.api.structured import forced_tool_calls
from omni_actors.api.tools import chat_shaped, chat_shaped_choice, stage_tools
from omni_actors.orchestrator.outputs import ToolCallOutput


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
    a function_call_output item is a `tool` message answering its `call_id`."""
    if item.type == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output or ""})
        return
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments or ""}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


async def send_call(host: Host, response_id: str, index: int, call: ToolCallOutput, in_conversation: bool) -> Item:
    """One call of a finished answer as the response's output item `index`; returns the item."""
    item = Item(id=new_id("item"), role=None, type="function_call", status="in_progress",
                call_id=call.id, name=call.name, arguments="")
    await host.send(ev.OutputItemAdded(response_id=response_id, output_index=index,
                                       item=render_item(item, host.dialect)))
    prev = None
    if in_conversation:
        prev = host.conversation.add(item)
        await host.send(ev.ItemCreated(previous_item_id=prev, item=render_item(item, host.dialect)))
    ids = {"response_id": response_id, "item_id": item.id, "output_index": index, "call_id": call.id}
    await host.send(ev.FunctionCallArgumentsDelta(**ids, delta=call.arguments))
    await host.send(ev.FunctionCallArgumentsDone(**ids, name=call.name, arguments=call.arguments))
    item.arguments, item.status = call.arguments, "completed"
    rendered = render_item(item, host.dialect)
    await host.send(ev.OutputItemDone(response_id=response_id, output_index=index, item=rendered))
    if host.dialect == "ga" and in_conversation:
        await host.send(ev.ItemDone(previous_item_id=prev, item=rendered))
    return item
