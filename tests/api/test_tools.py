"""Function calling where the model cannot call tools: refused by name, never silently ignored.

The synthetic pipeline's text stage names no tool parser, so `tools` (or a
`tool_choice` that demands a call) is a 400 naming the field over REST (the
unmodified openai SDK) and an `error` event naming it in realtime, the session
kept. Nothing reaches the pipeline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import openai
import pytest

from omni_actors.api.tools import tool_parser
from omni_actors.config.pipeline import get_pipeline, pipeline_names
from tests.api.conftest import post
from tests.api.realtime.conftest import STAGES, RtServer, connect, serve_rt

MSG = [{"role": "user", "content": "a b"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RT_WEATHER = {"type": "function", "name": "get_weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[RtServer]:
    async with serve_rt("synthetic", stages=STAGES) as server:
        yield server


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"tools": [WEATHER]}, "tools", id="tools"),
    pytest.param({"tools": [WEATHER], "tool_choice": "auto", "stream": True}, "tools", id="tools-streamed"),
    pytest.param({"tool_choice": "required"}, "tool_choice", id="required-without-tools"),
    pytest.param({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
                 id="named-function"),
])
async def test_chat_tools_are_refused_by_name(srv: RtServer, fields: dict[str, Any], param: str) -> None:
    before = srv.orch.statistics().requests_total
    with pytest.raises(openai.BadRequestError) as info:
        await srv.client().chat.completions.create(model="synthetic", messages=MSG, **fields)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param, err
    assert "cannot call tools" in err["message"] and f"`{param}`" in err["message"], err
    assert srv.orch.statistics().requests_total == before


@pytest.mark.parametrize(("tool", "param"), [
    pytest.param({"type": "function"}, "tools[0].function", id="no-function"),
    pytest.param({"type": "function", "function": {"name": "get weather!"}}, "tools[0].function.name", id="bad-name"),
    pytest.param({"type": "retrieval", "function": {"name": "f"}}, "tools[0].type", id="not-a-function"),
])
async def test_a_malformed_tool_is_named(srv: RtServer, tool: dict[str, Any], param: str) -> None:
    status, body = await post(srv, "/v1/chat/completions", {"model": "synthetic", "messages": MSG, "tools": [tool]})
    assert status == 400 and body["error"]["param"] == param, body


async def test_chat_without_a_call_still_answers(srv: RtServer) -> None:
    """`tool_choice` "none" (or "auto" with no tools) asks for no call: an ordinary answer."""
    client = srv.client()
    for choice in ("none", "auto"):
        out = await client.chat.completions.create(model="synthetic", messages=MSG, tool_choice=choice,
                                                   max_tokens=2)
        assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("event", "fields", "param"), [
    pytest.param("session.update", {"session": {"tools": [RT_WEATHER]}}, "session.tools", id="session-tools"),
    pytest.param("session.update", {"session": {"tool_choice": "required"}}, "session.tool_choice",
                 id="session-required"),
    pytest.param("response.create", {"response": {"tools": [RT_WEATHER], "modalities": ["text"]}},
                 "response.tools", id="response-tools"),
])
async def test_realtime_tools_are_refused_and_the_session_lives(srv: RtServer, event: str, fields: dict[str, Any],
                                                                param: str) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        eid = await c.send(event, **fields)
        err = (await c.until("error"))[-1]["error"]
        assert (err["type"], err["param"], err["event_id"]) == ("invalid_request_error", param, eid), err
        assert "cannot call tools" in err["message"], err
        # the session lives on, its tools unchanged, and answers
        await c.send("session.update", session={"tools": [], "tool_choice": "auto", "instructions": "hi"})
        session = (await c.until("session.updated"))[-1]["session"]
        assert session["tools"] == [] and session["instructions"] == "hi", session
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
        await c.send("response.create", response={"modalities": ["text"], "max_response_output_tokens": 2})
        assert (await c.until("response.done"))[-1]["response"]["status"] in ("completed", "incomplete")
        await c.ws.close()


def test_every_declared_tool_parser_is_one_vllm_has() -> None:
    pytest.importorskip("vllm")
    from vllm.tool_parsers import ToolParserManager

    declared = {name: tool_parser(get_pipeline(name)) for name in pipeline_names()}
    assert declared["llm"] == "hermes" and declared["synthetic"] is None
    known = set(ToolParserManager.list_registered())
    assert {p for p in declared.values() if p} <= known, declared


async def test_a_read_call_is_answered_in_openai_shapes() -> None:
    """A stage's last output carrying calls becomes `message.tool_calls`, as the SDK's own model parses it."""
    from openai.types.chat import ChatCompletion as SdkCompletion

    from omni_actors.api.chat import Tally, _message
    from omni_actors.api.chat_schemas import ChatCompletion, Choice, Usage
    from omni_actors.orchestrator.outputs import to_final

    tally = Tally()
    tally.add_text(to_final("text", {"text": "<tool_call>...", "token_ids": [1, 2], "finish_reason": "stop",
                                     "tool_calls": [{"id": "call_7", "name": "get_weather",
                                                     "arguments": '{"city": "Paris"}'}], "content": None}))
    body = ChatCompletion(id="c", created=0, model="llm", usage=Usage(1, 2, 3),
                          choices=[Choice(0, await _message(tally, None), tally.finish_reason)])
    sdk = SdkCompletion.model_validate_json(msgspec.json.encode(body))
    choice = sdk.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == ("call_7", "get_weather", '{"city": "Paris"}')


def test_streamed_calls_are_checked_against_the_finished_reading() -> None:
    """The finished reading is the word on what was called: a streamed call it reads the same (as JSON)
    is confirmed, one it names or fills otherwise (or lacks) is not, and `rest` gives only the calls
    the stream did not send."""
    from omni_actors.api.tools import StreamedCalls
    from omni_actors.orchestrator.outputs import ToolCallOutput, ToolCallPart

    seen = StreamedCalls()
    seen.add((ToolCallPart(0, "call_a", "get_weather", '{"city":'), ToolCallPart(0, arguments=' "Paris"}'),
              ToolCallPart(1, "call_b", "get_weather", '{"city": "Rome"}'), ToolCallPart(2, "call_c", "f", "{}")))
    final = (ToolCallOutput("a", "get_weather", '{"city":"Paris"}'),
             ToolCallOutput("b", "get_weather", '{"city": "Oslo"}'),
             ToolCallOutput("c", "g", "{}"), ToolCallOutput("d", "get_time", "{}"))
    assert seen.confirmed(final) == {0}
    assert seen.confirmed(final[:1]) == {0}  # (the reading lacks calls 1 and 2)
    assert [(d.index, d.id, d.function.name) for d in seen.rest(final)] == [(3, "d", "get_time")]
    assert [d.index for d in StreamedCalls().rest(final)] == [0, 1, 2, 3]


def test_one_outputs_call_pieces_are_one_entry_per_call_in_a_chunk() -> None:
    """An engine step can read a call's id and name and its arguments at once (a parser's pieces of one
    output); the chunk carries each call once, pieces joined, as OpenAI does: the SDK's chunk type reads
    it, and a client taking each chunk's list as it is sees one call, not a nameless second one."""
    from openai.types.chat import ChatCompletionChunk

    from omni_actors.api.tools import delta_tool_parts
    from omni_actors.orchestrator.outputs import ToolCallPart

    parts = (ToolCallPart(0, "call_a", "get_weather"), ToolCallPart(0, arguments='{"city": '),
             ToolCallPart(0, arguments='"Paris"}'), ToolCallPart(1, "call_b", "get_time", ""))
    deltas = delta_tool_parts(parts)
    chunk = ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "llm",
        "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": msgspec.to_builtins(deltas)}}]})
    calls = chunk.choices[0].delta.tool_calls
    assert [(c.index, c.id, c.type, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_a", "function", "get_weather", '{"city": "Paris"}'), (1, "call_b", "function", "get_time", "")]
    later = delta_tool_parts((ToolCallPart(0, arguments="}"),))  # a later chunk's piece: no id, no type
    assert msgspec.to_builtins(later) == [{"index": 0, "function": {"arguments": "}"}}]
