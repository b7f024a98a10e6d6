"""HfAREngine at the end of its KV cache: a generation that fills max_model_len ends with "length".

A prompt that fits but whose generation reaches the cache's last position used to fail with
ContextLengthExceeded after its tokens had streamed (the client got an error mid-answer). Like
vLLM at max_model_len, the token sampled from the last position now ends the request: finished,
finish_reason "length", the usage counts the normal end writes, and the same tokens as without
a limit. A prompt that does not fit at all is still refused (a 400). Real engines over a tiny
random-weight Llama, on each cache: dynamic, static, and static with the step queued ahead; and
a tiny Qwen3-TTS talker whose frames, the last one ending the request at the cache's end, go
through the pipeline's chunk processor into its codec stage, which speaks every one of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.errors import CONTEXT_LENGTH_EXCEEDED  # noqa: E402
from omni_actors.workers.engine import EngineContext, EngineOutput  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402
from tests.workers.test_hf_ar_fused import _build, _ctx, _prompt  # noqa: E402

MAX_LEN = 16
CACHES = {
    "dynamic": {"kv_cache": "dynamic"},
    "static": {"kv_cache": "static"},
    "static_ahead": {"kv_cache": "static", "fused_decode": True, "lookahead": True},
}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("llama_full"), "llama")


def _engine(path: Path, cache: str, max_len: int | None = MAX_LEN) -> HfAREngine:
    engine = HfAREngine(_ctx(path, max_model_len=max_len, **CACHES[cache]))
    assert engine.lookahead == (cache == "static_ahead")
    return engine


def _drain(engine: HfAREngine, requests: dict[str, tuple[list[int], int]]) -> dict[str, list[EngineOutput]]:
    """Add {rid: (prompt ids, max_tokens)}, run to the end; every output per request."""
    for rid, (prompt, max_tokens) in requests.items():
        engine.add(rid, {"prompt_token_ids": prompt}, {"max_tokens": max_tokens, "ignore_eos": True})
    outs: dict[str, list[EngineOutput]] = {}
    while engine.has_work():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    assert not engine.seqs and (engine.slots is None or engine.slots.owners == [])  # every slot came back
    assert engine.thrown_away == 0  # no step was queued past a row whose cache filled
    return outs


def _ids(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.payload["token_ids"]]


@pytest.mark.parametrize("cache", list(CACHES))
def test_a_generation_that_fills_the_cache_ends_with_length(llama_dir, cache):
    prompt, short = _prompt(10, 1), _prompt(4, 2)
    fits = MAX_LEN - len(prompt) + 1  # the last token needs no KV position
    outs = _drain(_engine(llama_dir, cache), {"fills": (prompt, 50), "short": (short, 5)})
    fills = outs["fills"]
    assert all(o.error is None for o in fills), [o.error for o in fills]
    assert [o.finished for o in fills] == [False] * (fits - 1) + [True]  # streamed, then ended once
    last = fills[-1].payload
    assert last["finish_reason"] == "length"
    assert (last["prompt_tokens"], last["completion_tokens"]) == (len(prompt), fits)
    assert "text" in last and len(last["token_ids"]) == 1  # a payload like any other end's
    unlimited = _drain(_engine(llama_dir, "dynamic", max_len=None), {"fills": (prompt, fits)})
    assert _ids(fills) == _ids(unlimited["fills"])  # every token that fits, the same ones
    assert len(_ids(outs["short"])) == 5 and outs["short"][-1].payload["finish_reason"] == "length"


@pytest.mark.parametrize("cache", list(CACHES))
def test_a_prompt_of_max_len_gives_one_token_and_a_longer_one_is_refused(llama_dir, cache):
    outs = _drain(_engine(llama_dir, cache), {"exact": (_prompt(MAX_LEN, 3), 8), "over": (_prompt(MAX_LEN + 1, 4), 8)})
    (exact,) = outs["exact"]
    assert exact.error is None and exact.finished and exact.payload["finish_reason"] == "length"
    assert exact.payload["completion_tokens"] == 1 and len(exact.payload["token_ids"]) == 1
    (over,) = outs["over"]
    assert over.finished and over.rejected and over.code == CONTEXT_LENGTH_EXCEEDED and over.payload == {}
    assert over.error.startswith("ContextLengthExceeded") and f"max_model_len is {MAX_LEN}" in over.error


# ---- a speech talker into its codec ------------------------------------------------------

ROOM = 3
"""KV positions the talker's cache has past its prompt: ROOM + 1 frames fit."""


def _tts(path: Path, **talker: object) -> tuple[HfAREngine, object, object]:
    """The qwen3_tts pipeline's talker (engine_extras `talker` on top of its defaults), its codec
    engine and the codec stage's chunk processor."""
    pipe = get_pipeline("qwen3_tts")
    engines = []
    for spec in pipe.stages:
        extras = {**spec.engine_defaults, **(talker if spec.stage_id == 0 else {})}
        engines.append(resolve(spec.engine)(EngineContext(
            stage_id=spec.stage_id, replica=0, model_stage=spec.model_stage, model_path=path, device="cpu",
            max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
            engine_extras=extras)))  # fmt: skip
    return engines[0], engines[1], resolve(pipe.stages[1].chunk_processor)


def _talk(talker: HfAREngine) -> tuple[list[EngineOutput], int]:
    """One seeded request run to its end: (its outputs, KV positions its prompt took)."""
    talker.add("a", {"text": "Hello there, how are you?", "voice": "vivian"}, {"seed": 5, "max_tokens": 12})
    outs: list[EngineOutput] = []
    prompt = 0
    while talker.has_work():
        outs.extend(talker.step())
        prompt = prompt or talker.seqs["a"].cached
    return outs, prompt


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_talker_that_fills_its_cache_ends_with_length_and_its_codec_speaks_every_frame(tiny_model, cache):
    path = tiny_model("qwen3_tts")
    ref, prompt = _talk(_tts(path, kv_cache="dynamic")[0])
    assert len(ref) == 12 and all("codes" in o.payload for o in ref)  # no stop code in the frames that fit
    talker, codec, chunk = _tts(path, kv_cache=cache, max_model_len=prompt + ROOM)
    outs, _ = _talk(talker)
    assert all(o.error is None for o in outs) and [o.finished for o in outs] == [False] * ROOM + [True]
    assert outs[-1].payload["finish_reason"] == "length" and outs[-1].payload["completion_tokens"] == ROOM + 1
    frames = [o.payload["codes"] for o in outs]
    assert all((a == b["codes"]).all() for a, b in zip(frames, [o.payload for o in ref], strict=False))
    for i, out in enumerate(outs):  # as the codec stage gets them: chunk by chunk, the last ending its input
        inputs = chunk(0, out.payload, out.finished, {}, {})
        if i == 0:
            codec.add("a", inputs, {}, streaming=True)
        else:
            codec.feed("a", inputs, out.finished)
    samples, ended = 0, 0
    while codec.has_work():
        for out in codec.step():
            assert out.error is None, out.error
            samples += out.payload["audio"].size
            ended += out.finished
    assert ended == 1 and samples == (ROOM + 1) * codec.adapter.samples_per_code
