"""The Conversations API through the unmodified openai SDK on the synthetic pipeline: conversations and their
items (create, retrieve, update, delete, pages), responses run in a conversation (its items first, theirs added
after), OpenAI-style 4xx bodies for bad input and unknown ids, and conversations kept across a restart.

The synthetic text stage answers with the words of the last message; that the conversation's items reach it
shows where a function call's output (the input) needs its call (a conversation item) to be read at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import openai.types.conversations as conv_sdk
import pytest
from openai import AsyncOpenAI

from tests.api.test_responses import PIXEL, _read, _settled, serve_with_store

CALL = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "red green"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
async def client(data: Path) -> AsyncIterator[AsyncOpenAI]:
    async with serve_with_store(data) as c:
        yield c


async def _all(client: AsyncOpenAI, cid: str, **query: Any) -> list[Any]:
    """Every item of a conversation, the SDK paging through them."""
    return [item async for item in client.conversations.items.list(cid, **query)]


async def test_a_conversation_is_created_read_updated_and_deleted(client: AsyncOpenAI) -> None:
    made = await client.conversations.with_raw_response.create(
        items=[{"role": "user", "content": "hello"}], metadata={"topic": "demo"})
    conv = conv_sdk.Conversation.model_validate(made.http_response.json())
    assert (conv.object, conv.metadata) == ("conversation", {"topic": "demo"}) and conv.id.startswith("conv_")
    assert await client.conversations.retrieve(conv.id) == conv
    updated = await client.conversations.update(conv.id, metadata={"topic": "other", "k": "v"})
    assert (updated.id, updated.metadata, updated.created_at) == (conv.id, {"topic": "other", "k": "v"},
                                                                  conv.created_at)
    assert (await client.conversations.retrieve(conv.id)).metadata == {"topic": "other", "k": "v"}
    (item,) = await _all(client, conv.id)
    assert (item.type, item.role, item.content[0].text, item.status) == ("message", "user", "hello", "completed")
    gone = await client.conversations.delete(conv.id)
    assert (gone.id, gone.object, gone.deleted) == (conv.id, "conversation.deleted", True)
    for call in (lambda: client.conversations.retrieve(conv.id), lambda: client.conversations.delete(conv.id),
                 lambda: client.conversations.items.retrieve(item.id, conversation_id=conv.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            await call()
        assert missing.value.body["code"] == "not_found", missing.value.body


async def test_items_are_added_paged_retrieved_and_deleted(client: AsyncOpenAI) -> None:
    conv = await client.conversations.create()
    added = await client.conversations.items.with_raw_response.create(conv.id, items=[
        {"role": "user", "content": [{"type": "input_text", "text": "one"}, {"type": "input_image", "image_url": PIXEL}]},
        {"role": "assistant", "content": "two"}, CALL, RESULT, {"role": "developer", "content": "five"}])
    page = conv_sdk.ConversationItemList.model_validate(added.http_response.json())  # (each item as the SDK's type)
    ids = [i.id for i in page.data]
    assert len(set(ids)) == 5 and (page.first_id, page.last_id, page.has_more) == (ids[0], ids[-1], False)
    assert [i.type for i in page.data] == ["message", "message", "function_call", "function_call_output", "message"]
    newest = await client.conversations.items.list(conv.id, limit=2)
    assert [i.id for i in newest.data] == ids[:2:-1][:2] and newest.has_more and newest.last_id == ids[3]
    assert [i.id for i in await _all(client, conv.id, limit=2)] == ids[::-1]  # desc by default, paged by last_id
    assert [i.id for i in await _all(client, conv.id, limit=2, order="asc")] == ids
    after = await client.conversations.items.list(conv.id, order="asc", after=ids[1], include=[
        "message.input_image.image_url"])
    assert [i.id for i in after.data] == ids[2:] and not after.has_more
    got = await client.conversations.items.retrieve(ids[2], conversation_id=conv.id)
    assert (got.type, got.call_id, got.name) == ("function_call", "call_1", "lookup")
    left = await client.conversations.items.delete(ids[1], conversation_id=conv.id)
    assert (left.object, left.id) == ("conversation", conv.id)
    assert [i.id for i in await _all(client, conv.id, order="asc")] == [ids[0], *ids[2:]]
    still = await client.conversations.items.list(conv.id, order="asc", after=ids[1])  # a deleted item's place
    assert [i.id for i in still.data] == ids[2:]
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.delete(ids[1], conversation_id=conv.id)


async def test_a_response_runs_in_a_conversation_and_its_items_join_it(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):  # alone, a call's output has no call to answer
        await client.responses.create(model="synthetic", input=[RESULT], max_output_tokens=2)
    conv = await client.conversations.create(items=[{"role": "user", "content": "look it up"}, CALL])
    first = await client.responses.create(model="synthetic", input=[RESULT], max_output_tokens=2,
                                          conversation=conv.id)
    assert first.status == "completed" and first.output_text == "red green" and first.conversation.id == conv.id
    listed = await client.conversations.items.with_raw_response.list(conv.id, order="asc")
    items = conv_sdk.ConversationItemList.model_validate(listed.http_response.json()).data  # (the SDK's types)
    assert [i.type for i in items] == ["message", "function_call", "function_call_output", "message"]
    (said,) = first.output
    assert (items[-1].id, items[-1].role, items[-1].content[0].text) == (said.id, "assistant", "red green")
    assert [i.id for i in (await client.responses.input_items.list(first.id)).data] == [items[2].id]
    streamed = await _read(await client.responses.create(
        model="synthetic", input="blue", max_output_tokens=1, conversation={"id": conv.id}, stream=True))
    assert streamed[-1].type == "response.completed" and streamed[-1].response.conversation.id == conv.id
    back = await client.responses.create(model="synthetic", input="black", max_output_tokens=1, conversation=conv.id,
                                         background=True)
    assert (await _settled(client, back.id)).output_text == "black"
    texts = [i.content[0].text for i in await _all(client, conv.id, order="asc") if i.type == "message"]
    assert texts == ["look it up", "red green", "blue", "blue", "black", "black"]


async def test_conversation_mistakes_are_openai_style_4xx(client: AsyncOpenAI) -> None:
    conv = await client.conversations.create()
    with pytest.raises(openai.BadRequestError) as both:
        await client.responses.create(model="synthetic", input="x", conversation=conv.id, previous_response_id="resp_1")
    assert both.value.body["param"] == "conversation", both.value.body
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.create(model="synthetic", input="x", conversation="conv_missing")
    assert (unknown.value.body["param"], unknown.value.body["code"]) == ("conversation", "not_found")
    assert unknown.value.response.json()["error"]["type"] == "invalid_request_error"
    refused: list[tuple[Callable[[], Awaitable[Any]], str]] = [  # (each made as it is tried)
        (lambda: client.conversations.items.create(conv.id, items=[{"type": "item_reference", "id": "msg_1"}]),
         "items[0].type"),
        (lambda: client.conversations.items.create(conv.id, items=[{"type": "web_search_call", "id": "ws_1"}]),
         "items[0].type"),
        (lambda: client.conversations.items.create(conv.id, items=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]), "items[0].content[0].image_url"),
        (lambda: client.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}] * 21), "items"),
        (lambda: client.conversations.items.create(conv.id, items=[]), "items"),
        (lambda: client.conversations.create(metadata={f"k{i}": "v" for i in range(17)}), "metadata"),
        (lambda: client.conversations.create(metadata={"k" * 65: "v"}), "metadata"),
        (lambda: client.conversations.update(conv.id, metadata={"k": "v" * 513}), "metadata[...]"),  # (a value: errors.validation_detail)
        (lambda: client.conversations.items.list(conv.id, limit=0), "limit"),
        (lambda: client.conversations.items.list(conv.id, limit=101), "limit"),
        (lambda: client.conversations.items.list(conv.id, extra_query={"order": "up"}), "order"),
        (lambda: client.conversations.items.list(conv.id, after="msg_missing"), "after"),
        (lambda: client.conversations.items.list(conv.id, extra_query={"include": "everything"}), "include"),
        (lambda: client.responses.create(model="synthetic", input="x", conversation={"id": conv.id, "x": 1}), "conversation"),
    ]
    for call, param in refused:
        with pytest.raises(openai.BadRequestError) as bad:
            await call()
        assert bad.value.body["param"] == param, bad.value.body
        assert bad.value.response.json()["error"]["type"] == "invalid_request_error"
    assert await _all(client, conv.id) == []  # nothing refused was added
    for missing in (lambda: client.conversations.items.list("conv_missing"),
                    lambda: client.conversations.items.create("conv_missing", items=[{"role": "user", "content": "x"}]),
                    lambda: client.conversations.update("conv_missing", metadata={}),
                    lambda: client.conversations.items.retrieve("msg_1", conversation_id=conv.id)):
        with pytest.raises(openai.NotFoundError):
            await missing()


async def test_items_that_would_break_the_conversations_calls_are_refused_when_added(client: AsyncOpenAI) -> None:
    """A call's output that answers no open call (or an item while calls are unanswered) would make every later
    response in the conversation a 400; it is refused when added, naming the item, and nothing is added."""
    conv = await client.conversations.create(items=[{"role": "user", "content": "look it up"}])
    other = {**RESULT, "call_id": "call_2"}
    for items, param in (([RESULT], "items[0]"), ([CALL, other], "items[1].call_id"),
                         ([CALL, {"role": "user", "content": "x"}], "items[0]")):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.conversations.items.create(conv.id, items=items)
        assert (bad.value.body["param"], bad.value.body["type"]) == (param, "invalid_request_error"), bad.value.body
    with pytest.raises(openai.BadRequestError) as lone:
        await client.conversations.create(items=[RESULT])
    assert lone.value.body["param"] == "items[0]", lone.value.body
    assert len(await _all(client, conv.id)) == 1
    await client.conversations.items.create(conv.id, items=[CALL])  # (a conversation may end on an open call)
    with pytest.raises(openai.BadRequestError) as unanswered:  # (its output must come next)
        await client.conversations.items.create(conv.id, items=[{"role": "user", "content": "y"}])
    assert unanswered.value.body["param"] == "items", unanswered.value.body
    await client.conversations.items.create(conv.id, items=[RESULT])  # its output, in a later request
    answer = await client.responses.create(model="synthetic", input="next", max_output_tokens=1, conversation=conv.id)
    assert answer.output_text == "next"


async def test_conversations_survive_a_restart(client: AsyncOpenAI, data: Path) -> None:
    conv = await client.conversations.create(items=[{"role": "user", "content": "alpha"}], metadata={"a": "b"})
    answer = await client.responses.create(model="synthetic", input="beta", max_output_tokens=1, conversation=conv.id)
    before = [i.model_dump() for i in await _all(client, conv.id)]
    async with serve_with_store(data) as restarted:  # a second server on the same data directory
        assert (await restarted.conversations.retrieve(conv.id)).metadata == {"a": "b"}
        assert [i.model_dump() for i in await _all(restarted, conv.id)] == before
        assert (await restarted.conversations.items.retrieve(answer.output[0].id, conversation_id=conv.id)
                ).content[0].text == "beta"
        later = await restarted.responses.create(model="synthetic", input="gamma", max_output_tokens=1,
                                                 conversation=conv.id)
        assert later.output_text == "gamma"
    assert len(await _all(client, conv.id)) == len(before) + 2

