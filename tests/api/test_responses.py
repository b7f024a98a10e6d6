"""The Responses API on the synthetic pipeline through the unmodified openai SDK: answers, streams,
stored responses across a restart, `previous_response_id`, input items, and 400s naming the field.

The synthetic text stage answers with the words of the last message, one per token (so an
answer says what reached the stage). Guided decoding (JSON formats, forced tool calls) needs a
vLLM stage: tests/api/test_tools_llm.py and tests/models/test_assistant_serving.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from omni_actors.api.responses_schemas import Response
from omni_actors.api.responses_store import RETENTION_S, ResponseStore
from omni_actors.store import Store
from tests.api.conftest import eventually, idle, make_deploy, serve_deploy

KEY = "responses-test-key"


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


async def test_stored_responses_continue_and_survive_a_restart(client: AsyncOpenAI, data: Path) -> None:
    first = await client.responses.create(model="synthetic", input="alpha beta", max_output_tokens=2,
                                          metadata={"case": "restart"})
    again = await client.responses.retrieve(first.id)
    assert again.output_text == first.output_text and again.metadata == {"case": "restart"}
    items = await client.responses.input_items.list(first.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "alpha beta")]
    follow = await client.responses.create(model="synthetic", input=[
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
    pytest.param({"input": "x", "reasoning": {"effort": "high"}}, "reasoning", id="unknown-field"),
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
        store.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)",  # one stored 31 days ago
                      ("resp_old", new.created_at - RETENTION_S - 86400, "m", "{}", "[]", "[]"))
        assert kept.body("resp_old") is not None
        kept.add(new, [], [])
        assert kept.body("resp_old") is None and kept.body("resp_new") is not None
    finally:
        store.close()
