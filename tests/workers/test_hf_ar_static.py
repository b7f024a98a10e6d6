"""HfAREngine's static slot KV cache (no CUDA graphs on CPU) against its dynamic cache.

Real engines on tiny checkpoints: greedy output must be token-identical while
requests of different lengths join and leave mid-batch, slots must come back
on finish and abort, a prompt past max_model_len must be refused alone, and a
request whose generation fills max_model_len must end with "length", not fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402
from omni_actors.workers.engines.hf_ar_slots import buckets  # noqa: E402

ADAPTER = "omni_actors.workers.engines.hf_ar:CausalLMAdapter"
# (prompt, max_tokens, step at which it is added): lengths differ, joins and leaves interleave.
SCHEDULE = [
    ("Hello there", 20, 0),
    ("The quick brown fox jumps", 6, 0),
    ("A", 31, 2),
    ("Once upon a time there was", 12, 5),
    ("x y z", 9, 9),
    ("hm", 4, 14),
]


def _ctx(path: Path, slots: int = 3, **extras) -> EngineContext:
    return EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device="cpu",
        max_num_seqs=slots, dtype="float32", gpu_memory_utilization=0.5,
        tensor_parallel_size=1, engine_extras={"adapter": ADAPTER, **extras},
    )  # fmt: skip


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_tiny("llama", tmp_path_factory.mktemp("llama"), seed=0)


def _run(engine: HfAREngine, schedule, params=None, abort: dict[str, int] | None = None, ends=None):
    """Add requests at their steps, drain; returns ({rid: ids}, {rid: error}, most slots held);
    `ends` (a dict), when given, gets each finished request's last payload."""
    ids: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    ends = {} if ends is None else ends
    step, most = 0, 0
    pending = [(f"r{i}", *item) for i, item in enumerate(schedule)]
    while pending or engine.has_work():
        while pending and pending[0][3] <= step:
            rid, prompt, n, _ = pending.pop(0)
            engine.add(
                rid, {"prompt": prompt}, {"max_tokens": n, "ignore_eos": True, **(params or {})}
            )
        for rid, at in (abort or {}).items():
            if at == step:
                engine.abort(rid)
        step += 1
        if engine.has_work():
            for out in engine.step():
                if out.error:
                    errors[out.request_id] = out.error
                else:
                    ids.setdefault(out.request_id, []).extend(out.payload["token_ids"])
                    if out.finished:
                        ends[out.request_id] = out.payload
        if engine.slots is not None:
            most = max(most, len(engine.slots.owners))
            assert [s.slot for s in engine.slots.owners] == list(range(len(engine.slots.owners)))
    return ids, errors, most


def test_static_matches_dynamic_with_joins_and_leaves(llama_dir):
    dynamic, _, _ = _run(HfAREngine(_ctx(llama_dir)), SCHEDULE)
    engine = HfAREngine(_ctx(llama_dir, kv_cache="static", max_model_len=64))
    static, errors, most = _run(engine, SCHEDULE)
    assert not errors and most == 3
    assert static == dynamic
    assert [len(static[f"r{i}"]) for i in range(len(SCHEDULE))] == [n for _, n, _ in SCHEDULE]
    assert engine.slots.owners == []  # every slot came back


def test_static_seeded_sampling_matches_dynamic(llama_dir):
    params = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 3}
    dynamic, _, _ = _run(HfAREngine(_ctx(llama_dir)), SCHEDULE[:3], params)
    static, _, _ = _run(HfAREngine(_ctx(llama_dir, kv_cache="static")), SCHEDULE[:3], params)
    assert static == dynamic


def test_abort_frees_a_slot_for_a_waiting_request(llama_dir):
    engine = HfAREngine(_ctx(llama_dir, slots=2, kv_cache="static", max_model_len=64))
    schedule = [("Hello there", 30, 0), ("The quick brown fox", 30, 0), ("A", 5, 1)]
    ids, errors, most = _run(engine, schedule, abort={"r0": 3})
    assert not errors and most == 2
    assert "r0" not in ids or len(ids["r0"]) < 30
    assert len(ids["r1"]) == 30 and len(ids["r2"]) == 5
    alone, _, _ = _run(HfAREngine(_ctx(llama_dir)), [("A", 5, 0)])
    assert ids["r2"] == alone["r0"]
    assert engine.slots.owners == [] and not engine.seqs


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_a_prompt_past_max_len_fails_alone_and_a_full_cache_ends_with_length(llama_dir, kv_cache):
    engine = HfAREngine(_ctx(llama_dir, kv_cache=kv_cache, max_model_len=16))
    long_prompt = " ".join(["word"] * 40)
    schedule = [("Hello there", 30, 0), (long_prompt, 5, 0), ("A", 8, 1)]
    ends: dict[str, dict] = {}
    ids, errors, _ = _run(engine, schedule, ends=ends)
    prompt_len = len(engine.adapter.tokenizer("Hello there").input_ids)
    assert set(errors) == {"r1"}  # the prompt past the context; r0 only filled it while generating
    assert errors["r1"].startswith("ContextLengthExceeded")
    assert len(ids["r0"]) == 16 - prompt_len + 1  # every position filled, then it stops
    assert ends["r0"]["finish_reason"] == "length"
    assert (ends["r0"]["prompt_tokens"], ends["r0"]["completion_tokens"]) == (prompt_len, len(ids["r0"]))
    assert len(ids["r2"]) == 8 and not engine.seqs
    alone, _, _ = _run(HfAREngine(_ctx(llama_dir)), [("A", 8, 0)])
    assert ids["r2"] == alone["r0"]


def test_a_prompt_past_max_len_is_refused_as_the_callers_fault(llama_dir):
    engine = HfAREngine(_ctx(llama_dir, max_model_len=16))
    engine.add("long", {"prompt": " ".join(["word"] * 40)}, {"max_tokens": 2})
    (out,) = engine.step()
    assert out.error.startswith("ContextLengthExceeded") and out.rejected  # a 400, not a 500
    assert not engine.seqs


def test_bad_kv_cache_setting_is_a_clear_error(llama_dir):
    with pytest.raises(ValueError, match="kv_cache"):
        HfAREngine(_ctx(llama_dir, kv_cache="paged"))


def test_bad_warm_graphs_setting_is_a_clear_error(llama_dir):
    with pytest.raises(ValueError, match="warm_graphs"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", warm_graphs="yes"))


def test_buckets():
    assert buckets(8, 1) == [1, 2, 4, 8]
    assert buckets(12, 1) == [1, 2, 4, 8, 12]
    assert buckets(4096, 128)[:3] == [128, 256, 512] and buckets(4096, 128)[-1] == 4096


# ---- Qwen2.5-Omni thinker + talker, async chunk -----------------------------------------


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory) -> Path:
    return make_tiny("qwen2_5_omni", tmp_path_factory.mktemp("qwen2_5_omni"), seed=0)


def _omni(path: Path, extras: dict) -> tuple[list[HfAREngine], object]:
    pipe = get_pipeline("qwen2_5_omni")
    engines = []
    for spec in pipe.stages[:2]:
        ctx = EngineContext(
            stage_id=spec.stage_id, replica=0, model_stage=spec.model_stage, model_path=path,
            device="cpu", max_num_seqs=3, dtype="float32", gpu_memory_utilization=0.5,
            tensor_parallel_size=1, engine_extras={**spec.engine_defaults, **extras},
        )  # fmt: skip
        engines.append(resolve(spec.engine)(ctx))
    return engines, resolve(pipe.stages[1].chunk_processor)


def _run_omni(path: Path, extras: dict, abort: dict[str, int]) -> dict[str, tuple]:
    """Four chats through thinker -> talker, streamed, joining at different steps."""
    (thinker, talker), chunk = _omni(path, extras)
    prompts = ["Hello!", "What is in this picture?", "Numbers 0 1 2 3", "The quick brown fox"]
    starts = [0, 0, 3, 7]
    lengths = [12, 5, 9, 7]
    text: dict[str, list] = {}
    codes: dict[str, list] = {}
    step = 0
    while step <= max(starts) or thinker.has_work() or talker.has_work():
        for i, (p, at) in enumerate(zip(prompts, starts, strict=True)):
            if at == step:
                params = {"max_tokens": lengths[i], "ignore_eos": True, "talker_max_tokens": 10 + 3 * i,
                          "talker_temperature": 0.0, "talker_repetition_penalty": 1.0}  # fmt: skip
                req = {"messages": [{"role": "user", "content": p}]}
                thinker.add(f"r{i}", req, params)
                talker.add(f"r{i}", req, params, streaming=True)
        for rid, at in abort.items():
            if at == step:
                thinker.abort(rid)
                talker.abort(rid)
        step += 1
        if thinker.has_work():
            for out in thinker.step():
                assert out.error is None, out.error
                text.setdefault(out.request_id, []).extend(out.payload["token_ids"])
                nxt = chunk(0, out.payload, out.finished, {}, {})
                if nxt is not None or out.finished:
                    talker.feed(out.request_id, nxt or {}, out.finished)
        if talker.has_work():
            for out in talker.step():
                assert out.error is None, out.error
                if "codes" in out.payload:
                    codes.setdefault(out.request_id, []).append(int(out.payload["codes"][0]))
    for eng in (thinker, talker):
        assert not eng.seqs and (eng.slots is None or eng.slots.owners == [])
    return {rid: (text[rid], codes.get(rid, [])) for rid in text}


def test_qwen2_5_omni_static_thinker_and_talker_match_dynamic(omni_dir):
    abort = {"r1": 6}
    dynamic = _run_omni(omni_dir, {"kv_cache": "dynamic"}, abort)
    static = _run_omni(omni_dir, {"kv_cache": "static", "max_model_len": 256}, abort)
    assert static == dynamic
    assert all(len(static[r][1]) > 0 for r in ("r0", "r2", "r3"))
    assert np.all([len(static[f"r{i}"][0]) == n for i, n in [(0, 12), (2, 9), (3, 7)]])


def test_static_engine_is_reused_after_a_failed_batch_member(llama_dir):
    # A prompt that fails in the adapter (no prompt) never takes a slot.
    engine = HfAREngine(dataclasses.replace(_ctx(llama_dir, kv_cache="static")))
    with pytest.raises(ValueError, match="prompt"):
        engine.add("bad", {"nothing": 1}, {})
    ids, errors, _ = _run(engine, [("A", 4, 0)])
    assert not errors and len(ids["r0"]) == 4 and engine.slots.owners == []


def test_full_cache_ends_while_waiting_for_input_and_others_go_on(omni_dir):
    """A streaming talker request that fills max_model_len while waiting for thinker states
    ends at once with "length" (its codes so far, no error); a shorter request decoding beside
    it is not disturbed."""
    (thinker, _), _ = _omni(omni_dir, {"kv_cache": "static"})
    pipe = get_pipeline("qwen2_5_omni")
    full, chunk = resolve(pipe.stages[1].processor), resolve(pipe.stages[1].chunk_processor)
    prompts = {
        "a": "Please tell me a long story about a small boat at sea, with three storms in it.",
        "b": "Hi",
    }
    base = {"max_tokens": 8, "ignore_eos": True, "talker_temperature": 0.0,
            "talker_repetition_penalty": 1.0}  # fmt: skip
    upstream: dict[str, list] = {rid: [] for rid in prompts}
    for rid, text in prompts.items():
        thinker.add(rid, {"messages": [{"role": "user", "content": text}]}, base)
    while thinker.has_work():
        for out in thinker.step():
            upstream[out.request_id].append(out.payload)
    fed = 4  # thinker token states the talker gets for "a": it can then sample 4 codes
    prompt_a = len(upstream["a"][0]["prompt_token_ids"]) + 2
    prompt_b = len(upstream["b"][0]["prompt_token_ids"]) + 2
    assert prompt_a - prompt_b >= 10
    max_len = prompt_a + fed - 1  # "a" fills its slot exactly when it runs out of input
    (_, talker), _ = _omni(omni_dir, {"kv_cache": "static", "max_model_len": max_len})
    talker.add("a", chunk(0, upstream["a"][0], False, {}, {}), {**base, "talker_max_tokens": 50},
               streaming=True)  # fmt: skip
    for payload in upstream["a"][1 : 1 + fed]:
        talker.feed("a", chunk(0, payload, False, {}, {}), False)
    talker.add("b", full({0: upstream["b"]}, {}), {**base, "talker_max_tokens": fed + 4})
    codes: dict[str, int] = {"a": 0, "b": 0}
    errors: dict[str, str] = {}
    ends: dict[str, dict] = {}
    while talker.has_work():
        for out in talker.step():
            if out.error:
                errors[out.request_id] = out.error
            codes[out.request_id] += "codes" in out.payload
            if out.finished:
                ends[out.request_id] = out.payload
    assert not errors
    assert ends["a"]["finish_reason"] == "length" and "codes" in ends["a"]  # the codec gets its last code
    assert ends["a"]["completion_tokens"] == fed
    assert codes["a"] == fed and codes["b"] == fed + 4
    assert not talker.seqs and talker.slots.owners == []
