"""HfAREngine's lookahead (engine_extras lookahead, hf_ar_lookahead.py) on CPU.

When a step's input is the last token's embedding (embedded on the device, or by the
fused step itself), a greedy decode step is queued before the host takes the one before it. Real engines over a tiny random-weight Llama: the
token streams must equal the step-by-step engine's while requests join, finish at
different lengths, are aborted with a step queued, and run into the KV limit (ending with "length"); a step
is really queued ahead (not silently skipped); sampled rows are never queued ahead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402
from tests.workers.test_hf_ar_fused import SCHEDULE, _build, _ctx, _prompt, _run  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("llama_ahead"), "llama")


def _engine(path: Path, ahead: bool = True, fused: bool = True, **extras) -> HfAREngine:
    return HfAREngine(_ctx(path, kv_cache="static", fused_decode=fused, lookahead=ahead, **extras))


def _queued(counts: dict):
    def peek(engine: HfAREngine) -> None:
        counts["ahead"] += engine.ahead is not None
        counts["steps"] += 1

    return peek


@pytest.mark.parametrize("fused", [True, False], ids=["fused_step", "transformers_step"])
def test_streams_equal_the_step_by_step_engine(llama_dir, fused):
    counts = {"ahead": 0, "steps": 0}
    engine = _engine(llama_dir, fused=fused)
    assert engine.lookahead
    on = _run(engine, peek=_queued(counts))
    off = _run(_engine(llama_dir, ahead=False, fused=fused))
    assert on == off
    assert [len(on[f"r{i}"]) for i in range(len(SCHEDULE))] == [n for _, n, _ in SCHEDULE]
    assert counts["ahead"] >= counts["steps"] // 3 > 0  # most steps had the next one queued
    assert engine.thrown_away == 0  # a row at its max_tokens is seen coming: no step queued past it
    assert engine.ahead is None and engine.slots.owners == [] and not engine.has_work()


def test_sampled_rows_are_never_queued_ahead(llama_dir):
    counts = {"ahead": 0, "steps": 0}
    params = {"temperature": 0.8, "seed": 3}
    on = _run(_engine(llama_dir), params, peek=_queued(counts))
    assert counts["steps"] > 5 and counts["ahead"] == 0
    assert on == _run(_engine(llama_dir, ahead=False), params)


def _drain(engine: HfAREngine, abort_at: int | None = None) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = {}
    for i, n in enumerate((5, 9, 7)):
        engine.add(f"a{i}", {"prompt_token_ids": _prompt(n, 10 + i)}, {"max_tokens": 12, "ignore_eos": True})
    step = 0
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            ids.setdefault(out.request_id, []).extend(out.payload["token_ids"])
        step += 1
        if step == abort_at:
            assert engine.ahead is not None  # the abort lands while a step is queued
            engine.abort("a0")  # slot 0: the last slot's request moves into it
            assert engine.ahead is None
    return ids


def test_an_abort_with_a_step_queued_leaves_the_others_exact(llama_dir):
    want = _drain(_engine(llama_dir, ahead=False))
    got = _drain(_engine(llama_dir), abort_at=4)
    assert got["a1"] == want["a1"] and got["a2"] == want["a2"]
    assert 0 < len(got["a0"]) < 12 and got["a0"] == want["a0"][: len(got["a0"])]


def test_the_kv_limit_ends_the_same_request_at_the_same_token(llama_dir):
    def run(ahead: bool) -> tuple[dict, dict, dict]:
        engine = _engine(llama_dir, ahead=ahead)  # max_model_len 48
        engine.add("long", {"prompt_token_ids": _prompt(40, 1)}, {"max_tokens": 30, "ignore_eos": True})
        engine.add("short", {"prompt_token_ids": _prompt(4, 2)}, {"max_tokens": 20, "ignore_eos": True})
        ids: dict[str, list[int]] = {}
        errors: dict[str, str] = {}
        reasons: dict[str, str] = {}
        while engine.has_work():
            for out in engine.step():
                if out.error:
                    errors[out.request_id] = out.error
                else:
                    ids.setdefault(out.request_id, []).extend(out.payload["token_ids"])
                if out.finished and not out.error:
                    reasons[out.request_id] = out.payload["finish_reason"]
        assert engine.thrown_away == 0  # a row whose cache fills is seen coming: no step queued past it
        return ids, errors, reasons

    on, off = run(True), run(False)
    assert on == off
    ids, errors, reasons = on
    assert not errors and reasons == {"long": "length", "short": "length"}  # the cache's end, max_tokens
    assert len(ids["long"]) == 48 - 40 + 1 and len(ids["short"]) == 20  # the prefill gives one more


def test_lookahead_is_a_bool_for_the_static_cache_and_off_on_a_cpu_by_default(llama_dir):
    with pytest.raises(ValueError, match="lookahead"):
        _engine(llama_dir, ahead="yes")
    assert not HfAREngine(_ctx(llama_dir, kv_cache="dynamic", lookahead=True)).lookahead  # no slots
    assert not HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True)).lookahead  # off on a CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fused", [True, False], ids=["fused_step", "transformers_step"])
def test_under_cuda_graphs_the_streams_equal_the_step_by_step_ones(llama_dir, fused):
    """float32 on CUDA: queued steps are graph replays whose inputs were written on the device."""
    counts = {"ahead": 0, "steps": 0}
    engine = _engine(llama_dir, fused=fused, device="cuda")
    assert engine.lookahead and engine.graphs.enabled
    first, again = _run(engine), _run(engine, peek=_queued(counts))  # the second run replays every bucket
    off = _run(_engine(llama_dir, ahead=False, fused=fused, device="cuda"))
    assert first == off and again == off
    assert counts["ahead"] >= counts["steps"] // 3 > 0
