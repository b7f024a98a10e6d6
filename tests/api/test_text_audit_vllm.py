"""OpenAI parity of the text routes (/v1/chat/completions, /v1/completions) on the real vLLM text stage: SmolLM2
through the `llm` pipeline, one server for the module, read through the unmodified openai SDK and raw HTTP.

What OpenAI answers and vLLM alone would not: a `max_tokens` past the model's whole context is a 400 naming the
field the client sent (vLLM cuts it to what the context holds, silently); `top_p` 0, in OpenAI's range, is
served as its limit (the likeliest token), not refused; every answer and chunk says `system_fingerprint`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm")

from tests.api.conftest import Server, post, serve
from tests.models.assistant_support import assistant_dir

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

CONTEXT = 512
"""The stage's max_model_len."""
MSG = [{"role": "user", "content": "Name a colour."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
async def srv(assistant_dir: Path, vllm_cache: Path) -> AsyncIterator[Server]:
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": CONTEXT, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve("llm", model=str(assistant_dir / "llm"), stages=stages) as server:
        yield server


@pytest.mark.parametrize(("route", "field"), [("chat", "max_tokens"), ("chat", "max_completion_tokens"),
                                              ("completions", "max_tokens")])
async def test_max_tokens_past_the_context_is_a_400_naming_the_field_sent(srv: Server, route: str, field: str) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        if route == "chat":
            await client.chat.completions.create(model="llm", messages=MSG, **{field: CONTEXT + 1})
        else:
            await client.completions.create(model="llm", prompt=PROMPT, **{field: CONTEXT + 1})
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == field, body
    assert str(CONTEXT) in body["message"] and field in body["message"], body
    # streamed: the same 400 before any chunk
    status, said = await post(srv, "/v1/chat/completions" if route == "chat" else "/v1/completions", {
        "model": "llm", "stream": True, field: 10**6,
        **({"messages": MSG} if route == "chat" else {"prompt": PROMPT})})
    assert status == 400 and said["error"]["param"] == field, said
    # a budget inside the context is served (cut by the budget, as asked)
    done = await client.completions.create(model="llm", prompt=PROMPT, max_tokens=3, extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 3


async def test_top_p_zero_is_served_as_the_likeliest_token(srv: Server) -> None:
    client = srv.client()
    greedy = await client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=0.0)
    for seed in (1, 2):
        top = await client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=1.0, top_p=0,
                                              seed=seed)
        assert top.choices[0].text == greedy.choices[0].text
    chat = await client.chat.completions.create(model="llm", messages=MSG, max_tokens=4, top_p=0.0, temperature=1.5)
    again = await client.chat.completions.create(model="llm", messages=MSG, max_tokens=4, temperature=0.0)
    assert chat.choices[0].message.content == again.choices[0].message.content


async def test_every_answer_and_chunk_says_system_fingerprint(srv: Server) -> None:
    status, chat = await post(srv, "/v1/chat/completions", {"model": "llm", "messages": MSG, "max_tokens": 2})
    assert status == 200 and "system_fingerprint" in chat, chat
    status, text = await post(srv, "/v1/completions", {"model": "llm", "prompt": PROMPT, "max_tokens": 2})
    assert status == 200 and "system_fingerprint" in text, text
    for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": PROMPT})):
        status, raw = await post(srv, path, {"model": "llm", "max_tokens": 2, "stream": True,
                                             "stream_options": {"include_usage": True}, **body})
        assert status == 200
        events = [json.loads(line[6:]) for line in raw.decode().splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert events and all("system_fingerprint" in e for e in events), events


async def test_logit_bias_is_applied_on_the_vllm_stage(srv: Server, assistant_dir: Path) -> None:
    from transformers import AutoTokenizer

    (london,) = AutoTokenizer.from_pretrained(assistant_dir / "llm").encode(" London")
    client = srv.client()
    plain = await client.completions.create(model="llm", prompt=PROMPT, max_tokens=1, temperature=0.0)
    assert plain.choices[0].text != " London"
    biased = await client.completions.create(model="llm", prompt=PROMPT, max_tokens=1, temperature=0.0,
                                             logit_bias={str(london): 100})
    assert biased.choices[0].text == " London"
    chat = await client.chat.completions.create(model="llm", messages=MSG, max_tokens=3, temperature=0.0,
                                                logit_bias={str(london): 100})
    assert chat.choices[0].message.content == " London" * 3 or chat.choices[0].message.content.startswith("London")
    for bias in ({"x": 1}, {str(london): 101}, {str(london): "high"}):
        status, said = await post(srv, "/v1/completions", {"model": "llm", "prompt": PROMPT, "logit_bias": bias})
        assert status == 400 and said["error"]["param"] == "logit_bias", said
    status, said = await post(srv, "/v1/chat/completions", {"model": "llm", "messages": MSG, "logit_bias": {"9" * 9: 1}})
    assert status == 400 and "logit_bias" in said["error"]["message"], said  # an id past the vocabulary: vLLM's 400
