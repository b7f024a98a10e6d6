"""The Responses API on the synthetic pipeline through the unmodified openai SDK: answers, streams,
stored responses across a restart, `previous_response_id`, input items, and 400s naming the field.

The synthetic text stage answers with the words of the last message, one per token (so an
answer says what reached the stage). Guided decoding (JSON formats, forced tool calls) needs a
vLLM stage: tests/api/test_tools_llm.py and tests/models/test_assistant_serving.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import openai.types.responses as sdk
import pydantic
import pytest
from openai import AsyncOpenAI

from omni_actors.api.responses_schemas import Response
from omni_actors.api.responses_store import RETENTION_S, ResponseStore
from omni_actors.store import Store
from tests.api.conftest import eventually, idle, make_deploy, serve_deploy

KEY = "responses-test-key"
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
         "RU5ErkJggg==")
"""A 1x1 PNG."""
BACKGROUND_WAIT_S = 30.0
"""Longest a test waits for a background response to end."""
POLL_S = 0.05
"""Between a test's polls of a background response (as an API client polls)."""
SLOW_STEP_MS = 5
LONG_TOKENS = 4000
"""A background answer that outlasts its test at SLOW_STEP_MS a token (20 s)."""


@contextlib.asynccontextmanager
async def serve_with_store(data: Path) -> AsyncIterator[AsyncOpenAI]:
    """The synthetic pipeline served with its responses stored under `data` (a server's data dir)."""
    async with serve_deploy(make_deploy("synthetic", server={"api_keys": [KEY]}), KEY, data) as srv:
        client = AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=30)
        yield client
        await eventually(lambda: idle(srv.orch))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
async def client(data: Path) -> AsyncIterator[AsyncOpenAI]:
    async with serve_with_store(data) as c:
        yield c


async def test_an_answer_is_a_chat_answer_in_the_responses_shape(client: AsyncOpenAI) -> None:
    chat = await client.chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "red green"}],
                                                max_tokens=2)
    got = await client.responses.create(model="synthetic", input="red green", max_output_tokens=2,
                                        instructions="Be brief.")
    assert got.object == "response" and got.id.startswith("resp_") and got.model == "synthetic"
    assert got.output_text == chat.choices[0].message.content == "red green"
    (item,) = got.output
    assert (item.type, item.role, item.content[0].type) == ("message", "assistant", "output_text")
    assert got.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert got.usage.output_tokens == chat.usage.completion_tokens and got.instructions == "Be brief."
    items = await client.responses.create(model="synthetic", max_output_tokens=1, input=[
        {"role": "user", "content": "ignored"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "blue"}]}])
    assert items.output_text == "blue"  # the last message is what the synthetic stage repeats


async def test_a_stream_builds_the_same_response(client: AsyncOpenAI) -> None:
    whole = await client.responses.create(model="synthetic", input="one two three", max_output_tokens=3)
    events = [e async for e in await client.responses.create(model="synthetic", input="one two three",
                                                              max_output_tokens=3, stream=True)]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 3 and "".join(deltas) == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == whole.output_text == events[-1].response.output_text
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta") < kinds.index(
        "response.output_item.done")
    # the SDK's stream helper rebuilds the response from the events
    async with client.responses.stream(model="synthetic", input="one two three", max_output_tokens=3) as helper:
        texts = [e.delta async for e in helper if e.type == "response.output_text.delta"]
        final = await helper.get_final_response()
    assert "".join(texts) == final.output_text == whole.output_text


async def test_each_streamed_event_is_named_by_its_type(client: AsyncOpenAI) -> None:
    """OpenAI's Responses stream names each event (`event: response.created`): clients that dispatch on
    the SSE event name read it."""
    async with aiohttp.ClientSession() as http, http.post(
            f"{client.base_url}responses", headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "synthetic", "input": "one two", "max_output_tokens": 2, "stream": True}) as resp:
        text = await resp.text()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert len(blocks) >= 5, text
    for block in blocks:
        name, data = block.split("\n")
        assert name == f"event: {json.loads(data.removeprefix('data: '))['type']}", block


async def test_answers_and_events_validate_as_the_sdks_own_types(client: AsyncOpenAI) -> None:
    """Checked, not only built: the SDK constructs its models without validating them, so a field its types
    require (usage.input_tokens_details.cache_write_tokens) could be missing unseen."""
    made = await client.responses.with_raw_response.create(model="synthetic", input="a b", max_output_tokens=3)
    answer = sdk.Response.model_validate(made.http_response.json())
    assert answer.status == "completed" and answer.completed_at is not None and answer.completed_at >= answer.created_at
    got = await client.responses.with_raw_response.retrieve(answer.id)
    assert sdk.Response.model_validate(got.http_response.json()) == answer
    mixed = await client.responses.create(model="synthetic", max_output_tokens=1, input=[
        {"role": "assistant", "content": "yo"}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "out"},
        {"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": PIXEL}]}])
    listed = await client.responses.input_items.with_raw_response.list(mixed.id, order="asc")
    kinds = (sdk.ResponseOutputMessage, sdk.ResponseFunctionToolCallItem, sdk.ResponseFunctionToolCallOutputItem,
             sdk.ResponseInputMessageItem)  # (each item as its own type: the union's errors drown in its others)
    for kind, item in zip(kinds, listed.http_response.json()["data"], strict=True):
        kind.model_validate(item)  # (status, an image's detail, a text's annotations: required there)
    events = pydantic.TypeAdapter(sdk.ResponseStreamEvent)
    async with aiohttp.ClientSession() as http:
        for background in (False, True):
            async with http.post(f"{client.base_url}responses", headers={"Authorization": f"Bearer {KEY}"}, json={
                    "model": "synthetic", "input": "a b", "max_output_tokens": 2, "stream": True,
                    "background": background}) as resp:
                blocks = [b for b in (await resp.text()).split("\n\n") if b.strip()]
            read = [events.validate_json(b.split("data: ", 1)[1]) for b in blocks]
            assert read[-1].type == "response.completed" and read[-1].response.completed_at is not None, read[-1]


async def test_stored_responses_continue_and_survive_a_restart(client: AsyncOpenAI, data: Path) -> None:
    first = await client.responses.create(model="synthetic", input="alpha beta", max_output_tokens=2,
                                          metadata={"case": "restart"})
    again = await client.responses.retrieve(first.id)
    assert again.output_text == first.output_text and again.metadata == {"case": "restart"}
    items = await client.responses.input_items.list(first.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "alpha beta")]
    follow = await client.responses.create(model="synthetic", input=[
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "gamma"}],
        previous_response_id=first.id, max_output_tokens=1)
    assert follow.output_text == "gamma" and follow.previous_response_id == first.id
    unstored = await client.responses.create(model="synthetic", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    async with serve_with_store(data) as restarted:  # a second server on the same data directory
        kept = await restarted.responses.retrieve(first.id)
        assert kept.output_text == first.output_text and kept.status == first.status
        await restarted.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await restarted.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        await client.responses.create(model="synthetic", input="x", previous_response_id=first.id)
    assert gone.value.body["param"] == "previous_response_id"


async def _settled(client: AsyncOpenAI, rid: str) -> Any:
    """The background response once it has ended (polled, as a client of the API does)."""
    found: list[Any] = []

    async def ended() -> bool:
        found[:] = [await client.responses.retrieve(rid)]
        return found[0].status not in ("queued", "in_progress")

    deadline = time.monotonic() + BACKGROUND_WAIT_S
    while not await ended():
        assert time.monotonic() < deadline, f"background response {rid} did not end"
        await asyncio.sleep(POLL_S)
    return found[0]


async def test_a_background_response_is_queued_at_once_and_polled_to_the_same_answer(client: AsyncOpenAI) -> None:
    fore = await client.responses.create(model="synthetic", input="one two three", max_output_tokens=3)
    back = await client.responses.create(model="synthetic", input="one two three", max_output_tokens=3,
                                         background=True)
    assert (back.status, back.background, back.output) == ("queued", True, [])
    done = await _settled(client, back.id)
    assert (done.status, done.output_text, done.background) == (fore.status, fore.output_text, True)
    assert done.usage.output_tokens == fore.usage.output_tokens
    follow = await client.responses.create(model="synthetic", input="four", max_output_tokens=1,
                                           previous_response_id=back.id)  # a finished one continues
    assert follow.output_text == "four"


@contextlib.asynccontextmanager
async def serve_slow(data: Path) -> AsyncIterator[AsyncOpenAI]:
    """The synthetic pipeline with a text stage taking SLOW_STEP_MS a token: a long answer stays running.
    No wait for idle on exit: what a server still runs when it stops is the point."""
    deploy = make_deploy("synthetic", server={"api_keys": [KEY]},
                         stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": SLOW_STEP_MS}}])
    async with serve_deploy(deploy, KEY, data) as srv:
        yield AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=30)


async def test_a_background_response_can_be_cancelled_and_a_failed_one_says_why(data: Path) -> None:
    async with serve_slow(data) as client:
        long = await client.responses.create(model="synthetic", input="a b", max_output_tokens=LONG_TOKENS,
                                             background=True)
        with pytest.raises(openai.BadRequestError) as early:
            await client.responses.create(model="synthetic", input="x", previous_response_id=long.id)
        assert early.value.body["param"] == "previous_response_id"
        cancelled = await client.responses.cancel(long.id)
        assert cancelled.status == "cancelled" and cancelled.error is None
        assert (await client.responses.cancel(long.id)).status == "cancelled"  # again: the same
        assert (await client.responses.retrieve(long.id)).status == "cancelled"
        finished = await client.responses.create(model="synthetic", input="x", max_output_tokens=1)
        with pytest.raises(openai.BadRequestError) as late:
            await client.responses.cancel(finished.id)
        assert late.value.body["param"] == "response_id"
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_missing")
        refused = await client.responses.create(model="synthetic", input="x", max_output_tokens=200_000,
                                                background=True)  # past what the stage makes: refused at add
        failed = await _settled(client, refused.id)
        # the code and words a foreground answer's 400 has (the exception's class name was the code)
        assert failed.status == "failed" and failed.error.code == "invalid_prompt", failed.error  # (the SDK's code)
        assert failed.error.message.startswith("rejected_by_stage: invalid request: "), failed.error


async def test_background_responses_left_by_a_stopped_or_gone_server_read_failed(data: Path) -> None:
    async with serve_slow(data) as first:
        left = await first.responses.create(model="synthetic", input="a b", max_output_tokens=LONG_TOKENS,
                                            background=True)
    async with serve_with_store(data) as again:
        lost = await again.responses.retrieve(left.id)
        assert (lost.status, lost.error.code) == ("failed", "server_error"), lost.error
        assert lost.error.message.startswith("server_stopped: "), lost.error
    gone = subprocess.Popen(["true"])  # a pid that has ended
    gone.wait()
    store = Store(data)
    orphan = Response(id="resp_orphan", created_at=int(time.time()), status="in_progress", model="synthetic",
                      output=[], background=True)
    ResponseStore(store).add(orphan, [], [])
    store.execute("UPDATE responses SET owner_pid = ? WHERE id = ?", (gone.pid, orphan.id))
    store.close()
    async with serve_with_store(data) as third:
        read = await third.responses.retrieve(orphan.id)
        assert (read.status, read.error.code) == ("failed", "server_error"), read.error
        assert read.error.message.startswith("server_stopped: "), read.error


STREAMED_TOKENS = 200
"""A streamed background answer still running when its first reader leaves (1 s at SLOW_STEP_MS)."""
READ_BEFORE_LEAVING = 6
"""Events a first reader takes before it drops the connection (past the first text delta)."""


async def _read(stream: Any, limit: int | None = None) -> list[Any]:
    """Events of an SDK stream (the first `limit`, then the connection is dropped)."""
    got: list[Any] = []
    async with stream:
        async for event in stream:
            got.append(event)
            if limit is not None and len(got) == limit:
                break
    return got


async def test_a_streamed_background_response_goes_on_without_its_reader_and_resumes(data: Path) -> None:
    async with serve_slow(data) as client:
        first = await _read(await client.responses.create(
            model="synthetic", input="a b", max_output_tokens=STREAMED_TOKENS, background=True, stream=True),
            READ_BEFORE_LEAVING)
        assert [e.type for e in first[:3]] == ["response.created", "response.queued", "response.in_progress"]
        assert first[0].response.status == "queued" and first[2].response.status == "in_progress"
        rid, last = first[0].response.id, first[-1].sequence_number
        rest = await _read(await client.responses.retrieve(rid, stream=True, starting_after=last))
        events = first + rest
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type in ("response.completed", "response.incomplete")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = await client.responses.retrieve(rid)
        assert text == final.output_text == events[-1].response.output_text and final.background
        assert final.usage.output_tokens == STREAMED_TOKENS
        again = await _read(await client.responses.retrieve(rid, stream=True))  # ended: replayed from the store
        assert [e.model_dump() for e in again] == [e.model_dump() for e in events]
        async with aiohttp.ClientSession() as http, http.get(  # `stream=True` as Python writes it, by hand
                f"{client.base_url}responses/{rid}?stream=True", headers={"Authorization": f"Bearer {KEY}"}) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream", await resp.text()
    async with serve_with_store(data) as restarted:  # and after a restart
        tail = await _read(await restarted.responses.retrieve(rid, stream=True, starting_after=last))
        assert [e.model_dump() for e in tail] == [e.model_dump() for e in rest]


async def test_a_cancelled_streamed_background_response_ends_its_stream_failed_cancelled(data: Path) -> None:
    async with serve_slow(data) as client:
        head = await _read(await client.responses.create(
            model="synthetic", input="a b", max_output_tokens=LONG_TOKENS, background=True, stream=True), 4)
        rid = head[0].response.id
        reader = asyncio.ensure_future(_read(await client.responses.retrieve(rid, stream=True, starting_after=3)))
        assert (await client.responses.cancel(rid)).status == "cancelled"
        tail = await asyncio.wait_for(reader, BACKGROUND_WAIT_S)
        assert tail[-1].type == "response.failed" and tail[-1].response.status == "cancelled"
        assert [e.sequence_number for e in head + tail] == list(range(len(head) + len(tail)))


async def test_a_streamed_background_response_a_server_stopped_replays_to_its_failure(data: Path) -> None:
    async with serve_slow(data) as client:
        head = await _read(await client.responses.create(
            model="synthetic", input="a b", max_output_tokens=LONG_TOKENS, background=True, stream=True), 4)
    async with serve_with_store(data) as again:
        events = await _read(await again.responses.retrieve(head[0].response.id, stream=True))
    assert [e.model_dump() for e in events[:4]] == [e.model_dump() for e in head]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.failed" and events[-1].response.error.code == "server_error"
    assert events[-1].response.error.message.startswith("server_stopped: "), events[-1].response.error


async def test_streaming_a_response_that_was_not_streamed_in_the_background_is_a_400(client: AsyncOpenAI) -> None:
    fore = await client.responses.create(model="synthetic", input="x", max_output_tokens=1)
    back = await client.responses.create(model="synthetic", input="x", max_output_tokens=1, background=True)
    for rid in (fore.id, back.id):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.retrieve(rid, stream=True)
        assert bad.value.body["param"] == "stream", bad.value.body
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.retrieve(fore.id, stream=True, starting_after=-1)
    assert bad.value.body["param"] == "starting_after", bad.value.body
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_missing", stream=True)


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"input": "x", "background": True, "store": False}, "background", id="background-unstored"),
])
async def test_background_mistakes_are_400s_naming_the_field(client: AsyncOpenAI, fields: dict[str, Any],
                                                             param: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="synthetic", **fields)
    assert bad.value.body["param"] == param, bad.value.body


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", id="item-reference"),
    pytest.param({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
                 "input[0].content[0].file_id", id="image-by-file-id"),
    pytest.param({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
                 "input[0].content[1].image_url", id="remote-image"),
    pytest.param({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id",
                 id="output-without-call-id"),
    pytest.param({"input": [{"content": "x"}]}, "input[0].role", id="message-without-role"),
    pytest.param({"input": "x", "text": {"format": {"type": "json_object"}}}, "text.format.type",
                 id="json-without-guided-decoding"),
    pytest.param({"input": "x", "tool_choice": "required"}, "tool_choice", id="forced-call-without-guided-decoding"),
    pytest.param({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools", id="tools-without-a-parser"),
    pytest.param({"input": "x", "max_output_tokens": 0}, "max_output_tokens", id="no-tokens"),
    pytest.param({"input": "x", "reasoning": {"effort": "high"}}, "reasoning.effort", id="reasoning-effort"),
    pytest.param({"input": "x", "reasoning": {"effort": "none", "budget": 9}}, "reasoning.budget", id="unknown-field"),
    pytest.param({"input": "x", "metadata": {"k" * 65: "v"}}, "metadata", id="metadata-key-too-long"),
])
async def test_mistakes_are_400s_naming_the_field(client: AsyncOpenAI, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="synthetic", **fields)
    assert bad.value.body["param"] == param, bad.value.body


def test_responses_older_than_the_retention_are_dropped_on_the_next_insert(tmp_path: Path) -> None:
    """The table stays bounded without a sweeper: an insert drops what is past RETENTION_S."""
    store = Store(tmp_path)
    try:
        kept = ResponseStore(store)
        new = Response(id="resp_new", created_at=int(time.time()), status="completed", model="m", output=[])
        store.execute("INSERT INTO responses (id, created_at, model, body, conversation, items) "
                      "VALUES (?, ?, ?, ?, ?, ?)",  # one stored 31 days ago
                      ("resp_old", new.created_at - RETENTION_S - 86400, "m", "{}", "[]", "[]"))
        assert kept.body("resp_old") is not None
        kept.add(new, [], [])
        assert kept.body("resp_old") is None and kept.body("resp_new") is not None
    finally:
        store.close()
