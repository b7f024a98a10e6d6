"""An outside user's audit of the stored-state routes' names: an item sent with an empty id is stored under a
new one (so its routes can name it), a response's input items read `include` as a conversation's items do, and
an empty `conversation` on a response is a 400 naming it rather than no conversation at all.

The synthetic pipeline behind a real server, through the unmodified openai SDK (raw HTTP where it would not
send the input)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from tests.api.test_responses import serve_with_store


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AsyncOpenAI]:
    data: Path = tmp_path_factory.mktemp("data")
    async with serve_with_store(data) as c:
        yield c


async def test_an_item_sent_with_an_empty_id_is_stored_under_a_new_one(client: AsyncOpenAI) -> None:
    answer = await client.responses.create(
        model="synthetic", input=[{"type": "message", "role": "user", "content": "alpha", "id": ""}],
        max_output_tokens=1)
    (given,) = (await client.responses.input_items.list(answer.id)).data
    assert given.id.startswith("msg_")
    conv = await client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "beta", "id": ""}])
    added = await client.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "gamma", "id": ""}])
    ids = [i.id for i in await _all(client, conv.id)]
    assert len(ids) == 2 and all(i.startswith("msg_") for i in ids) and added.data[0].id in ids
    for item_id in ids:  # each one can be named: read and deleted
        assert (await client.conversations.items.retrieve(item_id, conversation_id=conv.id)).id == item_id
        await client.conversations.items.delete(item_id, conversation_id=conv.id)
    assert await _all(client, conv.id) == []


async def _all(client: AsyncOpenAI, cid: str) -> list:
    return [i async for i in client.conversations.items.list(cid)]


async def test_a_responses_input_items_read_include_as_a_conversations_items_do(client: AsyncOpenAI) -> None:
    answer = await client.responses.create(model="synthetic", input="delta", max_output_tokens=1)
    page = await client.responses.input_items.list(answer.id, include=["message.input_image.image_url"])
    assert [i.content[0].text for i in page.data] == ["delta"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.input_items.list(answer.id, include=["no.such.field"])  # type: ignore[list-item]
    assert err.value.body["param"] == "include" and err.value.body["code"] == "invalid_value"


@pytest.mark.parametrize("conversation", ["", {"id": ""}, {}])
async def test_an_empty_conversation_is_a_400_naming_it(client: AsyncOpenAI, conversation: object) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model="synthetic", input="x", max_output_tokens=1,
                                      conversation=conversation)  # type: ignore[arg-type]
    assert err.value.body["param"] == "conversation"


async def test_input_items_with_one_id_twice_are_a_400_naming_the_second(client: AsyncOpenAI) -> None:
    """Stored, they would page by `after` ambiguously: the SDK listing them went back to the first and looped."""
    said = [{"type": "message", "role": "user", "content": text, "id": item_id}
            for text, item_id in (("a", "msg_x"), ("b", "msg_y"), ("c", "msg_x"), ("d", "msg_z"))]
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model="synthetic", input=said, max_output_tokens=1)  # type: ignore[arg-type]
    assert (err.value.body["param"], err.value.body["code"]) == ("input[2].id", "invalid_value"), err.value.body
    answer = await client.responses.create(model="synthetic", input=[said[0], said[1], said[3]], max_output_tokens=1)
    listed = [i.id async for i in client.responses.input_items.list(answer.id, limit=1, order="asc")]
    assert listed == ["msg_x", "msg_y", "msg_z"]
