"""Function calling on a vLLM LLM stage (the `llm` pipeline, Hermes parser) end to end.

A tiny random model writes no valid call, so this proves the path around the
parser (tests/workers/test_tool_calls.py reads calls from text): the request's
tools reach the chat template (the prompt grows by the rendered schemas), and
an answer without a call keeps OpenAI's shapes through the unmodified SDK,
whole and streamed (the text held back, then sent once it was read).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from omni_actors.models.tiny.llama import make_tiny_llama
from tests.api.conftest import Server, serve

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
GREEDY = {"temperature": 0.0, "max_tokens": 6, "seed": 1}


@pytest.fixture(scope="module")
async def srv(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    model: Path = make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1}}]
    async with serve("llm", model=str(model), stages=stages) as server:
        yield server


async def test_tools_reach_the_template_and_a_plain_answer_keeps_its_shape(srv: Server) -> None:
    client = srv.client()
    plain = await client.chat.completions.create(model="llm", messages=MSG, **GREEDY)
    offered = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], **GREEDY)
    hidden = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], tool_choice="none",
                                                  **GREEDY)
    # the schemas were rendered into the prompt ("none" keeps them from the model)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens == hidden.usage.prompt_tokens
    choice = offered.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length"), choice
    assert isinstance(choice.message.content, str) and choice.message.content


async def test_streamed_answer_with_tools_sends_its_text_once_read(srv: Server) -> None:
    client = srv.client()
    whole = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], **GREEDY)
    stream = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], stream=True, **GREEDY)
    chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.tool_calls is None for d in deltas)
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


async def test_a_tool_result_goes_back_to_the_model(srv: Server) -> None:
    """The SDK's second turn: the assistant's call and the tool's answer are accepted and reach the prompt."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turn = [*MSG, {"role": "assistant", "content": None, "tool_calls": [call]}]
    client = srv.client()
    without = await client.chat.completions.create(model="llm", messages=turn, tools=[WEATHER], **GREEDY)
    answered = await client.chat.completions.create(
        model="llm", messages=[*turn, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees C"}],
        tools=[WEATHER], **GREEDY)
    assert answered.usage.prompt_tokens > without.usage.prompt_tokens
    assert answered.choices[0].finish_reason in ("stop", "length", "tool_calls")
