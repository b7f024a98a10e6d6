"""Function calling as a demanding OpenAI client meets it: cut forced calls, refused tools, paired results.

On the `llm` pipeline (a tiny random Llama on vLLM, Hermes parser, guided decoding), through the
unmodified SDK: a forced call cut by max_tokens before its name is no call and no text (never the
guided JSON), whole, streamed and in the Responses API; tools OpenAI refuses (a name twice, parameters
that are no object's schema, a `strict` schema strict mode refuses, a forced schema the decoder cannot
follow) are 400s naming the tool's field before anything runs; a function without parameters is
forced to `{}`; tool results that answer no open call (or calls left unanswered) are 400s; and the
SDK's stream helpers put a forced call together as the whole answer reads it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

pytest.importorskip("vllm")

from tests.api.conftest import Server, serve

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}
NAMED = {"type": "function", "function": {"name": "forecast"}}


def tool(name: str, parameters: dict[str, Any] | None = CITY, **more: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters, **more}}


@pytest.fixture(scope="module")
async def srv(tiny_model, vllm_cache: Path) -> AsyncIterator[Server]:
    model: Path = tiny_model("llama")
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve("llm", model=str(model), stages=stages) as server:
        yield server


@pytest.mark.parametrize("choice", [NAMED, "required"], ids=["named", "required"])
async def test_a_forced_call_cut_before_its_name_is_no_call_and_no_text(srv: Server, choice: Any) -> None:
    """3 tokens of this model are `[{"`: no name yet. The answer is finish_reason length, no call and
    content null, whole and through the SDK's stream helper; the Responses API answers `incomplete`
    with no items (never the guided JSON as text)."""
    client = srv.client()
    fields = {"model": "llm", "messages": MSG, "tools": [tool("forecast"), tool("alarm")], "tool_choice": choice,
              "max_tokens": 3, "temperature": 0.0}
    whole = (await client.chat.completions.create(**fields)).choices[0]
    assert (whole.finish_reason, whole.message.content, whole.message.tool_calls) == ("length", None, None), whole
    async with client.chat.completions.stream(**fields) as stream:
        kinds = [event.type async for event in stream]
        with pytest.raises(openai.LengthFinishReasonError) as cut_short:  # (the helper's word on a cut answer)
            await stream.get_final_completion()
    final = cut_short.value.completion.choices[0]
    assert (final.finish_reason, final.message.content, final.message.tool_calls) == ("length", None, None), final
    assert "content.delta" not in kinds, kinds
    flat = {"type": "function", "name": "forecast", "parameters": CITY}
    responses_choice = {"type": "function", "name": "forecast"} if choice == NAMED else choice
    cut = await client.responses.create(model="llm", input="Weather?", tools=[flat], tool_choice=responses_choice,
                                        max_output_tokens=3, temperature=0.0)
    assert (cut.status, cut.output, cut.output_text) == ("incomplete", [], ""), cut
    events = [e.type async for e in await client.responses.create(
        model="llm", input="Weather?", tools=[flat], tool_choice=responses_choice, max_output_tokens=3,
        temperature=0.0, stream=True)]
    assert events[-1] == "response.incomplete" and not any("output_text" in e for e in events), events


async def test_a_streamed_forced_call_is_put_together_as_the_answer_reads_it(srv: Server) -> None:
    """What the SDK's `chat.completions.stream()` accumulates: each call's id and type on its first
    delta only, arguments that concatenate to JSON in the strict schema (the SDK parses them), content
    null as in the whole answer; `responses.stream()` likewise."""
    client = srv.client()
    fields = {"model": "llm", "messages": MSG, "tools": [tool("forecast", strict=True), tool("alarm", strict=True)],
              "tool_choice": "required", "max_tokens": 160, "temperature": 0.0}
    whole = (await client.chat.completions.create(**fields)).choices[0]
    async with client.chat.completions.stream(**fields) as stream:
        deltas = [tc async for e in stream if e.type == "chunk" and e.chunk.choices
                  for tc in e.chunk.choices[0].delta.tool_calls or ()]
        final = (await stream.get_final_completion()).choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content is None, final
    firsts = {d.index: d for d in reversed(deltas)}
    assert all((d.id, d.type) == (None, None) for d in deltas if firsts[d.index] is not d), deltas
    assert all(d.id and d.type == "function" and d.function.name for d in firsts.values()), deltas
    calls = final.message.tool_calls
    assert [c.id for c in calls] == [firsts[i].id for i in sorted(firsts)]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]  # (greedy)
    assert all(c.function.parsed_arguments["city"] in ("Paris", "Rome") for c in calls), calls
    flat = [{"type": "function", "name": n, "parameters": CITY, "strict": True} for n in ("forecast", "alarm")]
    async with client.responses.stream(model="llm", input="Weather?", tools=flat, tool_choice="required",
                                       parallel_tool_calls=False, max_output_tokens=160, temperature=0.0) as stream:
        added = [e.item.arguments async for e in stream if e.type == "response.output_item.added"]
        response = await stream.get_final_response()
    (call,) = response.output  # (parallel_tool_calls false: one call)
    assert added == [""] and call.type == "function_call" and json.loads(call.arguments) == call.parsed_arguments


@pytest.mark.parametrize(("tools", "choice", "param", "says"), [
    pytest.param([tool("forecast"), tool("forecast")], "auto", "tools[1].function.name", "unique", id="same-name"),
    pytest.param([tool("f", {"type": "string"})], "auto", "tools[0].function.parameters", "type: \"object\"",
                 id="not-an-object"),
    pytest.param([tool("a"), tool("f", {"type": "object", "properties": {"x": {"type": "string"}},
                                        "required": ["x"]}, strict=True)],
                 "auto", "tools[1].function.parameters", "'additionalProperties' is required", id="strict-open"),
    pytest.param([tool("f", {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {
        "x": {"type": "string"}, "y": {"type": "string"}}}, strict=True)],
                 "auto", "tools[0].function.parameters", "Missing 'y'", id="strict-optional"),
    pytest.param([tool("f", {"type": "object", "additionalProperties": False, "required": ["days"], "properties": {
        "days": {"type": "array", "items": {"type": "object", "properties": {"d": {"type": "integer"}}}}}},
        strict=True)], "auto", "tools[0].function.parameters", "'properties', 'days', 'items'", id="strict-nested"),
    pytest.param([tool("f", {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {
        "x": json.loads('{"type": "array", "items": ' * 40 + '{"type": "object"}' + "}" * 40)}}, strict=True)],
                 "auto", "tools[0].function.parameters", "nested more than", id="strict-too-deep"),
    pytest.param([tool("f", {"type": "object", "properties": {"x": {"type": "string", "pattern": "(("}}})],
                 NAMED | {"function": {"name": "f"}}, "tools[0].function.parameters", "unclosed group",
                 id="forced-schema-the-decoder-refuses"),
    pytest.param([tool("a"), tool("f", {"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})],
                 "required", "tools[1].function.parameters", "/nowhere", id="required-ref-to-nowhere"),
])
async def test_tools_openai_refuses_are_400s_naming_the_tool(srv: Server, tools: list, choice: Any, param: str,
                                                            says: str) -> None:
    before = srv.orch.statistics().requests_total
    with pytest.raises(openai.BadRequestError) as info:
        await srv.client().chat.completions.create(model="llm", messages=MSG, tools=tools, tool_choice=choice,
                                                   max_tokens=4)
    err = info.value.body
    assert err["param"] == param and says in err["message"], err
    flat = [{"type": "function", **t["function"]} for t in tools]
    flat_choice = {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice
    with pytest.raises(openai.BadRequestError) as info:  # the Responses API names its flat tool
        await srv.client().responses.create(model="llm", input="x", tools=flat, tool_choice=flat_choice,
                                            max_output_tokens=4)
    assert info.value.body["param"] == param.replace(".function", ""), info.value.body
    assert srv.orch.statistics().requests_total == before  # refused before anything ran


async def test_a_function_without_parameters_is_forced_to_no_arguments(srv: Server) -> None:
    """OpenAI reads a function without `parameters` as taking none: its forced call's arguments are
    `{}`, not an open object this model fills until max_tokens."""
    out = await srv.client().chat.completions.create(
        model="llm", messages=MSG, tools=[{"type": "function", "function": {"name": "ping"}}], max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "ping"}}, temperature=0.0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("ping", "{}")]


CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "forecast", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "forecast", "arguments": '{"city": "Rome"}'}}]}


def result(call_id: str | None) -> dict[str, Any]:
    return {"role": "tool", "content": "Sunny", **({"tool_call_id": call_id} if call_id else {})}


@pytest.mark.parametrize(("messages", "param"), [
    pytest.param([*MSG, result("call_1")], "messages[1].role", id="no-call-before-it"),
    pytest.param([*MSG, CALLED, result("call_1"), result("call_9")], "messages[3].tool_call_id", id="unknown-id"),
    pytest.param([*MSG, CALLED, result("call_1"), result("call_1")], "messages[3].tool_call_id",
                 id="answered-twice"),
    pytest.param([*MSG, CALLED, result(None)], "messages[2].tool_call_id", id="no-id"),
    pytest.param([*MSG, CALLED, result("call_2"), {"role": "user", "content": "and?"}], "messages[1].tool_calls",
                 id="call-left-unanswered"),
])
async def test_tool_results_must_answer_the_calls_before_them(srv: Server, messages: list, param: str) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="llm", messages=messages, tools=[tool("forecast")], max_tokens=2)
    assert info.value.body["param"] == param, info.value.body
    paired = [*MSG, CALLED, result("call_2"), result("call_1"), {"role": "user", "content": "and?"}]
    ok = await client.chat.completions.create(model="llm", messages=paired, tools=[tool("forecast")], max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


async def test_a_function_call_output_must_answer_a_call(srv: Server) -> None:
    """The Responses API's words for the same: an output whose call_id no call has is a 400 naming its item."""
    flat = {"type": "function", "name": "forecast", "parameters": CITY}
    call = {"type": "function_call", "call_id": "call_1", "name": "forecast", "arguments": '{"city": "Paris"}'}
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="llm", tools=[flat], max_output_tokens=2, input=[
            {"role": "user", "content": "Weather?"}, call,
            {"type": "function_call_output", "call_id": "call_7", "output": "Sunny"}])
    assert info.value.body["param"] == "input[2]" and "call_7" in info.value.body["message"], info.value.body
    ok = await client.responses.create(model="llm", tools=[flat], max_output_tokens=2, input=[
        {"role": "user", "content": "Weather?"}, call, {"type": "function_call_output", "call_id": "call_1",
                                                         "output": "Sunny"}])
    assert ok.status in ("completed", "incomplete")
