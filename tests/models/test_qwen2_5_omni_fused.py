"""Qwen2.5-Omni's thinker and talker under engine_extras.fused_decode: the fused step's
logits (and, for the thinker, the hidden states its talker reads) are the stage's own
forward's, and greedy outputs are the same with the fused step on and off.

The fused step reads each stage through its adapter's `fused_model` (the thinker: Qwen2 layers
and LM head, returning the input embedding and the last normed state; the talker: the
thinker-to-talker projection, Qwen2 layers, codec head); both use the multimodal rotary, the
plain rotary at decode, which this checks on the tiny checkpoint's real classes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import structlog

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402
from omni_actors.workers.engines.hf_ar_fused import FusedDecoder  # noqa: E402
from omni_actors.workers.engines.hf_ar_warm import warm_graphs  # noqa: E402

PARAMS = {"max_tokens": 6, "ignore_eos": True, "talker_max_tokens": 20, "talker_temperature": 0.0,
          "talker_ignore_eos": True}
PROMPTS = ([{"role": "user", "content": "Hello! How are you?"}],
           [{"role": "user", "content": "Say something longer, please."}])


def _ctx(stage: int, path: Path, **extras) -> EngineContext:
    spec = get_pipeline("qwen2_5_omni").stages[stage]
    return EngineContext(
        stage_id=stage, replica=0, model_stage=spec.model_stage, model_path=path, device="cpu",
        max_num_seqs=4, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={**spec.engine_defaults, **extras},
    )  # fmt: skip


def _outputs(engine: HfAREngine, inputs: dict[str, dict], peek=None) -> dict[str, list]:
    """Every request's payloads, stepping the engine to the end; `peek(engine)` between steps."""
    got: dict[str, list] = {}
    for rid, inp in inputs.items():
        engine.add(rid, inp, PARAMS)
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            got.setdefault(out.request_id, []).append(out.payload)
        if peek is not None and any(s.prefilled and not s.finished for s in engine.seqs.values()):
            peek(engine)
    return got


THINKER_INPUTS = {f"r{i}": {"messages": m} for i, m in enumerate(PROMPTS)}


@pytest.fixture(scope="module")
def talker_inputs(tiny_model) -> tuple[Path, dict[str, dict]]:
    """The tiny checkpoint and, per request, the talker's inputs from the real thinker."""
    path = tiny_model("qwen2_5_omni")
    thinker = HfAREngine(_ctx(0, path))
    got = _outputs(thinker, THINKER_INPUTS)
    thinker.close()
    processor = resolve(get_pipeline("qwen2_5_omni").stages[1].processor)
    return path, {rid: processor({0: outs}, {}) for rid, outs in got.items()}


def _codes(engine: HfAREngine, inputs: dict[str, dict], peek=None) -> dict[str, list[int]]:
    return {
        rid: [c for p in outs for c in np.asarray(p.get("codes", [])).tolist()]
        for rid, outs in _outputs(engine, inputs, peek).items()
    }


class NextStepBothWays:
    """A peek: the engine's next decode step run as the fused step and as the stage's own forward
    over the same slots; logits (and any hidden states handed on) must agree."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, engine: HfAREngine) -> None:
        seqs = [s for s in engine.seqs.values() if s.prefilled and not s.finished]
        with torch.inference_mode():
            batch, length = engine.slots.shape_for()
            rows = engine.slots.load_inputs(batch, seqs, engine.adapter.decode_embeds(seqs))
            want = engine._static_forward(batch, length).rows(rows)
            got = engine.fused.forward(batch, length).rows(rows)
        torch.testing.assert_close(got.logits.float(), want.logits.float(), atol=1e-4, rtol=1e-4)
        for g, w in zip(got.hidden or (), want.hidden or (), strict=True):  # what a talker is sent
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        self.steps += 1


def test_fused_thinker_step_equals_its_own_forward(talker_inputs):
    path, _ = talker_inputs
    plain = HfAREngine(_ctx(0, path, kv_cache="static"))
    fused = HfAREngine(_ctx(0, path, kv_cache="static", fused_decode=True, lookahead=False))  # peek steps too
    assert isinstance(fused.fused, FusedDecoder) and fused.fused.hidden and fused.fused.from_ids
    peek = NextStepBothWays()
    want = _outputs(plain, THINKER_INPUTS)
    got = _outputs(fused, THINKER_INPUTS, peek)
    assert peek.steps >= 4
    for rid, outs in want.items():
        assert [o["token_ids"] for o in got[rid]] == [o["token_ids"] for o in outs]
        for g, w in zip(got[rid][1:], outs[1:], strict=True):
            np.testing.assert_allclose(g["hidden"], w["hidden"], atol=1e-4)
            np.testing.assert_allclose(g["embeds"], w["embeds"], atol=1e-6)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_step", "transformers_step"])
def test_thinker_payloads_same_with_lookahead_on_and_off(talker_inputs, fused):
    """The thinker's decode input is its last token's embedding, so its greedy steps are queued one
    ahead of the host (hf_ar_lookahead.py); what its talker is sent must not change."""
    path, _ = talker_inputs
    ahead = HfAREngine(_ctx(0, path, kv_cache="static", fused_decode=fused, lookahead=True))
    assert ahead.lookahead
    queued = []
    got = _outputs(ahead, THINKER_INPUTS, peek=lambda e: queued.append(e.ahead is not None))
    want = _outputs(HfAREngine(_ctx(0, path, kv_cache="static", fused_decode=fused, lookahead=False)),
                    THINKER_INPUTS)  # fmt: skip
    assert sum(queued) >= 3
    for rid, outs in want.items():
        assert [o["token_ids"] for o in got[rid]] == [o["token_ids"] for o in outs]
        for g, w in zip(got[rid][1:], outs[1:], strict=True):
            np.testing.assert_allclose(g["hidden"], w["hidden"], atol=1e-5)
            np.testing.assert_array_equal(g["embeds"], w["embeds"])


def test_fused_talker_step_equals_its_own_forward(talker_inputs):
    path, inputs = talker_inputs
    plain = HfAREngine(_ctx(1, path, kv_cache="static"))
    fused = HfAREngine(_ctx(1, path, kv_cache="static", fused_decode=True))
    assert plain.fused is None
    assert isinstance(fused.fused, FusedDecoder) and not fused.fused.from_ids and not fused.fused.hidden
    peek = NextStepBothWays()
    want = _codes(plain, inputs)
    got = _codes(fused, inputs, peek)
    assert peek.steps >= 10
    assert got == want and all(len(c) == PARAMS["talker_max_tokens"] for c in got.values())


@pytest.mark.parametrize("stage", [0, 1], ids=["thinker", "talker"])
def test_warm_up_request_runs_and_leaves_nothing_behind(talker_inputs, stage):
    """warm_graphs runs the thinker's one-word prompt, or the talker's zero payload, through a
    prefill and a decode step (on CUDA it then captures, and compiles, every bucket); afterwards
    the engine holds no request or slot and decodes real inputs exactly as an engine that never
    warmed up."""
    path, inputs = talker_inputs
    inputs = THINKER_INPUTS if stage == 0 else inputs
    warm = HfAREngine(_ctx(stage, path, kv_cache="static", fused_decode=True))
    with structlog.testing.capture_logs() as logs:
        warm_graphs(warm)
    assert [e for e in logs if e["event"] == "hf_ar.warm_failed"] == []
    assert [e["event"] for e in logs if e["event"] == "hf_ar.graphs_warmed"] == ["hf_ar.graphs_warmed"]
    assert not warm.seqs and not warm.slots.owners and warm.ahead is None
    cold = HfAREngine(_ctx(stage, path, kv_cache="static", fused_decode=True))
    if stage == 1:
        assert _codes(warm, inputs) == _codes(cold, inputs)
    else:
        ids = [{rid: [p["token_ids"] for p in outs] for rid, outs in _outputs(e, inputs).items()} for e in (warm, cold)]
        assert ids[0] == ids[1] and all(ids[0].values())
