"""Realtime function calling on the `llm` pipeline (vLLM, Hermes parser), through the openai SDK's GA client.

A random tiny model never writes a call, so the checkpoint is the tiny llama
scripted to answer every chat prompt with one Hermes call (models/tiny/llama.py,
`reply`): the real template, engine, parser and WebSocket carry it. A second one
answers in pieces (a sentence, then the call over several tokens), so the call streams
as it is read, after the prose. The model's
own prompt-token count (usage) shows what reached its context: the tools, the
call and the client's `function_call_output`. A forced `tool_choice` (a named function)
guides the decoding: the grammar masks the scripted Hermes text, and the model writes a
call in the tool's schema (enum-only, so any sample is a valid call).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

pytest.importorskip("vllm")

from omni_actors.models.tiny.llama import make_tiny_llama
from tests.api.realtime.conftest import RtServer, connect, serve_rt

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PICK = {"type": "function", "name": "pick_city", "description": "Choose a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}}
FORCED_TOKENS = 160
"""Room for the guided call's JSON in this tiny model's small tokens."""
PIECES = ("Let me look that up.", "<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": ',
          '"Paris"}}', "</tool_call>")
"""A scripted answer in tokens: prose, then the call over four of them (its arguments in two)."""
PROSE = PIECES[0]
QUESTION = "What is the weather in Paris?"
RESULT = "Sunny, 21 degrees C"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tool-llama"), seed=0, reply=CALL)


@pytest.fixture(scope="module")
async def srv(model: Path, vllm_cache: Path) -> AsyncIterator[RtServer]:
    async with serve_llm(model, vllm_cache) as server:
        yield server


@pytest.fixture(scope="module")
async def pieces(tmp_path_factory: pytest.TempPathFactory, vllm_cache: Path) -> AsyncIterator[tuple[Path, RtServer]]:
    """The checkpoint answering in PIECES, and its server."""
    model = make_tiny_llama(tmp_path_factory.mktemp("tool-llama-pieces"), seed=0, reply=PIECES)
    async with serve_llm(model, vllm_cache) as server:
        yield model, server


@contextlib.asynccontextmanager
async def serve_llm(model: Path, vllm_cache: Path) -> AsyncIterator[RtServer]:
    """The `llm` pipeline on the scripted checkpoint `model`, behind a real server."""
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve_rt("llm", model=str(model), stages=stages) as server:
        yield server


def prompt_tokens(model: Path, messages: list[dict[str, Any]], tools: bool) -> int:
    """What the text stage's prompt comes to for `messages` (the template, as vLLM tokenizes it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    shown = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}] if tools else None
    text = tok.apply_chat_template(messages, tools=shown, tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def sdk(srv: RtServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=srv.key, base_url=f"{srv.url}/v1", max_retries=0,
                       websocket_base_url=srv.url.replace("http://", "ws://") + "/v1")


async def until_done(conn: Any, type: str = "response.done") -> list[Any]:
    """The SDK connection's events up to and including the first of `type`."""
    events = []
    async for event in conn:
        events.append(event)
        if event.type == type:
            return events
    raise AssertionError(f"the connection closed before {type}")


async def ask_weather(conn: Any) -> list[Any]:
    """A GA session offering WEATHER asked QUESTION: the first response's events."""
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                       "tools": [WEATHER], "tool_choice": "auto"})
    await conn.conversation.item.create(item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
    await conn.response.create()
    return await until_done(conn)


async def test_a_call_is_a_function_call_item_and_its_output_reaches_the_model(srv: RtServer, model: Path) -> None:
    async with sdk(srv).realtime.connect(model="llm") as conn:
        events = await ask_weather(conn)
        kinds = [e.type for e in events]
        (tool,) = next(e for e in events if e.type == "session.updated").session.tools
        assert (tool.type, tool.name, tool.parameters) == ("function", "get_weather", WEATHER["parameters"])
        added = next(e for e in events if e.type == "response.output_item.added")
        assert (added.item.type, added.item.name, added.item.arguments) == ("function_call", "get_weather", "")
        call_id = added.item.call_id
        assert call_id and "response.output_text.delta" not in kinds, kinds
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert json.loads("".join(d.delta for d in deltas)) == json.loads(done.arguments) == {"city": "Paris"}
        assert (done.call_id, done.name, done.item_id) == (call_id, "get_weather", added.item.id)
        assert kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
        response = events[-1].response
        assert response.status == "completed", response
        (item,) = response.output
        assert (item.type, item.call_id, item.name, item.status) == ("function_call", call_id, "get_weather",
                                                                     "completed")
        asked = [{"role": "user", "content": QUESTION}]
        assert response.usage.input_tokens == prompt_tokens(model, asked, tools=True)

        # the client runs the function and answers the call; the next response sees the result
        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call_id,
                                                  "output": RESULT})
        await conn.response.create(response={"tool_choice": "none"})
        events = await until_done(conn)
        response = events[-1].response
        (item,) = response.output
        assert (response.status, item.type, item.role) == ("completed", "message", "assistant"), response
        answered = [*asked, {"role": "assistant", "content": ""}, {"role": "tool", "content": RESULT}]
        assert response.usage.input_tokens == prompt_tokens(model, answered, tools=False)
        assert "response.function_call_arguments.done" not in [e.type for e in events]


async def test_prose_streams_then_the_call_is_added_as_it_is_read(pieces: tuple[Path, RtServer]) -> None:
    """GA client, an answer in pieces: the prose goes out first as text deltas in the message item
    (output 0), the call is added (output 1) while the answer is still being written, its arguments
    follow as several deltas joining to `.done`'s, and the ids sent in `added` are the conversation's:
    retrieved as they were sent, and answered by a function_call_output the next response takes."""
    pieces_model, pieces_srv = pieces
    async with sdk(pieces_srv).realtime.connect(model="llm") as conn:
        events = await ask_weather(conn)
        kinds = [e.type for e in events]
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [(e.output_index, e.item.type) for e in added] == [(0, "message"), (1, "function_call")], added
        call = added[1].item
        assert (call.name, call.status, call.arguments) == ("get_weather", "in_progress", "")
        text = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(text) == PROSE, text
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(deltas) == 2 and "".join(d.delta for d in deltas) == done.arguments, deltas
        assert json.loads(done.arguments) == {"city": "Paris"}
        assert {(e.item_id, e.call_id, e.output_index) for e in [*deltas, done]} == {(call.id, call.call_id, 1)}
        assert kinds.index("response.output_text.delta") < events.index(added[1]) \
            < kinds.index("response.function_call_arguments.delta") < kinds.index("response.function_call_arguments.done")
        (call_done,) = [e for e in events if e.type == "response.output_item.done" and e.output_index == 1]
        assert (call_done.item.id, call_done.item.status, call_done.item.arguments) == (call.id, "completed",
                                                                                        done.arguments)
        assert kinds.index("response.function_call_arguments.done") < events.index(call_done)
        response = events[-1].response
        assert response.status == "completed", response
        message, item = response.output
        assert (message.id, message.content[0].text) == (added[0].item.id, PROSE), message
        assert (item.id, item.call_id, item.arguments, item.status) == (call.id, call.call_id, done.arguments,
                                                                       "completed")

        await conn.conversation.item.retrieve(item_id=call.id)
        kept = (await until_done(conn, "conversation.item.retrieved"))[-1].item
        assert (kept.type, kept.call_id, kept.name, kept.arguments, kept.status) == (
            "function_call", call.call_id, "get_weather", done.arguments, "completed"), kept

        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                  "output": RESULT})
        created = (await until_done(conn, "conversation.item.added"))[-1]
        assert (created.previous_item_id, created.item.call_id) == (call.id, call.call_id), created
        await conn.response.create(response={"tool_choice": "none"})
        events = await until_done(conn)
        response = events[-1].response
        (item,) = response.output
        assert (response.status, item.type) == ("completed", "message"), response
        asked = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": PROSE},
                 {"role": "assistant", "content": ""}, {"role": "tool", "content": RESULT}]
        assert response.usage.input_tokens == prompt_tokens(pieces_model, asked, tools=False)


async def test_a_call_cut_short_ends_incomplete_and_is_no_call_next_time(pieces: tuple[Path, RtServer]) -> None:
    """Raw beta client, the answer cut by max_output_tokens inside its call: the call item added as it
    was read ends `incomplete` without `.done`, the finished reading (no call) makes the answer
    text, and the next request carries no call (its prompt: the question and that text)."""
    pieces_model, pieces_srv = pieces
    async with aiohttp.ClientSession() as http:
        c = await connect(pieces_srv, http, turn_detection=None, modalities=["text"], tools=[WEATHER])
        await c.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await c.send("response.create", response={"max_output_tokens": 4})
        events = await c.until("response.done")
        kinds = [e["type"] for e in events]
        assert "response.function_call_arguments.done" not in kinds and "conversation.item.done" not in kinds
        call = next(e for e in events if e["type"] == "response.output_item.added" and e["output_index"] == 1)
        assert kinds.index("response.text.delta") < events.index(call)
        assert call["item"]["id"] in [e["item"]["id"] for e in events if e["type"] == "conversation.item.created"]
        response = events[-1]["response"]
        assert response["status"] == "incomplete", response
        message, item = response["output"]
        assert (item["id"], item["type"], item["status"]) == (call["item"]["id"], "function_call", "incomplete")
        assert item["arguments"] == '{"city":' and message["content"][0]["text"] == "".join(PIECES[:4]), response
        await c.send("response.create", response={"tool_choice": "none"})
        response = (await c.until("response.done"))[-1]["response"]
        said = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "".join(PIECES[:4]).strip()}]  # (an item's text is stripped)
        assert response["usage"]["input_tokens"] == prompt_tokens(pieces_model, said, tools=False), response
        await c.ws.close()


async def test_a_streamed_chat_answer_sends_its_call_in_openais_pieces(srv: RtServer) -> None:
    """The same scripted call through chat completions: streamed, `delta.tool_calls` pieces (id and
    name first, then the arguments' text) that the SDK's stream helper puts together; whole, the same call."""
    client = sdk(srv)
    tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    asked = {"model": "llm", "messages": [{"role": "user", "content": QUESTION}], "tools": tools, "max_tokens": 8}
    whole = (await client.chat.completions.create(**asked)).choices[0]
    chunks = [c async for c in await client.chat.completions.create(**asked, stream=True) if c.choices]
    parts = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    assert parts and parts[0].id and parts[0].type == "function" and parts[0].function.name == "get_weather"
    assert {p.index for p in parts} == {0} and all(p.id is None for p in parts[1:])
    for c in chunks:  # each call once in a chunk, as OpenAI sends it (its pieces of one step joined)
        indexes = [tc.index for tc in c.choices[0].delta.tool_calls or ()]
        assert len(indexes) == len(set(indexes)), c
    args = "".join(p.function.arguments or "" for p in parts)
    assert json.loads(args) == json.loads(whole.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    async with client.chat.completions.stream(**asked) as stream:
        final = await stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


async def test_a_streamed_response_sends_its_call_as_it_is_read_and_keeps_its_ids(srv: RtServer) -> None:
    """client.responses, streamed: the function_call item is added as the parser reads the call, its
    arguments follow as deltas, and the finished response (and the stored one a follow-up continues
    from) carries the same ids; the call's output, sent back, is taken."""
    client = sdk(srv)
    asked = {"model": "llm", "input": QUESTION, "tools": [WEATHER], "max_output_tokens": 8}
    events = [e async for e in await client.responses.create(**asked, stream=True)]
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.completed", kinds
    added = next(e for e in events if e.type == "response.output_item.added")
    assert (added.item.type, added.item.status, added.item.arguments) == ("function_call", "in_progress", "")
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(deltas) == done.arguments and json.loads(done.arguments) == {"city": "Paris"}
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta") \
        < kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    (item,) = events[-1].response.output
    assert (item.id, item.call_id, item.arguments) == (added.item.id, added.item.call_id, done.arguments)
    answered = await client.responses.create(
        model="llm", previous_response_id=events[-1].response.id, tools=[WEATHER], max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": RESULT}])
    assert answered.previous_response_id == events[-1].response.id and answered.status == "completed"


async def test_response_tools_and_a_bad_function_item_are_answered(srv: RtServer, model: Path) -> None:
    """Tools given on response.create alone are offered to that response; a function_call_output
    without its call_id is an error naming it, and the session lives on (raw beta client)."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, modalities=["text"])
        eid = await c.send("conversation.item.create", item={"type": "function_call_output", "output": RESULT})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("item.call_id", eid), err
        await c.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await c.send("response.create", response={"tools": [WEATHER]})
        events = await c.until("response.done")
        (item,) = events[-1]["response"]["output"]
        assert (item["type"], item["name"], json.loads(item["arguments"])) == ("function_call", "get_weather",
                                                                                {"city": "Paris"})
        assert [e["type"] for e in events if "function_call_arguments" in e["type"]] == [
            "response.function_call_arguments.delta", "response.function_call_arguments.done"]
        # the session itself offers no tools: the next response answers in text
        await c.send("response.create")
        (item,) = (await c.until("response.done"))[-1]["response"]["output"]
        assert item["type"] == "message" and item["content"][0]["text"] == CALL, item
        await c.ws.close()


async def test_a_named_tool_choice_forces_a_call_in_the_tools_schema(srv: RtServer) -> None:
    async with sdk(srv).realtime.connect(model="llm") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER, PICK],
                                           "tool_choice": {"type": "function", "name": "pick_city"}})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await conn.response.create(response={"max_output_tokens": FORCED_TOKENS})
        events = await until_done(conn)
        updated = next(e for e in events if e.type == "session.updated").session
        assert (updated.tool_choice.type, updated.tool_choice.name) == ("function", "pick_city"), updated
        response = events[-1].response
        assert response.status == "completed", response
        (item,) = response.output
        assert (item.type, item.name, item.status) == ("function_call", "pick_city", "completed"), item
        assert json.loads(item.arguments) in ({"city": "Paris"}, {"city": "Rome"}), item.arguments
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert (done.name, done.call_id, done.arguments) == ("pick_city", item.call_id, item.arguments)
        assert "response.output_text.delta" not in [e.type for e in events]


async def test_a_forced_choice_no_tool_meets_is_an_error_and_the_session_lives_on(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, modalities=["text"])
        eid = await c.send("session.update", session={"tools": [PICK],
                                                      "tool_choice": {"type": "function", "name": "nope"}})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("session.tool_choice.name", eid), err
        assert "nope" in err["message"] and "pick_city" in err["message"], err
        eid = await c.send("response.create", response={"tool_choice": "required"})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("response.tool_choice", eid), err
        # nothing of either took: the session offers no tools, and answers in text
        await c.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await c.send("response.create")
        events = await c.until("response.done")
        (item,) = events[-1]["response"]["output"]
        assert item["type"] == "message" and item["content"][0]["text"] == CALL, item
        await c.ws.close()


async def test_a_forced_call_cut_before_it_is_read_sends_no_text(srv: RtServer) -> None:
    # the guided JSON of a call cut by max_output_tokens went out as the answer's text
    async with sdk(srv).realtime.connect(model="llm") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER, PICK],
                                           "tool_choice": {"type": "function", "name": "pick_city"}})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await conn.response.create(response={"max_output_tokens": 2})
        events = await until_done(conn)
        response = events[-1].response
        assert response.status == "incomplete", response
        kinds = [e.type for e in events]
        assert "response.output_text.delta" not in kinds and "response.output_text.done" not in kinds, kinds
        assert all(item.type != "message" for item in response.output), response.output


async def test_tools_openai_refuses_are_errors_naming_them(srv: RtServer) -> None:
    # a name given twice and parameters that are no object's schema were taken (chat and Responses refuse them)
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, modalities=["text"])
        eid = await c.send("session.update", session={"tools": [PICK, PICK]})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("session.tools[1].name", eid), err
        bad = {**PICK, "parameters": {"type": "string"}}
        eid = await c.send("response.create", response={"tools": [bad]})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"], err["code"]) == ("response.tools[0].parameters", eid,
                                                                "invalid_function_parameters"), err
        eid = await c.send("session.update", session={"tools": [PICK]})  # the session goes on
        assert (await c.until("session.updated"))[-1]["session"]["tools"][0]["name"] == "pick_city"
