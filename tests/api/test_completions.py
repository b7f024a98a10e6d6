"""POST /v1/completions (OpenAI's legacy text completions) on the real default assistant, through the unmodified
openai SDK: the raw prompt reaches SmolLM2 on vLLM (no chat template), in its four shapes, whole and streamed;
the fields no model here serves are 400s naming them; a model that writes no text is a 404 naming `model`.

One assistant server for the module (the bundled deploy, as `omni-run` serves it: greedy by default).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm")

from omni_actors.cli import bundled_deploy
from omni_actors.config.deploy import load_deploy
from omni_actors.models.assistant import LLM
from tests.api.conftest import Server, eventually, idle, post, serve, serve_deploy
from tests.models.assistant_support import assistant_dir

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

KEY = "completions-test-key"
MODEL = "assistant"
PROMPT = "The capital of France is"
OTHER = "One, two, three,"
ABORT_TIMEOUT_S = 10.0
"""Longest wait for the server to have aborted a stream its client left (every stage idle)."""


@pytest.fixture(scope="module")
async def srv(assistant_dir: Path, vllm_cache: Path) -> AsyncIterator[Server]:
    """The bundled deploy on a free port, with an API key (and the run's vLLM cache)."""
    cache = {"stage_id": LLM, "engine_extras": {"cache_dir": str(vllm_cache)}}
    deploy = load_deploy(bundled_deploy(), {"model": str(assistant_dir), "server": {"api_keys": [KEY]},
                                            "stages": [cache]})
    async with serve_deploy(deploy, KEY) as server:
        yield server


@pytest.fixture(scope="module")
def token_ids(assistant_dir: Path) -> list[int]:
    """PROMPT as SmolLM2's tokenizer writes it (no special tokens, as vLLM tokenizes a raw prompt)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assistant_dir / "llm").encode(PROMPT)


async def test_a_raw_prompt_is_completed_as_the_sdk_reads_it(srv: Server, token_ids: list[int]) -> None:
    client = srv.client()
    done = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6)
    assert done.object == "text_completion" and done.id.startswith("cmpl-") and done.model == MODEL
    (choice,) = done.choices
    assert choice.index == 0 and choice.logprobs is None and choice.finish_reason == "length"
    assert "Paris" in choice.text, choice.text
    # no chat template: the prompt's own tokens are all the model read
    assert done.usage.prompt_tokens == len(token_ids) and done.usage.completion_tokens == 6
    assert done.usage.total_tokens == len(token_ids) + 6
    # the same prompt as token ids, greedy: the same answer
    by_ids = await client.completions.create(model=MODEL, prompt=token_ids, max_tokens=6)
    assert by_ids.choices[0].text == choice.text and by_ids.usage.prompt_tokens == len(token_ids)
    # max_tokens left out: OpenAI's 16 (ignore_eos, vLLM's field, keeps the model from ending sooner)
    default = await client.completions.create(model=MODEL, prompt=PROMPT, extra_body={"ignore_eos": True})
    assert default.usage.completion_tokens == 16 and default.choices[0].text.startswith(choice.text)


async def test_several_prompts_and_choices_are_indexed_in_order(srv: Server, token_ids: list[int]) -> None:
    client = srv.client()
    alone = await client.completions.create(model=MODEL, prompt=OTHER, max_tokens=4)
    both = await client.completions.create(model=MODEL, prompt=[PROMPT, OTHER], n=2, max_tokens=4, user="u1")
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    texts = [c.text for c in both.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3] == alone.choices[0].text and texts[0] != texts[2]
    assert both.usage.prompt_tokens == len(token_ids) + alone.usage.prompt_tokens  # each prompt once
    assert both.usage.completion_tokens == 16
    ids = await client.completions.create(model=MODEL, prompt=[token_ids, token_ids[:-1]], max_tokens=4)
    assert [c.index for c in ids.choices] == [0, 1] and ids.choices[0].text == texts[0]
    assert ids.usage.prompt_tokens == 2 * len(token_ids) - 1


async def test_a_stream_is_text_completion_chunks_then_usage(srv: Server) -> None:
    client = srv.client()
    whole = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    stream = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True,
                                             stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    texts = [c for c in chunks if c.choices]
    assert len(texts) >= 2 and texts[0].choices[0].text  # no empty first chunk
    assert "".join(c.choices[0].text for c in texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in texts] == [None] * (len(texts) - 1) + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    # echo: the prompt first, whole and streamed
    echoed = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, echo=True)
    assert echoed.choices[0].text == PROMPT + whole.choices[0].text
    stream = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, echo=True, stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == echoed.choices[0].text


async def test_stop_and_sampling_reach_vllm(srv: Server) -> None:
    client = srv.client()
    whole = (await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)).choices[0].text
    assert "ris" in whole, whole
    stopped = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=["ris", "zzz"])
    assert stopped.choices[0].text == whole[:whole.index("ris")]
    assert stopped.choices[0].finish_reason == "stop"
    sampled = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.5, top_p=0.95, seed=7,
                   presence_penalty=0.5, frequency_penalty=0.5)
    one = (await client.completions.create(**sampled)).choices[0].text
    again = (await client.completions.create(**sampled)).choices[0].text
    other = (await client.completions.create(**{**sampled, "seed": 8})).choices[0].text
    assert one == again and one != other  # seeded: reproducible, and the seed matters


@pytest.mark.parametrize(("fields", "param"), [
    ({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [PROMPT, ""]}, "prompt[1]"),
    ({"prompt": [[1, 2], []]}, "prompt[1]"), ({"prompt": [PROMPT, 5]}, "prompt"),
    ({"suffix": " end."}, "suffix"), ({"best_of": 3}, "best_of"), ({"logprobs": 1, "echo": True}, "logprobs"),
    ({"logit_bias": {"<|endoftext|>": -100}}, "logit_bias"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": [1, 2, 3], "echo": True}, "echo"), ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
async def test_what_is_not_served_is_a_400_naming_the_field(srv: Server, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await srv.client().completions.create(**{"model": MODEL, "prompt": PROMPT, **fields})
    assert caught.value.param == param, caught.value.body


async def test_what_openai_s_defaults_send_is_accepted(srv: Server) -> None:
    """`vllm bench serve`'s body (null logprobs, repetition_penalty 1), best_of equal to n, an empty suffix."""
    status, body = await post(srv, "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 2, "logprobs": None, "repetition_penalty": 1.0,
        "best_of": 1, "suffix": "", "stream": False, "logit_bias": {}})
    assert status == 200 and body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 2, body


async def test_a_token_id_past_the_vocabulary_is_a_400(srv: Server) -> None:
    status, body = await post(srv, "/v1/completions", {"model": MODEL, "prompt": [[1, 2], [10**9]], "max_tokens": 2})
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body


async def test_a_prompt_past_the_context_is_context_length_exceeded(srv: Server) -> None:
    long = "word " * 5000  # the bundled deploy's max_model_len is 4096
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await srv.client().completions.create(model=MODEL, prompt=long, max_tokens=2, stream=stream)
        assert caught.value.code == "context_length_exceeded", caught.value.body
        assert caught.value.param == "prompt", caught.value.body  # (not chat's `messages`)


async def test_a_client_that_leaves_mid_stream_aborts_the_request(srv: Server) -> None:
    aborted_before = srv.orch.statistics().requests_aborted
    stream = await srv.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2000, stream=True,
                                                   extra_body={"ignore_eos": True})
    first = await anext(aiter(stream))
    assert first.choices[0].text and srv.orch.statistics().requests_in_flight == 1
    await stream.close()
    await eventually(lambda: idle(srv.orch), ABORT_TIMEOUT_S)
    assert srv.orch.statistics().requests_aborted == aborted_before + 1


async def test_an_unknown_model_is_a_404(srv: Server) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await srv.client().completions.create(model="gpt-3.5-turbo-instruct", prompt=PROMPT)
    assert caught.value.param == "model" and caught.value.code == "model_not_found"


async def test_a_model_that_writes_no_text_says_so() -> None:
    async with serve("synthetic_image") as images:
        with pytest.raises(openai.NotFoundError) as caught:
            await images.client().completions.create(model="synthetic_image", prompt=PROMPT)
    assert caught.value.param == "model" and caught.value.code == "model_not_supported"
    assert "synthetic_image" in caught.value.message and "no model of this server" in caught.value.message


async def test_a_stage_that_would_ignore_stop_or_penalties_cuts_at_stop_and_refuses_penalties() -> None:
    """The synthetic text stage (not vLLM) answers the prompt's words: `stop` is applied by the route as vLLM
    applies it (streamed or not), the penalties it would not apply are refused."""
    async with serve("synthetic_text") as text:
        client = text.client()
        done = await client.completions.create(model="synthetic_text", prompt="red green", max_tokens=2)
        assert done.choices[0].text == "red green" and done.usage.completion_tokens == 2
        cut = await client.completions.create(model="synthetic_text", prompt="red green blue", max_tokens=3,
                                              stop=" gr")
        assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("red", "stop")
        parts = [c async for c in await client.completions.create(
            model="synthetic_text", prompt="red green blue", max_tokens=3, stop=["blu"], stream=True)]
        assert "".join(c.choices[0].text for c in parts if c.choices) == "red green "
        assert [c.choices[0].finish_reason for c in parts if c.choices][-1] == "stop"
        for fields, param in (({"presence_penalty": 0.5}, "presence_penalty"),
                              ({"frequency_penalty": 0.5}, "frequency_penalty")):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.completions.create(model="synthetic_text", prompt="red", **fields)
            assert caught.value.param == param and caught.value.code == "unsupported_parameter"
        # More prompts x n than the stage could ever admit at once: a 400 naming the field, not a 429 that
        # the SDK (and a batch line) would retry in vain (before 2026-12-05: queue_full).
        room = text.orch.deploy.stage(0).queue_limit * text.orch.deploy.stage(0).num_replicas
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="synthetic_text", prompt=["red"] * 64, n=room // 64 + 1,
                                            max_tokens=1)
        assert (caught.value.param, caught.value.code) == ("n", "integer_above_max_value"), caught.value
