"""Depth decoders / code predictors on fused_passes.PassStack: the same codes as the transformers passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.fused_passes import min_bucket, passes_mode  # noqa: E402

TEXT = "Hello there, this is a test of the depth passes."


def _ctx(path: Path, stage: str, extras: dict, device: str = "cpu") -> EngineContext:
    return EngineContext(
        stage_id=0, replica=0, model_stage=stage, model_path=path, device=device, max_num_seqs=4,
        dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1, engine_extras=extras,
    )  # fmt: skip


def test_mode_defaults_and_checks(tmp_path):
    assert passes_mode(_ctx(tmp_path, "s", {})) == "transformers"
    assert passes_mode(_ctx(tmp_path, "s", {}, "cuda"), fused_default=False) == "transformers"
    assert passes_mode(_ctx(tmp_path, "s", {}, "cuda")) == "compiled"
    assert passes_mode(_ctx(tmp_path, "s", {"enforce_eager": True}, "cuda")) == "transformers"
    with pytest.raises(ValueError, match="depth_passes"):
        passes_mode(_ctx(tmp_path, "s", {"depth_passes": "fast"}))
    assert min_bucket(_ctx(tmp_path, "s", {})) == 16
    for bad in (0, True, "4"):
        with pytest.raises(ValueError, match="depth_min_bucket"):
            min_bucket(_ctx(tmp_path, "s", {"depth_min_bucket": bad}))


def _csm_codes(path: Path, mode: str, params: list[dict], device: str = "cpu", **more) -> np.ndarray:
    from omni_actors.workers.engines.hf_ar import HfAREngine

    extras = {"adapter": "omni_actors.models.csm.backbone:CsmBackboneAdapter", "depth_passes": mode, **more}
    engine = HfAREngine(_ctx(path, "backbone", extras, device))
    try:
        assert engine.adapter.depth.mode == mode
        assert (engine.fused is not None) == bool(more.get("fused_decode"))
        for i, p in enumerate(params):
            engine.add(f"r{i}", {"text": TEXT, "voice": str(i % 2)}, {"max_tokens": 5, **p})
        codes: dict[str, list] = {f"r{i}": [] for i in range(len(params))}
        while engine.has_work():
            for out in engine.step():
                assert out.error is None, out.error
                if "codes" in out.payload:
                    codes[out.request_id].append(out.payload["codes"])
        return np.stack([np.concatenate(codes[f"r{i}"]) for i in range(len(params))])
    finally:
        engine.close()


def test_csm_fused_passes_draw_the_transformers_codes(tiny_model):
    path = tiny_model("csm")
    # seeded: the depth decoder samples (the checkpoint's depth generation config)
    params = [{"temperature": 0.0, "seed": 1}, {"temperature": 0.9, "seed": 7}, {"seed": 3}]
    want = _csm_codes(path, "transformers", params)
    got = _csm_codes(path, "fused", params)
    assert want.shape == (3, 5, 4)  # the tiny CSM has 4 codebooks
    np.testing.assert_array_equal(got, want)
    # and the backbone's decode on the fused step (static slots), against the same slots unfused
    static = _csm_codes(path, "fused", params, kv_cache="static")
    fused = _csm_codes(path, "fused", params, kv_cache="static", fused_decode=True)
    np.testing.assert_array_equal(fused, static)
    # and the prompts bucketed (the CUDA default, replayed there as graphs; eager here)
    bucketed = _csm_codes(path, "fused", params, kv_cache="static", prefill_graphs=True)
    np.testing.assert_array_equal(bucketed, static)


def _talker_codes(path: Path, pipeline: str, mode: str, device: str = "cpu") -> np.ndarray:
    """Codes of three requests (greedy, seeded sampling x2) through the family's talker engine."""
    from omni_actors.config.pipeline import get_pipeline, resolve

    pipe = get_pipeline(pipeline)
    specs = pipe.stages[:2] if pipeline == "qwen3_omni_moe" else pipe.stages[:1]
    extras = {"depth_passes": mode}
    engines = [resolve(s.engine)(_ctx(path, s.model_stage, {**s.engine_defaults, **extras}, device)) for s in specs]
    try:
        talker = engines[-1]
        assert talker.adapter.predictor.mode == mode
        seeds = {"a": 5, "b": 11, "c": 12}  # a: a greedy talker (its predictor may still sample)
        params = {"max_tokens": 4, "ignore_eos": True, "talker_max_tokens": 4, "talker_ignore_eos": True}
        inputs = {rid: {"text": TEXT, "voice": "vivian"} for rid in seeds}
        if pipeline == "qwen3_omni_moe":
            thinker, to_talker = engines[0], resolve(pipe.stages[1].processor)
            upstream: dict[str, list] = {rid: [] for rid in seeds}
            for rid in seeds:
                thinker.add(rid, {"messages": [{"role": "user", "content": TEXT}]}, params)
            while thinker.has_work():
                for out in thinker.step():
                    upstream[out.request_id].append(out.payload)
            inputs = {rid: to_talker({0: upstream[rid]}, {}) for rid in seeds}
        for rid, seed in seeds.items():
            temp = 0.0 if rid == "a" else 0.9
            sampling = {"temperature": temp, "talker_temperature": temp, "seed": seed}
            talker.add(rid, inputs[rid], {**params, **sampling})
        codes: dict[str, list] = {rid: [] for rid in seeds}
        while talker.has_work():
            for out in talker.step():
                assert out.error is None, out.error
                if "codes" in out.payload:
                    codes[out.request_id].append(out.payload["codes"])
        return np.stack([np.concatenate(codes[rid]) for rid in seeds])
    finally:
        for e in engines:
            e.close()


@pytest.mark.parametrize("pipeline", ["qwen3_omni_moe", "qwen3_tts"])
def test_code_predictor_fused_passes_draw_the_transformers_codes(tiny_model, pipeline):
    path = tiny_model(pipeline)
    want = _talker_codes(path, pipeline, "transformers")
    got = _talker_codes(path, pipeline, "fused")
    assert want.shape[0] == 3 and want.shape[1] >= 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", ["csm", "qwen3_omni_moe"])  # qwen3_tts: opt-in, see its _Runner
def test_compiled_passes_in_cuda_graphs_draw_the_transformers_codes(tiny_model, pipeline):
    """float32 on CUDA: the compiled straight-line passes, replayed as a CUDA graph, against the
    transformers passes (also graphed) — the same codes."""
    path = tiny_model(pipeline)
    if pipeline == "csm":
        params = [{"temperature": 0.0, "seed": 1}, {"temperature": 0.9, "seed": 7}, {"seed": 3}]
        want, got = (_csm_codes(path, m, params, "cuda", fused_decode=False) for m in ("transformers", "compiled"))
    else:
        want, got = (_talker_codes(path, pipeline, m, "cuda") for m in ("transformers", "compiled"))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("more", "sizes"), [
    pytest.param({}, [4], marks=pytest.mark.slow),  # (50 s of CPU compile; on CUDA the gpu test covers it)
    pytest.param({"depth_min_bucket": 2}, [2, 4], marks=pytest.mark.slow),  # (26 s of CPU compile; the same code path)
])
def test_compiled_passes_compile_once_for_every_batch_and_draw_the_transformers_codes(tiny_model, more, sizes):
    """`compiled` (the CUDA default; inductor compiles on the CPU too): batches up to
    depth_min_bucket rows share one bucket, compiled with static shapes; past it the pass is
    compiled with its batch symbolic and no batch-1 bucket. Either way one compile serves every
    bucket, and the codes are the transformers passes'."""
    from torch._dynamo.utils import counters

    from omni_actors.config.pipeline import get_pipeline, resolve

    path = tiny_model("qwen3_omni_moe")
    np.testing.assert_array_equal(
        _talker_codes(path, "qwen3_omni_moe", "compiled"), _talker_codes(path, "qwen3_omni_moe", "transformers")
    )
    spec = get_pipeline("qwen3_omni_moe").stages[1]
    extras = {**spec.engine_defaults, "depth_passes": "compiled", **more}
    engine = resolve(spec.engine)(_ctx(path, spec.model_stage, extras))
    try:
        runner = engine.adapter.predictor
        assert runner.sizes == sizes  # max_num_seqs 4
        before = counters["stats"]["unique_graphs"]
        with torch.inference_mode():
            runner.graphs.run(runner.sizes[0], 0)
            first = counters["stats"]["unique_graphs"]
            assert first - before <= 1  # (none when an engine before this one compiled the same shapes)
            for batch in runner.sizes[1:]:
                runner.graphs.run(batch, 0)
        assert counters["stats"]["unique_graphs"] == first
    finally:
        engine.close()
