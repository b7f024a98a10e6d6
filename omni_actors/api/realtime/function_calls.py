"""Realtime function calling: the tools a response shows the model, its calls as `function_call` items.

    inputs["tools"] = shown_tools(opts.tools, opts.tool_choice)   # None: no tools shown
    messages = conversation_messages(...)  (responses.build_request) # function items as chat writes them
    item = await send_call(host, response_id, output_index, call, in_conversation)

The pipeline reads calls as chat does (api/tools.py): the stage writing the text
answer shows the tools to its chat template and reads the finished answer with its
tool parser, so a response that offers tools holds its text until the answer ends
and then sends either the text or the calls. A call becomes an output item of type
`function_call` (`name`, `call_id`): `response.output_item.added`, the arguments as
one `response.function_call_arguments.delta` (the parser reads the whole answer),
`.done`, `response.output_item.done`. The client runs the function and sends a
`function_call_output` item with the same `call_id`; the next response's request
carries both, as an assistant message with `tool_calls` and a `tool` message.
"""

from __future__ import annotations

from typing import Any, Protocol

from omni_actors.api.chat_schemas import ChatTool, FunctionDef
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import Conversation, Item, new_id, render_item
from omni_actors.api.tools import stage_tools
from omni_actors.orchestrator.outputs import ToolCallOutput


class Host(Protocol):
    conversation: Conversation
    dialect: ev.Dialect

    async def send(self, event: ev.ServerEvent) -> None: ...


def shown_tools(tools: tuple[ce.FunctionTool, ...], tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools the text stage is shown, in chat's shape (api/tools.py; none for "none")."""
    chat = [ChatTool(type="function", function=FunctionDef(name=t.name, description=t.description,
                                                            parameters=t.parameters)) for t in tools]
    return stage_tools(chat, tool_choice)


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
