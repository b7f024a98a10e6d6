"""Stored chat completions (`store=True`) through the unmodified openai SDK against a real server: retrieve,
update, list (paging, order, metadata and model filters), messages, delete, a streamed answer kept whole,
nothing kept without `store` or for an aborted or failed completion, and the store across a restart.

The synthetic text stage answers with the words of the last message, one per token. Each test tags its
completions with its own metadata so the lists it reads hold only its own.
"""

from __future__ import annotations

import base64
import contextlib
import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import Server, eventually, idle, make_deploy, serve_deploy

KEY = "chat-store-test-key"
STEP_MS = 1
"""The text stage's time a token: a long answer is still running when its client leaves."""
LONG_TOKENS = 3000
FAILING_STEP_MS = 20
"""A failing stage's time a token: its first words go out before the token it fails at."""
MAX_PROMPT_CHARS = 400
"""A longer prompt fails (context_length_exceeded): a completion that fails before its answer."""
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
         "RU5ErkJggg==")
"""A 1x1 PNG."""


@contextlib.asynccontextmanager
async def serve_with_store(data: Path) -> AsyncIterator[Server]:
    """The synthetic pipeline with its stored state under `data` (a server's data directory)."""
    deploy = make_deploy("synthetic", server={"api_keys": [KEY]}, stages=[
        {"stage_id": 0, "engine_extras": {"step_delay_ms": STEP_MS, "max_prompt_chars": MAX_PROMPT_CHARS}}])
    async with serve_deploy(deploy, KEY, data) as srv:
        yield srv
        await eventually(lambda: idle(srv.orch))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-data")


@pytest.fixture(scope="module")
async def srv(data: Path) -> AsyncIterator[Server]:
    async with serve_with_store(data) as s:
        yield s


@pytest.fixture
def client(srv: Server) -> AsyncOpenAI:
    return srv.client()


def silence_wav() -> bytes:
    """A tenth of a second of 16 kHz silence as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 1600)
    return out.getvalue()


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def test_a_stored_completion_is_retrieved_updated_and_deleted(client: AsyncOpenAI) -> None:
    made = await client.chat.completions.create(model="synthetic", messages=ask("red green"), max_tokens=2, n=2,
                                                store=True, metadata={"test": "crud", "k": "v"})
    got = await client.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.model == "synthetic" and got.created == made.created
    assert [c.message.content for c in got.choices] == [c.message.content for c in made.choices] == ["red green"] * 2
    assert got.usage == made.usage and got.metadata == {"test": "crud", "k": "v"}  # (an extra field of the SDK's)
    updated = await client.chat.completions.update(made.id, metadata={"test": "crud", "k": "w"})
    assert updated.id == made.id and updated.metadata == {"test": "crud", "k": "w"}
    assert (await client.chat.completions.retrieve(made.id)).metadata == {"test": "crud", "k": "w"}
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.update(made.id, metadata={f"k{i}": "v" for i in range(17)})
    assert bad.value.body["param"] == "metadata"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.update(made.id, metadata={"k": "v" * 513})
    assert bad.value.body["param"].startswith("metadata")
    deleted = await client.chat.completions.delete(made.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "chat.completion.deleted", True)
    for read in (client.chat.completions.retrieve(made.id), client.chat.completions.delete(made.id),
                 client.chat.completions.update(made.id, metadata={}), client.chat.completions.messages.list(made.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            await read
        assert missing.value.body["code"] == "not_found" and made.id in missing.value.body["message"]


async def test_metadata_past_the_limits_is_a_400_naming_it_at_create(client: AsyncOpenAI) -> None:
    # (a NUL in a key or value: before 2026-12-05 stored, then never matched by a list's filter)
    for metadata in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k\x00": "v"}, {"k0": "a\x00b"}):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="synthetic", messages=ask("x"), max_tokens=1, store=True,
                                                 metadata=metadata)
        assert bad.value.body["param"].startswith("metadata"), bad.value.body
    assert not (await client.chat.completions.list(metadata={"k0": "v"})).data


async def test_without_store_nothing_is_kept(client: AsyncOpenAI) -> None:
    for store in ({}, {"store": False}, {"store": None}):
        made = await client.chat.completions.create(model="synthetic", messages=ask("x"), max_tokens=1,
                                                    metadata={"test": "unstored"}, **store)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.retrieve(made.id)
    assert not (await client.chat.completions.list(metadata={"test": "unstored"})).data


async def test_a_streamed_answer_is_stored_whole_with_its_transcript_not_its_audio(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="synthetic", messages=ask("red green blue"), max_tokens=3, stream=True, store=True,
        modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}, metadata={"test": "streamed"})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "red green blue"
    got = await client.chat.completions.retrieve(chunks[0].id)
    message = got.choices[0].message
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert message.content == text and [got.choices[0].finish_reason] == finish
    assert message.audio is not None and message.audio.data == "" and message.audio.transcript
    assert got.usage is not None and got.usage.completion_tokens == 3
    made = await client.chat.completions.create(
        model="synthetic", messages=ask("red"), max_tokens=1, store=True, modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"})
    assert made.choices[0].message.audio.data  # (answered with its audio, stored without it)
    kept = (await client.chat.completions.retrieve(made.id)).choices[0].message.audio
    assert kept.data == "" and kept.id == made.choices[0].message.audio.id
    assert kept.transcript == made.choices[0].message.audio.transcript


async def test_a_list_pages_orders_and_filters(client: AsyncOpenAI) -> None:
    made = [(await client.chat.completions.create(model="synthetic", messages=ask(f"w{i}"), max_tokens=1,
                                                  store=True, metadata={"test": "list", "i": str(i % 2)})).id
            for i in range(5)]
    tag = {"test": "list"}
    page = await client.chat.completions.list(metadata=tag, limit=2)
    assert [c.id for c in page.data] == made[:2] and page.has_more  # (oldest first: OpenAI's default order)
    assert [c.id async for c in client.chat.completions.list(metadata=tag, limit=2)] == made  # (the SDK pages)
    assert [c.id async for c in client.chat.completions.list(metadata=tag, order="desc", limit=3)] == made[::-1]
    after = await client.chat.completions.list(metadata=tag, after=made[1], limit=2)
    assert [c.id for c in after.data] == made[2:4]
    odd = await client.chat.completions.list(metadata={"test": "list", "i": "1"})
    assert [c.id for c in odd.data] == [made[1], made[3]] and not odd.has_more
    assert [c.id async for c in client.chat.completions.list(metadata=tag, model="synthetic")] == made
    assert not (await client.chat.completions.list(metadata=tag, model="other")).data
    deleted = []
    async for completion in client.chat.completions.list(metadata=tag, limit=2):  # deleting each, paging on
        await client.chat.completions.delete(completion.id)
        deleted.append(completion.id)
    assert deleted == made and not (await client.chat.completions.list(metadata=tag)).data


@pytest.mark.parametrize(("query", "param"), [("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"),
                                              ("after=chatcmpl-none", "after")])
async def test_a_bad_list_query_is_a_400_naming_it(srv: Server, query: str, param: str) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as bad:
        await client.get(f"/chat/completions?{query}", cast_to=object)
    assert bad.value.body["param"] == param


async def test_the_messages_are_kept_without_media_bytes_and_paged(client: AsyncOpenAI) -> None:
    audio = base64.b64encode(silence_wav()).decode()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": PIXEL}},
                                     {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "red"},
    ]
    made = await client.chat.completions.create(model="synthetic", messages=messages, max_tokens=1, store=True)
    listed = await client.chat.completions.messages.list(made.id)
    assert [m.id for m in listed.data] == [f"{made.id}-{i}" for i in range(4)] and not listed.has_more
    system, user, called, tool = listed.data
    assert (system.role, system.content, system.content_parts) == ("system", "Be brief.", None)
    assert user.content == "look"
    assert [p.type for p in user.content_parts] == ["text", "image_url", "input_audio"]
    assert user.content_parts[1].image_url.url == PIXEL
    assert user.content_parts[2].input_audio == {"format": "wav"}  # (no audio bytes)
    assert called.tool_calls[0].function.name == "f" and tool.tool_call_id == "call_1"
    first = await client.chat.completions.messages.list(made.id, limit=3, order="desc")
    assert [m.id for m in first.data] == [f"{made.id}-{i}" for i in (3, 2, 1)] and first.has_more
    rest = await client.chat.completions.messages.list(made.id, limit=3, order="desc", after=f"{made.id}-1")
    assert [m.id for m in rest.data] == [f"{made.id}-0"] and not rest.has_more
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.messages.list(made.id, after="nope")
    assert bad.value.body["param"] == "after"


async def test_stored_messages_sent_back_are_the_messages_that_were_sent(client: AsyncOpenAI) -> None:
    """The messages list gives each message as OpenAI's does (a tool call with its `type`), so a client that
    sends them again (the SDK's types, less the list's own `id` and `content_parts`) sends what it sent first."""
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    made = await client.chat.completions.create(model="synthetic", messages=messages, max_tokens=1, store=True)
    listed = [m async for m in client.chat.completions.messages.list(made.id)]
    again = [{k: v for k, v in m.model_dump(exclude_none=True).items() if k not in ("id", "content_parts")}
             for m in listed]
    assert again == messages
    second = await client.chat.completions.create(model="synthetic", messages=again, max_tokens=1, store=True)
    assert [m.tool_calls for m in listed] == [m.tool_calls async for m in client.chat.completions.messages.list(
        second.id)]


async def test_an_aborted_or_failed_completion_is_not_stored(srv: Server, client: AsyncOpenAI) -> None:
    tag = {"test": "aborted"}
    stream = await client.chat.completions.create(model="synthetic", messages=ask("a b"), max_tokens=LONG_TOKENS,
                                                  stream=True, store=True, metadata=tag)
    first = await anext(aiter(stream))
    await stream.close()  # the client leaves mid-answer: the run is aborted
    await eventually(lambda: idle(srv.orch))
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.retrieve(first.id)
    for streamed in (False, True):
        with pytest.raises(openai.BadRequestError) as failed:
            await client.chat.completions.create(model="synthetic", messages=ask("x" * (MAX_PROMPT_CHARS + 1)),
                                                 max_tokens=1, stream=streamed, store=True, metadata=tag)
        assert failed.value.body["code"] == "context_length_exceeded"
    assert not (await client.chat.completions.list(metadata=tag)).data


async def test_a_completion_failing_mid_answer_is_not_stored(client: AsyncOpenAI, data: Path) -> None:
    failing = make_deploy("synthetic", server={"api_keys": [KEY]}, stages=[
        {"stage_id": 0, "engine_extras": {"fail_on_chunk": 2, "step_delay_ms": FAILING_STEP_MS}}])
    tag = {"test": "failing"}
    async with serve_deploy(failing, KEY, data) as srv:  # (the same data directory as `client`'s server)
        broken = srv.client()
        seen = []
        with pytest.raises(openai.APIError):  # (in-band once the stream began, else the stream's HTTP status)
            stream = await broken.chat.completions.create(model="synthetic", messages=ask("a b c d"), max_tokens=4,
                                                          stream=True, store=True, metadata=tag)
            async for chunk in stream:
                seen.append(chunk)
        with pytest.raises(openai.InternalServerError):
            await broken.chat.completions.create(model="synthetic", messages=ask("a b c d"), max_tokens=4,
                                                 store=True, metadata=tag)
        await eventually(lambda: idle(srv.orch))
    assert not (await client.chat.completions.list(metadata=tag)).data
    if seen:  # (it failed once its answer had begun, as it mostly does)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.retrieve(seen[0].id)


async def test_stored_completions_survive_a_restart(client: AsyncOpenAI, data: Path) -> None:
    made = await client.chat.completions.create(model="synthetic", messages=ask("alpha beta"), max_tokens=2,
                                                store=True, metadata={"test": "restart"})
    async with serve_with_store(data) as restarted:  # a second server on the same data directory
        again = restarted.client()
        kept = await again.chat.completions.retrieve(made.id)
        assert kept.choices[0].message.content == "alpha beta" and kept.metadata == {"test": "restart"}
        assert [m.content async for m in again.chat.completions.messages.list(made.id)] == ["alpha beta"]
        assert [c.id async for c in again.chat.completions.list(metadata={"test": "restart"})] == [made.id]
        await again.chat.completions.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.retrieve(made.id)


