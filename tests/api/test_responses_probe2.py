"""The Responses and Chat routes as a demanding outside tester drives them with the unmodified openai SDK: a
stream that fails mid-answer ends with `response.failed` (the response stored failed); OpenAI's fields for
features this server lacks are refused by name (`unsupported_parameter`, never an unknown field); prompt cache
hints, an image's "original" detail and a function call's output given as parts are read; chat chunks say their
`service_tier`.

One server: the synthetic_text pipeline, whose one stage (repeating the last message's words, one per token)
fails each answer after its first FAIL_AT_CHUNK words; shorter answers complete.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import aiohttp
import openai
import openai.types.responses as sdk
import pytest
from openai import AsyncOpenAI

from omni_actors.api.responses_answer import SDK_ERROR_CODES, response_error
from tests.api.conftest import eventually, idle, make_deploy, serve_deploy
from tests.api.test_responses import KEY, PIXEL, _read, _settled

FAIL_AT_CHUNK = 8
"""The text stage fails each answer when it has made this many words (those are sent first)."""
STEP_DELAY_MS = 150
"""Time between the text stage's words: the route reads the first one (and sends the stream's headers) well
before the failure, even on a loaded machine (a failure before that is answered with its HTTP status)."""
LONG = "one two three four five six seven eight nine ten"
"""An input whose echo reaches the failure."""
SHORT = "one two three four five six seven"
"""An input whose echo ends before the failure, STEP_DELAY_MS a word."""


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AsyncOpenAI]:
    deploy = make_deploy("synthetic_text", server={"api_keys": [KEY]}, stages=[
        {"stage_id": 0, "engine_extras": {"fail_on_chunk": FAIL_AT_CHUNK, "step_delay_ms": STEP_DELAY_MS}}])
    data: Path = tmp_path_factory.mktemp("data")
    async with serve_deploy(deploy, KEY, data) as srv:
        yield AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=30)
        await eventually(lambda: idle(srv.orch))


async def test_a_stream_failing_mid_answer_ends_with_response_failed_and_is_stored_failed(
        client: AsyncOpenAI) -> None:
    events = await _read(await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=10,
                                                       stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    said = [e for e in events if e.type == "response.output_text.delta"]
    assert 1 <= len(said) <= FAIL_AT_CHUNK, said  # (every word made before the failure is sent first)
    end = events[-1]
    assert end.type == "response.failed", end
    failed = end.response
    assert (failed.status, failed.id, failed.error.code) == ("failed", events[0].response.id, "server_error"), failed
    assert failed.error.message.startswith("stage_failed: ") and "synthetic failure" in failed.error.message
    (item,) = failed.output  # the text it streamed, as an incomplete message (OpenAI's failed response keeps it)
    assert (item.type, item.id, item.status) == ("message", said[0].item_id, "incomplete"), item
    assert item.content[0].text == "".join(e.delta for e in said), item
    stored = await client.responses.with_raw_response.retrieve(failed.id)
    read = sdk.Response.model_validate(stored.http_response.json())  # (the SDK's closed set of error codes)
    assert (read.status, read.error, read.output) == ("failed", failed.error, failed.output), read
    async with aiohttp.ClientSession() as http, http.get(str(client.base_url).removesuffix("v1/") + "metrics",
                                                         headers={"Authorization": f"Bearer {KEY}"}) as resp:
        counted = [line for line in (await resp.text()).splitlines() if line.startswith("omni_http_errors_total{")
                   and 'route="/v1/responses"' in line and 'code="stage_failed"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, counted  # counted as an in-band error is


async def test_a_response_failing_mid_answer_is_answered_failed_and_stored(client: AsyncOpenAI) -> None:
    """Not streamed: a run failing once it made output is the response, `failed` with its `error` and the text
    so far (HTTP 200, as OpenAI answers a model's failure), stored so; one refused before it began stays a 400."""
    made = await client.responses.with_raw_response.create(model="synthetic_text", input=LONG, max_output_tokens=10)
    assert made.http_response.status_code == 200, made.http_response.text
    failed = sdk.Response.model_validate(made.http_response.json())
    assert (failed.status, failed.error.code) == ("failed", "server_error"), failed
    assert failed.error.message.startswith("stage_failed: ") and "synthetic failure" in failed.error.message
    (item,) = failed.output
    assert item.status == "incomplete" and item.content[0].text and LONG.startswith(item.content[0].text), item
    stored = await client.responses.retrieve(failed.id)
    assert (stored.status, stored.error, stored.output) == ("failed", failed.error, failed.output), stored
    unstored = await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=10, store=False)
    assert unstored.status == "failed"
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=200_000)


async def test_a_response_failing_in_a_conversation_adds_nothing_to_it(client: AsyncOpenAI) -> None:
    """Only a completed (or incomplete) response's items join its conversation (api/conversations.py)."""
    conv = await client.conversations.create(items=[{"role": "user", "content": "first"}])
    failed = await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=10,
                                           conversation=conv.id)
    streamed = await _read(await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=10,
                                                         conversation=conv.id, stream=True))
    assert (failed.status, streamed[-1].type) == ("failed", "response.failed")
    assert [i.content[0].text for i in (await client.conversations.items.list(conv.id)).data] == ["first"]
    done = await client.responses.create(model="synthetic_text", input="a b", max_output_tokens=2, conversation=conv.id)
    assert done.status == "completed"
    listed = (await client.conversations.items.list(conv.id, order="asc")).data
    assert [i.content[0].text for i in listed] == ["first", "a b", "a b"] and listed[-1].id == done.output[0].id


def test_every_failure_code_is_one_the_sdk_allows() -> None:
    """`error.code` is a closed set in the SDK (`ResponseError.code`): our codes map onto it (responses_answer)."""
    allowed = set(get_args(sdk.ResponseError.model_fields["code"].annotation))
    assert allowed >= SDK_ERROR_CODES, SDK_ERROR_CODES - allowed
    for ours, status in (("stage_failed", 500), ("rejected_by_stage", 400), ("queue_full", 429), ("aborted", 500)):
        assert response_error(ours, "why", status).code in allowed


async def test_an_unstored_stream_failing_mid_answer_is_not_stored(client: AsyncOpenAI) -> None:
    unstored = await _read(await client.responses.create(model="synthetic_text", input=LONG, max_output_tokens=10,
                                                         stream=True, store=False))
    assert unstored[-1].type == "response.failed" and unstored[-1].response.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored[-1].response.id)


@pytest.mark.parametrize(("field", "value"), [
    pytest.param("prompt", {"id": "pmpt_123", "variables": {"city": "Paris"}}, id="prompt"),
    pytest.param("logit_bias", {"50256": -100}, id="logit-bias"),
    pytest.param("context_management", [{"type": "compaction", "compact_threshold": 1000}], id="context-management"),
    pytest.param("moderation", {"model": "omni-moderation-latest"}, id="moderation"),
])
async def test_openai_fields_not_served_here_are_refused_by_name(client: AsyncOpenAI, field: str,
                                                                 value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="synthetic_text", input="a", max_output_tokens=1, extra_body={field: value})
    body = bad.value.body
    assert (body["param"], body["code"]) == (field, "unsupported_parameter"), body
    assert "not support" in body["message"] and "unknown" not in body["message"].lower(), body
    left_unset = await client.responses.create(model="synthetic_text", input="a", max_output_tokens=1,
                                               extra_body={field: None})  # null: the field left out
    assert left_unset.output_text == "a"


async def test_chat_logit_bias_and_legacy_functions_are_refused_by_name_and_null_is_left_out(
        client: AsyncOpenAI) -> None:
    ask: dict[str, Any] = {"model": "synthetic_text", "messages": [{"role": "user", "content": "a"}], "max_tokens": 1}
    for field, value in (("logit_bias", {"50256": -100}), ("functions", [{"name": "f", "parameters": {}}]),
                         ("function_call", "auto"), ("moderation", {"model": "omni-moderation-latest"})):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(**ask, extra_body={field: value})
        body = bad.value.body
        assert (body["param"], body["code"]) == (field, "unsupported_parameter"), body
        assert "unknown" not in body["message"].lower(), body
    for empty in (None, {}):
        got = await client.chat.completions.create(**ask, logit_bias=empty)
        assert got.choices[0].message.content == "a"


async def test_chat_chunks_say_their_service_tier_as_the_completion_does(client: AsyncOpenAI) -> None:
    ask: dict[str, Any] = {"model": "synthetic_text", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 2}
    whole = await client.chat.completions.create(**ask)
    assert whole.service_tier == "default"
    chunks = [c async for c in await client.chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True})]
    assert chunks[-1].usage is not None and len(chunks) >= 3
    assert {c.service_tier for c in chunks} == {"default"}, chunks


async def test_a_function_call_output_given_as_text_parts_is_read_as_its_text(client: AsyncOpenAI) -> None:
    """OpenAI's `function_call_output.output` is a string or a list of parts (the Agents SDK sends parts);
    text parts are the result's text, a part this server cannot put in a tool result is a 400 naming it."""
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
    got = await client.responses.create(model="synthetic_text", max_output_tokens=2, input=[
        {"role": "user", "content": "look"}, call,
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "red"},
                                                                         {"type": "input_text", "text": "green"}]}])
    assert got.output_text == "red green"
    items = await client.responses.input_items.list(got.id)
    assert items.data[0].type == "function_call_output" and items.data[0].output[1].text == "green"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="synthetic_text", input=[call, {
            "type": "function_call_output", "call_id": "call_1", "output": [
                {"type": "input_text", "text": "red"}, {"type": "input_file", "file_data": "aGk=", "filename": "a.txt"}]}])
    assert (bad.value.body["param"], bad.value.body["code"]) == ("input[1].output[1]", "unsupported_value"), bad.value.body


async def test_prompt_cache_hints_and_an_original_image_detail_are_accepted_with_no_effect(client: AsyncOpenAI) -> None:
    """The SDK's prompt caching fields (`prompt_cache_options`, a part's `prompt_cache_breakpoint`) are read as
    `prompt_cache_key` is (vLLM's prefix cache works unasked), and an image's `detail: "original"` as any detail;
    `prewarm` asks for no answer at all, which this server does not give: a 400 naming it."""
    mark = {"mode": "explicit", "ttl": "30m"}
    chat = await client.chat.completions.create(
        model="synthetic_text", max_tokens=1, prompt_cache_options={"mode": "explicit", "ttl": "30m"}, messages=[
            {"role": "user", "content": [{"type": "text", "text": "a", "prompt_cache_breakpoint": mark},
                                         {"type": "image_url", "image_url": {"url": PIXEL, "detail": "original"},
                                          "prompt_cache_breakpoint": mark}]}])
    assert chat.choices[0].finish_reason == "stop"
    got = await client.responses.create(
        model="synthetic_text", max_output_tokens=1, prompt_cache_options={"mode": "implicit", "ttl": "12h"}, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "a", "prompt_cache_breakpoint": mark},
                                         {"type": "input_image", "image_url": PIXEL, "detail": "original",
                                          "prompt_cache_breakpoint": mark}]}])
    assert got.status == "completed" and got.output_text
    for create, ask in ((client.chat.completions.create, {"messages": [{"role": "user", "content": "a"}]}),
                        (client.responses.create, {"input": "a"})):
        with pytest.raises(openai.BadRequestError) as bad:
            await create(model="synthetic_text", prompt_cache_options={"prewarm": True}, **ask)
        assert bad.value.body["param"] == "prompt_cache_options.prewarm", bad.value.body


async def test_a_stored_stream_can_be_retrieved_while_it_runs_and_one_left_says_so(client: AsyncOpenAI) -> None:
    """As OpenAI's: the id `response.created` gives is retrievable at once (`in_progress`), a foreground response
    cannot be cancelled, and one whose client left mid-stream reads failed (`client_disconnected`), not as if
    the server had stopped."""
    stream = await client.responses.create(model="synthetic_text", input=SHORT, max_output_tokens=7, stream=True)
    async with stream:
        events = stream.__aiter__()
        rid = (await events.__anext__()).response.id
        running = await client.responses.retrieve(rid)
        assert (running.status, running.output) == ("in_progress", []), running
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.cancel(rid)
        assert (bad.value.body["param"], bad.value.body["code"]) == ("response_id", "invalid_state"), bad.value.body
        rest = [e async for e in events]
    assert rest[-1].type == "response.completed"
    assert (await client.responses.retrieve(rid)).output_text == rest[-1].response.output_text == SHORT
    left = await client.responses.create(model="synthetic_text", input=SHORT, max_output_tokens=7, stream=True)
    async with left:
        rid = (await left.__aiter__().__anext__()).response.id
    gone = await _settled(client, rid)
    assert (gone.status, gone.error.code) == ("failed", "server_error"), gone
    assert gone.error.message.startswith("client_disconnected: "), gone.error
