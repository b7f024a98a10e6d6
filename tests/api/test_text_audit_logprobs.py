"""Log-probabilities on the text routes (/v1/chat/completions `logprobs`/`top_logprobs`, /v1/completions
`logprobs`) on the real vLLM text stage: SmolLM2 through the `llm` pipeline, one server for the module, read
through the unmodified openai SDK (its types are OpenAI's shapes) and raw HTTP.

Each answer's tokens join to its text (a `stop` string's token trimmed as vLLM trims the text), each logprob
is at most 0, greedy decoding samples the likeliest alternative; the bounds OpenAI sets, the combinations
that cannot be answered and a stage not on vLLM (the synthetic pipeline) are 400s naming the field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.api.conftest import Server, post, serve
from tests.models.assistant_support import assistant_dir

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

MSG = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"
TOP = 3
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
async def srv(assistant_dir: Path, vllm_cache: Path) -> AsyncIterator[Server]:
    stages = [{"stage_id": 0, "max_num_seqs": 2, "dtype": "float32",
               "engine_extras": {"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(vllm_cache)}}]
    async with serve("llm", model=str(assistant_dir / "llm"), stages=stages) as server:
        yield server


async def test_chat_logprobs_join_to_the_answer_whole_streamed_and_stopped(srv: Server) -> None:
    client = srv.client()
    asked = dict(model="llm", messages=MSG, max_tokens=12, temperature=0, logprobs=True, top_logprobs=TOP)
    got = await client.chat.completions.create(**asked)
    choice = got.choices[0]
    text, tokens = choice.message.content, choice.logprobs.content
    assert text and tokens and choice.logprobs.refusal is None
    assert "".join(t.token for t in tokens) == text
    for t in tokens:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode()) and len(t.top_logprobs) == TOP, t
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob), t
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)

    streamed, pieces = [], []
    async for chunk in await client.chat.completions.create(**asked, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == text
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, pytest.approx(t.logprob)) for t in tokens]

    # a stop string inside the answer: the text ends before it, and so do its tokens
    cut = len(text) // 2
    stop = text[cut:cut + 2]
    stopped = (await client.chat.completions.create(**asked, stop=[stop])).choices[0]
    assert stopped.message.content == text[:text.find(stop)] and stopped.finish_reason == "stop"
    assert "".join(t.token for t in stopped.logprobs.content) == stopped.message.content

    plain = await client.chat.completions.create(model="llm", messages=MSG, max_tokens=2)
    assert plain.choices[0].logprobs is None  # not asked: null, as OpenAI


async def test_completions_logprobs_are_the_legacy_shape(srv: Server) -> None:
    client = srv.client()
    asked = dict(model="llm", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    choice = (await client.completions.create(**asked)).choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 2 and top[token] == pytest.approx(logprob), (token, top)
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the likeliest
    streamed: list[str] = []
    stream_offsets: list[int] = []
    async for chunk in await client.completions.create(**asked, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.tokens)
            stream_offsets.extend(chunk.choices[0].logprobs.text_offset)
    assert (streamed, stream_offsets) == (lp.tokens, lp.text_offset)


@pytest.mark.parametrize(("path", "fields", "param"), [
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"logprobs": True, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "logprobs"),
    (COMPLETIONS, {"logprobs": 6}, "logprobs"),
    (COMPLETIONS, {"logprobs": -1}, "logprobs"),
])
async def test_out_of_bounds_is_a_400_naming_the_field(srv: Server, path: str, fields: dict, param: str) -> None:
    body = {"model": "llm", "max_tokens": 2, **({"messages": MSG} if path == CHAT else {"prompt": PROMPT}), **fields}
    status, said = await post(srv, path, body)
    assert status == 400 and said["error"]["param"] == param, said


async def test_a_stage_not_on_vllm_is_a_400_naming_the_field() -> None:
    async with serve("synthetic") as synthetic:
        for fields, param in (({"logprobs": True}, "logprobs"), ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
                              ({"top_logprobs": 2}, "top_logprobs")):
            status, said = await post(synthetic, CHAT, {"model": "synthetic", "messages": MSG, **fields})
            assert status == 400 and said["error"]["param"] == param, said
            assert said["error"]["code"] == "unsupported_parameter", said
