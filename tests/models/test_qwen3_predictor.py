"""Qwen3-Omni-MoE's code predictor passes (predictor.py): seeded sampling is per request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402

MSGS = [{"role": "user", "content": "Hello! How are you?"}]


@pytest.fixture(scope="module")
def engines(tiny_model):
    path = tiny_model("qwen3_omni_moe")
    pipe = get_pipeline("qwen3_omni_moe")
    out = []
    for spec in pipe.stages[:2]:
        ctx = EngineContext(
            stage_id=spec.stage_id, replica=0, model_stage=spec.model_stage, model_path=Path(path),
            device="cpu", max_num_seqs=4, dtype="float32", gpu_memory_utilization=0.5,
            tensor_parallel_size=1, engine_extras=dict(spec.engine_defaults),
        )  # fmt: skip
        out.append(resolve(spec.engine)(ctx))
    return out, resolve(pipe.stages[1].processor)


def _codes(engines, seeds: dict[str, int]) -> dict[str, np.ndarray]:
    (thinker, talker), to_talker = engines
    params = {"max_tokens": 6, "ignore_eos": True, "talker_max_tokens": 6,
              "talker_temperature": 0.9, "talker_ignore_eos": True}  # fmt: skip
    upstream: dict[str, list] = {rid: [] for rid in seeds}
    for rid in seeds:
        thinker.add(rid, {"messages": MSGS}, params)
    while thinker.has_work():
        for out in thinker.step():
            upstream[out.request_id].append(out.payload)
    for rid, seed in seeds.items():
        talker.add(rid, to_talker({0: upstream[rid]}, {}), {**params, "seed": seed})
    codes: dict[str, list] = {rid: [] for rid in seeds}
    while talker.has_work():
        for out in talker.step():
            assert out.error is None, out.error
            if "codes" in out.payload:
                codes[out.request_id].append(out.payload["codes"])
    return {rid: np.concatenate(c) for rid, c in codes.items()}


def test_seeded_frames_repeat_alone_and_in_a_batch(engines):
    alone = _codes(engines, {"a": 11})["a"]
    together = _codes(engines, {"a": 11, "b": 12, "c": 11})
    assert alone.shape == (6, 16)
    np.testing.assert_array_equal(together["a"], alone)
    np.testing.assert_array_equal(together["c"], alone)
    assert not np.array_equal(together["b"], alone)


def _draw_by_sorting(logits, gumbel, top_k: int, top_p: float):
    """The code predictor's draw over a whole sort of the codebook (what `_draw` did before topk)."""
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    ordered = ordered.masked_fill(torch.arange(logits.shape[-1]) >= top_k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    ordered = ordered.masked_fill(probs.cumsum(-1) - probs > top_p, float("-inf"))
    return order.gather(1, torch.argmax(ordered + gumbel, dim=-1)[:, None])[:, 0]


@pytest.mark.parametrize(("top_k", "top_p"), [(50, 0.8), (1, 1.0), (7, 0.5), (2048, 0.9)])
def test_the_draw_ranks_only_the_top_k_and_picks_what_a_whole_sort_picks(top_k, top_p) -> None:
    from omni_actors.models.qwen3_omni_moe.predictor import _draw
    from omni_actors.workers.engines.hf_ar_sampling import gumbel_of

    gen = torch.Generator().manual_seed(top_k)
    logits = torch.randn(64, 2048, generator=gen) * 3
    gumbel = gumbel_of(torch.rand(64, 2048, generator=gen))
    gumbel[:8] = 0.0  # rows without noise take their argmax
    got = _draw(logits, gumbel, top_k, top_p)
    assert torch.equal(got, _draw_by_sorting(logits, gumbel, top_k, top_p))
    assert torch.equal(got[:8], logits[:8].argmax(-1))
