"""Chat and Responses requests as real clients write them: an answer sent back as the openai SDK gives it
(`messages.append(message)`, `message.model_dump()`, `input += response.output`), and JSON `null` for a
field left unset (what clients that send every field write); `stop` and the penalties on a stage whose engine
does not apply them (applied by the route, or a 400 naming the field, as /v1/completions answers).

The synthetic text stage answers with the words of the last message, one per token, so an answer
says what reached the stage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import openai
import pytest

from omni_actors.api.chat import chat_params, stops_applied_here
from omni_actors.api.chat_schemas import ChatCompletionRequest
from omni_actors.api.errors import ApiError
from omni_actors.config.pipeline import get_pipeline
from tests.api.conftest import Server, eventually, idle, post, serve

USER = {"role": "user", "content": "red green"}


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve("synthetic") as s:
        yield s


async def test_an_audio_answer_sent_back_whole_is_read(srv: Server) -> None:
    client = srv.client()
    first = await client.chat.completions.create(model="synthetic", messages=[USER], max_tokens=2,
                                                 modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    said = first.choices[0].message
    assert said.audio is not None and said.audio.data  # (the SDK sends id, data, expires_at and transcript back)
    for sent_back in (said, said.model_dump()):
        again = await client.chat.completions.create(
            model="synthetic", messages=[USER, sent_back, {"role": "user", "content": "blue"}], max_tokens=2)
        assert again.choices[0].message.content == "blue blue"


async def test_a_turn_without_content_reads_as_its_transcript_or_refusal(srv: Server) -> None:
    client = srv.client()
    audio_only = {"role": "assistant", "content": None, "audio": {"id": "audio_1", "transcript": "yellow pink"}}
    answer = await client.chat.completions.create(model="synthetic", messages=[USER, audio_only], max_tokens=2)
    assert answer.choices[0].message.content == "yellow pink"
    refused = {"role": "assistant", "content": None, "refusal": "cannot say"}
    answer = await client.chat.completions.create(model="synthetic", messages=[USER, refused], max_tokens=2)
    assert answer.choices[0].message.content == "cannot say"
    parts = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no way"}]}
    answer = await client.chat.completions.create(model="synthetic", messages=[USER, parts], max_tokens=2)
    assert answer.choices[0].message.content == "no way"


async def test_a_legacy_function_call_is_still_a_400_naming_it(srv: Server) -> None:
    said = {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}
    status, body = await post(srv, "/v1/chat/completions", {"model": "synthetic", "messages": [USER, said]})
    assert status == 400 and body["error"]["param"] == "messages[1].function_call"


async def test_null_is_a_field_left_out(srv: Server) -> None:
    status, body = await post(srv, "/v1/chat/completions", {
        "model": "synthetic", "messages": [USER], "max_tokens": 2, "stream": None, "stream_options": None})
    assert status == 200 and body["object"] == "chat.completion", body
    status, body = await post(srv, "/v1/responses", {"model": "synthetic", "input": "red", "max_output_tokens": 2,
                                                     "stream": None, "store": None, "background": None})
    assert status == 200 and body["status"] == "completed" and body["store"] is True, body
    assert not body["background"]
    stored = await srv.client().responses.retrieve(body["id"])  # stored, as store's default says
    assert stored.output_text == "red red"


async def test_stream_options_as_the_sdk_writes_them(srv: Server) -> None:
    stream = await srv.client().chat.completions.create(
        model="synthetic", messages=[USER], max_tokens=2, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False})
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


async def test_a_response_s_output_dumped_and_sent_back_is_read(srv: Server) -> None:
    client = srv.client()
    first = await client.responses.create(model="synthetic", input="red green", max_output_tokens=2)
    history = [{"role": "user", "content": "red green"}, *(o.model_dump() for o in first.output)]
    assert "phase" in history[1]  # (None, as this SDK dumps an output message)
    again = await client.responses.create(model="synthetic", input=[*history, {"role": "user", "content": "blue"}],
                                          max_output_tokens=2)
    assert again.output_text == "blue blue"


@pytest.mark.parametrize("stop", ["", ["\n", ""]], ids=["empty", "empty-in-list"])
async def test_an_empty_stop_sequence_is_a_400_naming_stop(srv: Server, stop: str | list[str]) -> None:
    status, body = await post(srv, "/v1/chat/completions", {"model": "synthetic", "messages": [USER], "stop": stop})
    assert status == 400 and body["error"]["param"].startswith("stop"), body



async def test_fields_client_libraries_send_are_served_accepted_or_refused_by_name(srv: Server) -> None:
    """What the Agents SDK, LangChain and LiteLLM send: accepted with no effect where OpenAI's models without the
    feature take it (the tier echoed as OpenAI says it), a 400 naming the field where ignoring would mislead."""
    client = srv.client()
    got = await client.chat.completions.create(
        model="synthetic", messages=[USER], max_tokens=2, prompt_cache_key="conv-1", prompt_cache_retention="24h",
        safety_identifier="user-1", service_tier="auto", user="u", store=False, metadata={"a": "b"},
        reasoning_effort="none", verbosity="medium", logprobs=False, top_logprobs=0,
        prediction={"type": "content", "content": "red green"})
    assert (got.choices[0].message.content, got.service_tier) == ("red green", "default")
    for fields, param, code in (
            ({"reasoning_effort": "high"}, "reasoning_effort", "unsupported_parameter"),
            ({"verbosity": "low"}, "verbosity", "unsupported_value"),
            ({"top_logprobs": 3, "logprobs": False}, "top_logprobs", "unsupported_parameter"),
            ({"web_search_options": {"search_context_size": "low"}}, "web_search_options", "unsupported_parameter"),
            ({"prompt_cache_key": "k" * 257}, "prompt_cache_key", None),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="synthetic", messages=[USER], max_tokens=2, **fields)
        assert bad.value.body["param"] == param and (code is None or bad.value.body["code"] == code), bad.value.body


LONG_ASK = [{"role": "user", "content": "alpha beta gamma delta"}]
"""The synthetic text stage says these words, one a token, over and over up to `max_tokens`."""


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_stop_on_an_engine_that_ignores_it_ends_the_text_before_the_stop_string(srv: Server,
                                                                                      streamed: bool) -> None:
    """The synthetic stage (like the transformers engine) does not apply `stop`: the route does, as vLLM does
    (before 2026-12-05 it was ignored: the whole answer came back)."""
    client = srv.client()
    for stop, said in ((" gamma", "alpha beta"), (["ta ga", "zz"], "alpha be"), ("alpha", ""),
                       (["nowhere"], "alpha beta gamma delta alpha beta gamma delta")):
        if streamed:
            chunks = [c async for c in await client.chat.completions.create(
                model="synthetic", messages=LONG_ASK, max_tokens=8, stop=stop, stream=True)]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            got = await client.chat.completions.create(model="synthetic", messages=LONG_ASK, max_tokens=8, stop=stop)
            text, finish = got.choices[0].message.content, got.choices[0].finish_reason
        assert (text, finish) == (said, "stop"), stop


async def test_a_stop_reached_ends_the_request_in_the_stage(srv: Server) -> None:
    before = srv.orch.statistics().requests_aborted
    got = await srv.client().chat.completions.create(model="synthetic", messages=LONG_ASK, max_tokens=50_000,
                                                     stop=" gamma")
    assert (got.choices[0].message.content, got.choices[0].finish_reason) == ("alpha beta", "stop")
    assert got.usage is not None and got.usage.completion_tokens < 50_000
    await eventually(lambda: idle(srv.orch))
    assert srv.orch.statistics().requests_aborted == before + 1


async def test_sampling_fields_a_stage_would_ignore_are_a_400_naming_them(srv: Server) -> None:
    """As /v1/completions answers them (before 2026-12-05 chat ignored them silently)."""
    spoken = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}
    for fields, param in (({"presence_penalty": 0.5}, "presence_penalty"),
                          ({"frequency_penalty": -1}, "frequency_penalty"), ({"stop": "x", **spoken}, "stop")):
        for streamed in (False, True):
            status, body = await post(srv, "/v1/chat/completions", {
                "model": "synthetic", "messages": [USER], "max_tokens": 2, "stream": streamed, **fields})
            assert status == 400 and body["error"]["param"] == param, (fields, body)
            assert body["error"]["code"] == "unsupported_parameter"
        status, body = await post(srv, "/v1/responses", {"model": "synthetic", "input": "red", param: fields[param]})
        assert status == 400 and body["error"]["param"] == param, body  # (not a field of the Responses API)
    got = await srv.client().chat.completions.create(model="synthetic", messages=[USER], max_tokens=2,
                                                     presence_penalty=0, frequency_penalty=0)
    assert got.choices[0].message.content == "red green"  # (0: no penalty, nothing to apply)


def test_a_vllm_text_stage_is_given_stop_and_the_penalties_itself() -> None:
    req = msgspec.json.decode(msgspec.json.encode({
        "model": "llm", "messages": [USER], "stop": ["\n"], "presence_penalty": 0.5, "frequency_penalty": 0.5}),
        type=ChatCompletionRequest)
    assert stops_applied_here(req, get_pipeline("llm"), ["text"]) is None  # (no 400; no stop applied here)
    assert chat_params(req, ["text"])["stop"] == ["\n"]
    with pytest.raises(ApiError) as refused:
        stops_applied_here(req, get_pipeline("synthetic"), ["text"])
    assert refused.value.param == "presence_penalty"
