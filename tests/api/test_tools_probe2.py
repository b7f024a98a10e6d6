"""Calls the model writes itself (tool_choice "auto"), as a demanding OpenAI client reads them.

The tiny llama is scripted (models/tiny/llama.py `reply`) to answer every prompt with a sentence
and two Hermes calls, the first in pieces: `parallel_tool_calls: false` keeps the first call only,
whole, streamed (the SDK's stream helpers) and in the Responses API; and an answer cut by max_tokens
inside a call is that call as far as it came, the same whole and streamed, never the call's markup
as content.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm")

from omni_actors.models.tiny.llama import make_tiny_llama
from tests.api.conftest import Server, serve

PIECES = ("Sure.", "<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}', "</tool_call>",
          '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
"""The scripted answer in tokens: prose, a call over four of them, a second call in one."""
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": {arg: {"type": "string"}}}}} for name, arg in (("get_weather", "city"),
                                                                                 ("get_time", "zone"))]
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture(scope="module")
async def srv(tmp_path_factory: pytest.TempPathFactory, vllm_cache: Path) -> AsyncIterator[Server]:
    model = make_tiny_llama(tmp_path_factory.mktemp("two-calls"), seed=0, reply=PIECES)
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve("llm", model=str(model), stages=stages) as server:
        yield server


def calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


async def test_parallel_tool_calls_false_keeps_the_first_call(srv: Server) -> None:
    client = srv.client()
    fields = {"model": "llm", "messages": MSG, "tools": TOOLS, "max_tokens": 40}
    both = (await client.chat.completions.create(**fields)).choices[0].message
    assert calls(both) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]  # (the script)
    one = (await client.chat.completions.create(**fields, parallel_tool_calls=False)).choices[0]
    assert one.finish_reason == "tool_calls" and calls(one.message) == calls(both)[:1], one
    async with client.chat.completions.stream(**fields, parallel_tool_calls=False) as stream:
        deltas = [tc async for e in stream if e.type == "chunk" and e.chunk.choices
                  for tc in e.chunk.choices[0].delta.tool_calls or ()]
        final = (await stream.get_final_completion()).choices[0]
    assert {d.index for d in deltas} == {0} and calls(final.message) == calls(both)[:1], deltas
    assert [d.id for d in deltas if d.id] == [final.message.tool_calls[0].id]  # (its id once, first)
    answer = await client.responses.create(model="llm", input="Weather?", tools=FLAT, max_output_tokens=40,
                                           parallel_tool_calls=False)
    assert [(o.type, getattr(o, "name", None)) for o in answer.output] == [
        ("message", None), ("function_call", "get_weather")], answer.output
    async with client.responses.stream(model="llm", input="Weather?", tools=FLAT, max_output_tokens=40,
                                       parallel_tool_calls=False) as stream:
        added = [e.item.type async for e in stream if e.type == "response.output_item.added"]
        streamed = await stream.get_final_response()
    assert added == ["message", "function_call"] and streamed.output[1].name == "get_weather", streamed.output


async def test_a_call_cut_by_max_tokens_is_the_call_as_far_as_it_came(srv: Server) -> None:
    """4 tokens: the prose, the call's start, its name, the start of its arguments. Whole and streamed
    alike: content the prose only, the call with its arguments cut where the tokens ended, finish
    length (the Responses API: `incomplete`, the message and the call)."""
    client = srv.client()
    fields = {"model": "llm", "messages": MSG, "tools": TOOLS, "max_tokens": 4}
    whole = (await client.chat.completions.create(**fields)).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("length", "Sure."), whole
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith('{"city":'), call
    stream = await client.chat.completions.create(**fields, stream=True)
    chunks = [c.choices[0] async for c in stream if c.choices]
    assert "".join(c.delta.content or "" for c in chunks) == "Sure.", chunks  # (no `<tool_call>` markup)
    pieces = [tc for c in chunks for tc in c.delta.tool_calls or ()]
    assert [p.function.name for p in pieces if p.function.name] == ["get_weather"], pieces
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].finish_reason == "length"
    cut = await client.responses.create(model="llm", input="Weather?", tools=FLAT, max_output_tokens=4)
    assert cut.status == "incomplete" and cut.output_text == "Sure.", cut
    assert [o.name for o in cut.output if o.type == "function_call"] == ["get_weather"], cut.output


async def test_a_malformed_tool_result_pairing_fails_before_the_model_runs(srv: Server) -> None:
    """The script's calls sent back with one result missing: a 400 naming the assistant message's calls."""
    client = srv.client()
    asked = (await client.chat.completions.create(model="llm", messages=MSG, tools=TOOLS,
                                                  max_tokens=40)).choices[0].message
    first = {"role": "tool", "tool_call_id": asked.tool_calls[0].id, "content": "Sunny"}
    turn = [*MSG, asked.model_dump(exclude_none=True), first, {"role": "user", "content": "and?"}]
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="llm", messages=turn, tools=TOOLS, max_tokens=2)
    assert info.value.body["param"] == "messages[1].tool_calls", info.value.body
    assert asked.tool_calls[1].id in info.value.body["message"]
