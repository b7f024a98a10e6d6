"""First-chunk priority in the stage engines: order and step counts, never timing.

GenerationEngine: a request's first window is decoded before any other
request's later windows, in a step of its own, filling a batch cap first, and
bulk is not starved. HfAREngine: a request that arrives while others decode is
prefilled in a step without a decode forward. Outputs are the same with
priority on and off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.generation import MAX_FIRST_ONLY_STEPS, GenerationEngine  # noqa: E402
from omni_actors.workers.engines.generation_adapter import GenerationAdapter  # noqa: E402

TOY = f"{__name__}:RecordingAdapter"


class RecordingAdapter(GenerationAdapter):
    """Sample j of code i = code[i] + 0.5 code[i-1]; records each decode's windows.

    The sample rate is so high that a streaming request's audio is worth nothing in time:
    its deadline is its first audio, so by deadline alone bulk goes before a later arrival.
    """

    sample_rate = 10**9
    samples_per_code = 2
    chunk_size = 4
    first_chunk_size = 2
    left_context = 1
    right_context = 0
    decodes: list[list[tuple[int, int]]] = []
    """Per decode call: (window length, first code value) of each window."""

    def load(self) -> None:
        RecordingAdapter.decodes = []

    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return torch.as_tensor(inputs["codes"], dtype=torch.float32) if "codes" in inputs else None

    def decode(self, windows, starts, data):
        RecordingAdapter.decodes.append([(len(w), s) for w, s in zip(windows, starts, strict=True)])
        out = []
        for w in windows:
            prev = torch.cat([w[:1] * 0, w[:-1]])
            out.append((w + 0.5 * prev).repeat_interleave(self.samples_per_code))
        return out


def _ctx(**extras: Any) -> EngineContext:
    return EngineContext(
        stage_id=2, replica=0, model_stage="code2wav", model_path=None, device="cpu",
        max_num_seqs=16, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": TOY, **extras},
    )  # fmt: skip


def _codes(rid: str, n: int) -> np.ndarray:
    seed = sum(map(ord, rid))
    return np.random.default_rng(seed).integers(1, 100, n).astype(np.float32)


def _mid_stream(engine: GenerationEngine, rids: list[str], got: dict[str, list]) -> None:
    """Each of `rids` streams, has its first audio out, then has 20 more codes ready (bulk)."""
    for rid in rids:
        engine.add(rid, {}, {}, streaming=True)
        engine.feed(rid, {"codes": _codes(rid, 40)[:2]}, last=False)
    _run(engine, got)
    assert all(got[rid] for rid in rids)
    for rid in rids:
        engine.feed(rid, {"codes": _codes(rid, 40)[2:22]}, last=False)


def _run(
    engine: GenerationEngine, got: dict[str, list], steps: int | None = None
) -> list[list[str]]:
    """Step until idle (or `steps` times); each step's request ids."""
    order = []
    while engine.has_work() and (steps is None or len(order) < steps):
        outs = engine.step()
        order.append([o.request_id for o in outs])
        for o in outs:
            got.setdefault(o.request_id, []).append(o.payload["audio"])
    return order


@pytest.mark.parametrize("priority", [True, False])
def test_a_new_request_first_window_goes_before_nine_streams_bulk(priority):
    engine = GenerationEngine(_ctx(first_chunk_priority=priority))
    got: dict[str, list] = {}
    busy = [f"m{i}" for i in range(9)]
    _mid_stream(engine, busy, got)
    engine.add("new", {}, {}, streaming=True)
    engine.feed("new", {"codes": _codes("new", 40)[:2]}, last=False)
    RecordingAdapter.decodes = []
    order = _run(engine, got, steps=2)
    if priority:  # the next step is the new request's first window alone, the bulk the one after
        assert order == [["new"], busy]
        assert RecordingAdapter.decodes == [[(2, 0)], [(1 + 16, 1)] * 9]
    else:  # by deadline alone the streams (their audio is due) go first
        assert order == [busy, ["new"]]


def test_first_windows_fill_a_capped_batch_first():
    # 2-code first windows, at most 4 window codes a decode: two first windows a step.
    engine = GenerationEngine(_ctx(max_batch_codes=4))
    got: dict[str, list] = {}
    _mid_stream(engine, ["m0", "m1"], got)
    new = ["n0", "n1", "n2", "n3", "n4"]
    for rid in new:
        engine.add(rid, {}, {}, streaming=True)
        engine.feed(rid, {"codes": _codes(rid, 40)[:3]}, last=False)
    order = _run(engine, got, steps=5)
    assert order == [["n0", "n1"], ["n2", "n3"], ["n4"], ["m0"], ["m1"]]


def test_ten_requests_at_once_all_get_their_first_window_in_one_step():
    engine = GenerationEngine(_ctx())
    got: dict[str, list] = {}
    rids = [f"r{i}" for i in range(10)]
    for rid in rids:
        engine.add(rid, {}, {}, streaming=True)
        engine.feed(rid, {"codes": _codes(rid, 40)[:2]}, last=False)
    assert _run(engine, got) == [rids]
    assert RecordingAdapter.decodes == [[(2, 0)] * 10]


def test_bulk_waits_at_most_max_first_only_steps():
    engine = GenerationEngine(_ctx())
    got: dict[str, list] = {}
    _mid_stream(engine, ["m"], got)
    served_at = None
    for step in range(MAX_FIRST_ONLY_STEPS + 3):  # a new arrival before every step
        engine.add(f"n{step}", {}, {}, streaming=True)
        engine.feed(f"n{step}", {"codes": _codes("n", 40)[:2]}, last=False)
        ids = [o.request_id for o in engine.step()]
        if "m" in ids and served_at is None:
            served_at = step
    assert served_at == MAX_FIRST_ONLY_STEPS  # 8 first-only steps, then the bulk's turn


def test_audio_is_the_same_with_priority_on_and_off():
    results = []
    for priority in (True, False):
        engine = GenerationEngine(_ctx(first_chunk_priority=priority, max_batch_codes=12))
        got: dict[str, list] = {}
        rids = [f"r{i}" for i in range(6)]
        for k in range(16):  # r_n arrives in round n; every stream gets 3 codes a round
            if k < len(rids):
                engine.add(rids[k], {}, {}, streaming=True)
            for n, rid in enumerate(rids):
                lo = 3 * (k - n)
                if 0 <= lo < 30:
                    engine.feed(rid, {"codes": _codes(rid, 30)[lo : lo + 3]}, last=lo + 3 >= 30)
            _run(engine, got, steps=1)
        _run(engine, got)
        results.append({rid: np.concatenate(got[rid]) for rid in rids})
    on, off = results
    for rid, audio in on.items():
        assert audio.shape == (60,)
        np.testing.assert_array_equal(audio, off[rid])


def test_first_chunk_priority_must_be_a_bool():
    with pytest.raises(ValueError, match="first_chunk_priority"):
        GenerationEngine(_ctx(first_chunk_priority="yes"))


# ---- HfAREngine --------------------------------------------------------------

LLM = "omni_actors.workers.engines.hf_ar:CausalLMAdapter"
PARAMS = {"max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from omni_actors.models.tiny import make_tiny

    return make_tiny("llama", tmp_path_factory.mktemp("llama"), seed=0)


def _ar(path: Path, **extras: Any):
    from omni_actors.workers.engines.hf_ar import HfAREngine

    return HfAREngine(EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device="cpu", max_num_seqs=16,
        dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": LLM, **extras},
    ))  # fmt: skip


def _ar_step(engine, tokens: dict[str, list[int]]) -> list[str]:
    outs = engine.step()
    for o in outs:
        assert o.error is None, o.error
        tokens.setdefault(o.request_id, []).extend(o.payload["token_ids"])
    return [o.request_id for o in outs]


@pytest.mark.parametrize("priority", [True, False])
def test_a_request_arriving_mid_decode_is_prefilled_without_a_decode(llama_dir, priority):
    engine = _ar(llama_dir, first_chunk_priority=priority)
    tokens: dict[str, list[int]] = {}
    busy = [f"r{i}" for i in range(9)]
    for i, rid in enumerate(busy):
        engine.add(rid, {"prompt": f"request number {i} says"}, PARAMS)
    assert _ar_step(engine, tokens) == busy  # nine prompts, one step (nothing was decoding)
    assert _ar_step(engine, tokens) == busy
    engine.add("new", {"prompt": "a late arrival"}, PARAMS)
    if priority:
        assert _ar_step(engine, tokens) == ["new"]  # its first token, no decode forward
        assert sorted(_ar_step(engine, tokens)) == sorted([*busy, "new"])  # then everyone decodes
    else:
        assert sorted(_ar_step(engine, tokens)) == sorted(["new", *busy])
    while engine.has_work():
        _ar_step(engine, tokens)
    alone = _ar(llama_dir, first_chunk_priority=priority)
    alone.add("new", {"prompt": "a late arrival"}, PARAMS)
    ref: dict[str, list[int]] = {}
    while alone.has_work():
        _ar_step(alone, ref)
    assert tokens["new"] == ref["new"] and len(ref["new"]) == 6
    assert all(len(tokens[rid]) == 6 for rid in busy)


def test_arrivals_every_step_do_not_starve_running_requests(llama_dir):
    engine = _ar(llama_dir)
    tokens: dict[str, list[int]] = {}
    engine.add("old", {"prompt": "the first request"}, {"max_tokens": 20, "ignore_eos": True})
    _ar_step(engine, tokens)
    decoded = []
    for i in range(10):  # a new request before every step
        engine.add(f"n{i}", {"prompt": f"arrival {i}"}, {"max_tokens": 1})
        decoded.append("old" in _ar_step(engine, tokens))
    assert decoded == [False, True] * 5  # prefill-only steps never come twice in a row
