"""Function calling on a vLLM LLM stage (the `llm` pipeline, Hermes parser) end to end.

A tiny random model writes no valid call on its own, so this proves the path around the
parser (tests/workers/test_tool_calls.py reads calls from text): the request's
tools reach the chat template (the prompt grows by the rendered schemas), and
an answer without a call keeps OpenAI's shapes through the unmodified SDK,
whole and streamed (the text held back, then sent once it was read). A forced
`tool_choice` ("required", or a named function) makes even this model call, by
guided decoding: the calls' arguments are in the tool's schema.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm")

from tests.api.conftest import Server, serve

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
GREEDY = {"temperature": 0.0, "max_tokens": 6, "seed": 1}
FORECAST = {"type": "function", "function": {
    "name": "forecast", "description": "Tomorrow's weather",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}
ALARM = {"type": "function", "function": {
    "name": "alarm", "parameters": {"type": "object", "additionalProperties": False, "required": ["on"],
                                    "properties": {"on": {"type": "boolean"}}}}}
FORCED = {"temperature": 0.0, "max_tokens": 160, "seed": 1}
"""Room for the call's JSON in this tiny model's small tokens."""


@pytest.fixture(scope="module")
async def srv(tiny_model, vllm_cache: Path) -> AsyncIterator[Server]:
    model: Path = tiny_model("llama")
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve("llm", model=str(model), stages=stages) as server:
        yield server


async def test_tools_reach_the_template_and_a_plain_answer_keeps_its_shape(srv: Server) -> None:
    client = srv.client()
    model = await client.models.retrieve("llm")
    assert model.features == ["tools", "json_output", "forced_tool_calls"]  # what /v1/models says it serves
    plain = await client.chat.completions.create(model="llm", messages=MSG, **GREEDY)
    offered = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], **GREEDY)
    hidden = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], tool_choice="none",
                                                  **GREEDY)
    # the schemas were rendered into the prompt ("none" keeps them from the model)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens == hidden.usage.prompt_tokens
    choice = offered.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length"), choice
    assert isinstance(choice.message.content, str) and choice.message.content


async def test_a_streamed_answer_with_tools_shows_its_text_as_it_comes(srv: Server) -> None:
    """Tools offered, an answer that calls none streams like any other (the parser's streaming reading
    says each delta is no call), in chat completions and in the Responses API alike."""
    client = srv.client()
    whole = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], **GREEDY)
    stream = await client.chat.completions.create(model="llm", messages=MSG, tools=[WEATHER], stream=True, **GREEDY)
    chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.tool_calls is None for d in deltas)
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    shown = [d.content for d in deltas[1:-1] if d.content]  # (after the role chunk, before the finish chunk)
    assert len(shown) >= 2, deltas  # not one block at the end
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    events = [e async for e in await client.responses.create(
        model="llm", input=MSG[0]["content"], tools=[tool], stream=True, temperature=0.0, max_output_tokens=6)]
    text_deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    (done,) = [e.text for e in events if e.type == "response.output_text.done"]
    assert len(text_deltas) >= 2 and "".join(text_deltas) == done
    assert events[-1].type in ("response.completed", "response.incomplete")


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


async def test_a_forced_tool_choice_makes_a_call_in_the_tools_schema(srv: Server) -> None:
    client = srv.client()
    named = await client.chat.completions.create(
        model="llm", messages=MSG, tools=[ALARM, FORECAST], **FORCED,
        tool_choice={"type": "function", "function": {"name": "forecast"}})
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "forecast" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome") and args["unit"] in ("c", "f") and set(args) == {"city", "unit"}
    required = await client.chat.completions.create(model="llm", messages=MSG, tools=[ALARM, FORECAST], **FORCED,
                                                    tool_choice="required", parallel_tool_calls=False)
    (call,) = required.choices[0].message.tool_calls
    assert call.function.name in ("alarm", "forecast") and isinstance(json.loads(call.function.arguments), dict)
    stream = await client.chat.completions.create(
        model="llm", messages=MSG, tools=[FORECAST], **FORCED, stream=True,
        tool_choice={"type": "function", "function": {"name": "forecast"}})
    chunks = [c async for c in stream if c.choices]
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    assert [tc.function.name for tc in calls] == ["forecast"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert json.loads(calls[0].function.arguments) == args  # greedy: the same call, streamed
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"tools": [FORECAST], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                 "tool_choice.function.name", id="unknown-function"),
    pytest.param({"tool_choice": "required"}, "tool_choice", id="required-without-tools"),
    pytest.param({"tools": [FORECAST], "tool_choice": "required", "response_format": {"type": "json_object"}},
                 "response_format", id="forced-call-and-json-mode"),
])
async def test_forced_tool_choice_mistakes_are_400s(srv: Server, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await srv.client().chat.completions.create(model="llm", messages=MSG, **GREEDY, **fields)
    assert info.value.body["param"] == param, info.value.body


async def test_the_responses_api_forces_a_call_and_takes_its_output_back(srv: Server) -> None:
    """client.responses: a named tool_choice gives a function_call item; its output, sent back with
    previous_response_id, reaches the model's context (the prompt grows by the call and the result)."""
    client = srv.client()
    tool = {"type": "function", **FORECAST["function"]}
    called = await client.responses.create(model="llm", input="Weather in Paris?", tools=[tool],
                                           tool_choice={"type": "function", "name": "forecast"},
                                           temperature=0.0, max_output_tokens=160)
    (call,) = called.output
    assert call.type == "function_call" and call.name == "forecast", called.output
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    events = [e async for e in await client.responses.create(
        model="llm", input="Weather in Paris?", tools=[tool], tool_choice={"type": "function", "name": "forecast"},
        temperature=0.0, max_output_tokens=160, stream=True)]
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.completed", kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert (done.name, done.arguments) == ("forecast", call.arguments)  # greedy: the same call, streamed
    answered = await client.responses.create(
        model="llm", previous_response_id=called.id, tools=[tool], temperature=0.0, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees C"}])
    assert answered.usage.input_tokens > called.usage.input_tokens
    assert answered.output[0].type == "message" and answered.previous_response_id == called.id


async def test_text_parts_read_as_text_and_media_a_text_model_cannot_take_is_a_400(srv: Server) -> None:
    """Content as a list of text parts (as the SDK and the Responses API send it) reaches the text-only
    template as the same string; an image part, which a text-only model cannot take, is a 400 naming messages."""
    client = srv.client()
    plain = await client.chat.completions.create(model="llm", messages=MSG, **GREEDY)
    parts = await client.chat.completions.create(
        model="llm", messages=[{"role": "user", "content": [{"type": "text", "text": MSG[0]["content"]}]}], **GREEDY)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    items = await client.responses.create(model="llm", temperature=0.0, max_output_tokens=6, input=[
        {"role": "user", "content": [{"type": "input_text", "text": MSG[0]["content"]}]}])
    assert items.usage.input_tokens == plain.usage.prompt_tokens
    png = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSu"
           "QmCC")
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="llm", **GREEDY, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": png}}]}])
    assert bad.value.body["param"] == "messages" and "text only" in bad.value.body["message"], bad.value.body
    with pytest.raises(openai.BadRequestError) as bad:  # the same refusal in the Responses API's words
        await client.responses.create(model="llm", max_output_tokens=6, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": png}]}])
    assert bad.value.body["param"] == "input", bad.value.body
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="llm", input="x", text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}})
    assert bad.value.body["param"] == "text.format", bad.value.body


@pytest.mark.parametrize("choice", [{"type": "function"}, {"type": "function", "name": 3}, {"type": "allowed_tools"}])
async def test_a_responses_tool_choice_mistake_is_told_in_the_responses_shape(srv: Server, choice: dict) -> None:
    tool = {"type": "function", **FORECAST["function"]}
    with pytest.raises(openai.BadRequestError) as bad:
        await srv.client().responses.create(model="llm", input="Weather?", tools=[tool], tool_choice=choice,
                                            max_output_tokens=4)
    assert bad.value.body["param"] == "tool_choice", bad.value.body
    assert '{"type": "function", "name": ...}' in bad.value.body["message"], bad.value.body


async def test_a_prompt_past_the_context_is_a_400_naming_messages(srv: Server) -> None:
    """vLLM refuses it by `parameter=input_tokens`: the client's `messages` (`input` on Responses), with
    OpenAI's code for it (the worker types the refusal: bus StageOutput.code)."""
    long = [{"role": "user", "content": "word " * 2000}]  # past max_model_len 512
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().chat.completions.create(model="llm", messages=long, max_tokens=4)
    assert (err.value.body["param"], err.value.body["code"]) == ("messages", "context_length_exceeded"), err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().responses.create(model="llm", input="word " * 2000, max_output_tokens=16)
    assert err.value.body["param"] == "input", err.value.body


async def test_truncation_auto_drops_the_oldest_items_to_fit_the_context(srv: Server) -> None:
    """Responses' `truncation: "auto"` (OpenAI's reading): an input past the context (512; this tiny model's
    "word " is 5 tokens) loses items from the start of its conversation, the previous_response_id chain's
    included, never the instructions, and is answered; unset or "disabled" it stays vLLM's 400."""
    client = srv.client()
    first = await client.responses.create(model="llm", input="word " * 60, max_output_tokens=2, temperature=0.0)
    turn = [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "Hello there."}]  # each turn fits; the two together do not
    asked = {"model": "llm", "input": turn, "previous_response_id": first.id, "max_output_tokens": 2,
             "temperature": 0.0, "instructions": "Be brief."}
    for truncation in ({}, {"truncation": "disabled"}):  # OpenAI's code, and the way out
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(**asked, **truncation)
        assert (err.value.body["param"], err.value.body["code"]) == ("input", "context_length_exceeded"), err.value
        assert 'truncation: "auto"' in err.value.body["message"], err.value.body
    fitted = await client.responses.create(**asked, truncation="auto")
    alone = await client.responses.create(**{**asked, "input": turn[1:], "previous_response_id": None})
    assert fitted.truncation == "auto" and fitted.status in ("completed", "incomplete"), fitted
    assert alone.usage.input_tokens < fitted.usage.input_tokens < 512  # this turn whole, the first one gone
    streamed = [e async for e in await client.responses.create(**asked, truncation="auto", stream=True)]
    assert streamed[-1].type in ("response.completed", "response.incomplete"), streamed[-1]
    assert streamed[-1].response.usage.input_tokens == fitted.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as err:  # the last item alone is past it: nothing left to drop
        await client.responses.create(model="llm", input="word " * 200, max_output_tokens=2, truncation="auto")
    assert (err.value.body["param"], err.value.body["code"]) == ("input", "context_length_exceeded"), err.value


async def test_a_forced_call_cut_by_max_tokens_is_a_call_as_far_as_it_came(srv: Server) -> None:
    """As OpenAI answers it: the call's name, its arguments as far as they came, finish_reason length
    (never the guided JSON as text; this tiny model's tokens are a character or two: 40 pass the name)."""
    cut = await srv.client().chat.completions.create(
        model="llm", messages=MSG, tools=[FORECAST], temperature=0.0, seed=1, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "forecast"}})
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "forecast" and call.function.arguments.startswith("{"), call
