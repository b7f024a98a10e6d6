"""Edges of the Responses API through the unmodified openai SDK: `include`, `truncation`, a response cancelled
or deleted by another server while it runs, chains across a restart, input item paging, and resuming a
stream from any point.

Same servers as tests/api/test_responses.py (the synthetic pipeline; its text stage repeats the last
message's words, one per token).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from omni_actors.api.chat import Tally
from omni_actors.api.responses_truncation import fits_after, without
from omni_actors.orchestrator.outputs import TextOutput, ToolCallOutput, ToolCallPart
from tests.api import test_responses
from tests.api.test_responses import _read, serve_slow, serve_with_store

data, client = test_responses.data, test_responses.client
"""test_responses.py's module fixtures (a data directory, a server storing there), one of each for this module too."""

RUNNING_TOKENS = 1000
"""A background answer still running (5 s at the slow stage's step) when another server cancels or deletes it."""
READ_FIRST = 4
"""Events a reader takes before the other server acts (past `response.in_progress`)."""


async def test_include_is_accepted_and_what_cannot_be_included_is_a_400_naming_it(client: AsyncOpenAI) -> None:
    got = await client.responses.create(model="synthetic", input="a b", max_output_tokens=2,
                                        include=["message.input_image.image_url", "reasoning.encrypted_content"])
    assert got.output_text == "a b" and got.truncation == "disabled"
    fitted = await client.responses.create(model="synthetic", input="a b", max_output_tokens=2, truncation="auto")
    assert (fitted.output_text, fitted.truncation) == ("a b", "auto")  # fits: run as given, the setting said
    assert (await client.responses.retrieve(fitted.id)).truncation == "auto"
    for include, code in ((["message.output_text.logprobs"], "unsupported_value"), (["bogus"], "invalid_value")):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.create(model="synthetic", input="x", include=include)
        assert (bad.value.body["param"], bad.value.body["code"]) == ("include[0]", code), bad.value.body


@contextlib.asynccontextmanager
async def running_in_background(maker: AsyncOpenAI) -> AsyncIterator[tuple[str, list[Any], AsyncIterator[Any]]]:
    """A streamed background response on `maker` that runs on while it is read: (its id, the first
    READ_FIRST events, an iterator over the rest)."""
    stream = await maker.responses.create(model="synthetic", input="a b", max_output_tokens=RUNNING_TOKENS,
                                          background=True, stream=True)
    async with stream:
        events = stream.__aiter__()
        head = [await events.__anext__() for _ in range(READ_FIRST)]
        yield head[0].response.id, head, events


async def test_a_background_response_cancelled_or_deleted_by_another_server_stops_there(data: Path) -> None:
    """A cancel reaching a server that does not run the response marks it cancelled (not failed, nor a 400
    saying an in-progress one cannot be cancelled) and the server making it stops; a delete stops it too,
    and its end does not bring the row back."""
    async with serve_slow(data) as maker, serve_with_store(data) as other:
        async with running_in_background(maker) as (rid, head, events):
            cancelled = await other.responses.cancel(rid)
            assert (cancelled.id, cancelled.status, cancelled.error) == (rid, "cancelled", None)
            rest = [e async for e in events]  # the maker stops
        assert rest[-1].type == "response.failed" and rest[-1].response.status == "cancelled", rest[-1]
        said = [e for e in head + rest if e.type == "response.output_text.delta"]
        assert len(said) < RUNNING_TOKENS
        for client in (maker, other):
            assert (await client.responses.retrieve(rid)).status == "cancelled"
            assert (await client.responses.cancel(rid)).status == "cancelled"  # again: the same
        async with running_in_background(maker) as (rid, head, events):
            await other.responses.delete(rid)
            rest = [e async for e in events]
        assert rest[-1].type == "response.failed" and rest[-1].response.status == "cancelled", rest[-1]
        for client in (maker, other):
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(rid)
            with pytest.raises(openai.BadRequestError) as gone:
                await client.responses.create(model="synthetic", input="x", previous_response_id=rid)
            assert gone.value.body["code"] == "previous_response_not_found", gone.value.body


async def test_a_chain_continues_across_a_restart_without_the_instructions(client: AsyncOpenAI, data: Path) -> None:
    first = await client.responses.create(model="synthetic", max_output_tokens=1, instructions="Be brief.", input=[
        {"role": "user", "content": "look it up"},
        {"type": "function_call", "call_id": "call_7", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_7", "output": "found"}])
    async with serve_with_store(data) as restarted:
        follow = await restarted.responses.create(model="synthetic", max_output_tokens=1, input="next",
                                                  previous_response_id=first.id)
        assert (follow.output_text, follow.previous_response_id, follow.instructions) == ("next", first.id, None)
        items = await restarted.responses.input_items.list(follow.id)
        assert [(i.type, i.content[0].text) for i in items.data] == [("message", "next")]  # this turn's only
        again = await restarted.responses.create(model="synthetic", max_output_tokens=1, input="last",
                                                 previous_response_id=follow.id)  # a chain of three
        assert again.output_text == "last"


async def test_input_items_page_in_either_order(client: AsyncOpenAI) -> None:
    got = await client.responses.create(model="synthetic", max_output_tokens=1, input=[
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"}])

    def texts(page: Any) -> list[str]:
        return [i.content[0].text for i in page.data]

    newest = await client.responses.input_items.list(got.id)
    assert texts(newest) == ["three", "two", "one"] and not newest.has_more  # desc, OpenAI's default
    assert (newest.first_id, newest.last_id) == (newest.data[0].id, newest.data[-1].id)
    oldest = await client.responses.input_items.list(got.id, order="asc", limit=2)
    assert texts(oldest) == ["one", "two"] and oldest.has_more
    after = await client.responses.input_items.list(got.id, order="asc", after=oldest.last_id, limit=2)
    assert texts(after) == ["three"] and not after.has_more
    assert [i.content[0].text async for i in client.responses.input_items.list(got.id, limit=1)] == texts(newest)
    for bad_query, param in (({"after": "msg_missing"}, "after"), ({"limit": 101}, "limit"),
                             ({"order": "up"}, "order")):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.input_items.list(got.id, **bad_query)
        assert bad.value.body["param"] == param, bad.value.body


async def test_a_finished_stream_resumes_after_any_event_and_past_its_end_reads_nothing(data: Path) -> None:
    async with serve_slow(data) as client:
        events = await _read(await client.responses.create(model="synthetic", input="a b c", max_output_tokens=3,
                                                           background=True, stream=True))
        rid, n = events[0].response.id, len(events)
        for after in range(n + 2):
            tail = await _read(await client.responses.retrieve(rid, stream=True, starting_after=after))
            assert [e.model_dump() for e in tail] == [e.model_dump() for e in events[after + 1:]], after
        with pytest.raises(openai.BadRequestError) as late:  # ended: nothing left to cancel
            await client.responses.cancel(rid)
        assert late.value.body["code"] == "invalid_state", late.value.body


VLLM_PAST = ("This model's maximum context length is 512 tokens. However, your prompt contains at least 513 input "
             "tokens, which exceeds this limit even without any output tokens.")


def test_truncation_drops_from_the_start_keeping_the_instructions_and_the_last_item() -> None:
    """`truncation: "auto"`'s choice of what goes (the run against a real context: test_tools_llm.py): the
    drops double when the refusal's numbers are only a bound, a tool result never loses its call alone,
    and once the last item is all that is left there is nothing more to drop."""
    messages = [{"role": "system", "content": "Be brief."},
                *({"role": "user", "content": "x" * 100} for _ in range(20))]
    tries, start = [], 1
    while (start := fits_after(messages, start, 1, VLLM_PAST)) is not None:
        tries.append(start)
    assert tries[-1] == 20 and len(tries) <= 5 and tries == sorted(set(tries)), tries
    assert without({"messages": messages}, 1, tries[-1])["messages"] == [messages[0], messages[-1]]
    half = fits_after(messages, 1, 1, VLLM_PAST.replace("at least 513", "1024"))
    assert half is not None and 10 <= half <= 14, half  # about half the conversation goes at once
    called = [{"role": "user", "content": "x" * 400},
              {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
              {"role": "tool", "content": "found", "tool_call_id": "c"}, {"role": "user", "content": "next"}]
    assert fits_after(called, 1, 0, "maximum context length") == 3  # (the result goes with its call)
    inputs = {"messages": [{"role": "user", "content": [{"type": "image", "array": "image_1"}]},
                           {"role": "user", "content": [{"type": "input_audio", "array": "audio_1"}]},
                           {"role": "user", "content": [{"type": "image", "array": "image"}]}],
              "image_1": b"a", "audio_1": b"b", "image": b"c", "tools": []}
    kept = without(inputs, 0, 2)
    assert (sorted(kept), kept["messages"]) == (["image", "messages", "tools"], inputs["messages"][2:])


async def test_fields_client_libraries_send_are_served_echoed_or_refused_by_name(client: AsyncOpenAI) -> None:
    """The Agents SDK's, LangChain's and LiteLLM's fields: accepted and echoed as OpenAI echoes them for a model
    without the feature, a 400 naming the field where ignoring it would mislead."""
    sent: dict[str, Any] = {"prompt_cache_key": "conv-1", "prompt_cache_retention": "in_memory",
                            "safety_identifier": "user-1", "service_tier": "auto", "user": "u", "top_logprobs": 0,
                            "max_tool_calls": 2, "reasoning": {"effort": "none", "summary": "auto"},
                            "text": {"verbosity": "medium"}}
    got = await client.responses.create(model="synthetic", input="a b", max_output_tokens=2, **sent)
    assert got.output_text == "a b"
    assert (got.service_tier, got.prompt_cache_key, got.prompt_cache_retention, got.safety_identifier,
            got.max_tool_calls, got.top_logprobs) == ("default", "conv-1", "in_memory", "user-1", 2, 0)
    assert (got.text.verbosity, got.reasoning.effort, got.reasoning.summary) == ("medium", None, "auto")
    stream = await client.responses.create(model="synthetic", input="a b", max_output_tokens=2, stream=True,
                                           stream_options={"include_obfuscation": False}, **sent)
    assert (await _read(stream))[-1].response.output_text == "a b"
    for fields, param, code in (
            ({"reasoning": {"effort": "low"}}, "reasoning.effort", "unsupported_parameter"),
            ({"text": {"verbosity": "high"}}, "text.verbosity", "unsupported_value"),
            ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
            ({"stream_options": {"include_obfuscation": True}}, "stream_options", None),
            ({"safety_identifier": "s" * 257}, "safety_identifier", None),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.create(model="synthetic", input="x", **fields)
        assert bad.value.body["param"] == param and (code is None or bad.value.body["code"] == code), bad.value.body


async def test_token_counting_and_compaction_say_they_are_not_served(client: AsyncOpenAI) -> None:
    """Their paths match /v1/responses/{id}: a 404 naming what is not served, not that route's 405."""
    for call in (client.responses.input_tokens.count(model="synthetic", input="a b"),
                 client.responses.compact(model="synthetic", input="a b")):
        with pytest.raises(openai.NotFoundError) as missing:
            await call
        assert missing.value.body["code"] == "unsupported_endpoint" and "not served" in missing.value.body["message"]


def test_max_tool_calls_keeps_the_first_calls_whole_and_streamed() -> None:
    """`max_tool_calls` as the answer's tally reads it (the run with a tool-calling stage needs a GPU)."""
    tally = Tally.of({}, most_calls=2)
    calls = tuple(ToolCallOutput(f"call_{i}", "f", "{}") for i in range(3))
    tally.add_text(TextOutput("", 1, "stop", tool_calls=calls, content=None,
                              tool_parts=tuple(ToolCallPart(i, f"call_{i}", "f", "{}") for i in range(3))))
    assert [c.id for c in tally.tool_calls] == ["call_0", "call_1"] and tally.finish_reason == "tool_calls"
    assert [p.index for p in tally.parts] == [0, 1]
