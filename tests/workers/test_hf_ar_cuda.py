"""HfAREngine on CUDA: CUDA-graph replays decode exactly like the same static steps run eagerly.

Marked `gpu` (not in the default suite): `pytest -m gpu tests/workers/test_hf_ar_cuda.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402

pytestmark = pytest.mark.gpu
PROMPTS = ["Hello there", "The quick brown fox jumps", "A", "Once upon a time there was"]


def _engine(path: Path, **extras) -> HfAREngine:
    """The transformers step (these tests are about its graphs) unless `extras` say otherwise."""
    ctx = EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device="cuda",
        max_num_seqs=4, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": "omni_actors.workers.engines.hf_ar:CausalLMAdapter",
                       "max_model_len": 256, "fused_decode": False, **extras},
    )  # fmt: skip
    return HfAREngine(ctx)


def _run(engine: HfAREngine) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):  # different lengths and budgets: rows join and leave
        engine.add(f"r{i}", {"prompt": prompt}, {"max_tokens": 20 + 15 * i, "ignore_eos": True})
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            got.setdefault(out.request_id, []).extend(out.payload["token_ids"])
    return got


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphs_decode_like_eager_static(tmp_path):
    path = make_tiny("llama", tmp_path / "llama", seed=0)
    graphs = _engine(path)
    assert graphs.static and graphs.graphs.enabled  # the defaults on CUDA
    first = _run(graphs)
    again = _run(graphs)  # every bucket replays now
    assert graphs.graphs.enabled and len(graphs.graphs.graphs) >= 2
    eager = _run(_engine(path, cuda_graphs=False))
    assert first == eager and again == eager
    assert [len(first[f"r{i}"]) for i in range(4)] == [20, 35, 50, 65]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_bucket_is_captured_at_start_and_decodes_like_lazy_captures(tmp_path):
    """warm_graphs: every (batch, length) bucket is captured before the first request, the
    warm-up request leaves nothing behind, and requests decode exactly as with buckets captured
    when first used (the default)."""
    path = make_tiny("llama", tmp_path / "llama", seed=0)
    warm = _engine(path, warm_graphs=True)
    slots = warm.slots
    assert not warm.seqs and not slots.owners and warm.ahead is None
    assert len(warm.graphs.graphs) == len(slots.batch_sizes) * len(slots.length_sizes), sorted(warm.graphs.graphs)
    lazy = _engine(path)
    assert len(lazy.graphs.graphs) == 0
    assert _run(warm) == _run(lazy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_default_is_the_fused_step_compiled_a_layer_at_a_time(tmp_path):
    """No extras on CUDA: the fused step, compiled with compile_scope "layer" (one layer's code
    for every layer), in CUDA graphs; it decodes the transformers step's tokens (float32)."""
    path = make_tiny("llama", tmp_path / "llama", seed=0)
    ctx = EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device="cuda",
        max_num_seqs=4, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": "omni_actors.workers.engines.hf_ar:CausalLMAdapter", "max_model_len": 256},
    )  # fmt: skip
    default = HfAREngine(ctx)
    fused = default.fused
    assert fused is not None and default.graphs.enabled
    assert fused._layer is not fused.layer_step and fused._head is not fused.head_step  # compiled
    got = _run(default)
    assert got == _run(_engine(path, cuda_graphs=False))

