"""Loading Qwen-Omni parts and causal LMs on CPU: every weight exactly as stored (float32 here), on
the CPU, and the seconds counted as start-up phases. (On CUDA the same calls load straight onto
the device, `weights_device_map`; the CPU path is the one a CPU box can check.)"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.qwen2_5_omni.loading import load_codec, load_config, load_part, load_tensor  # noqa: E402
from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext, direct_load  # noqa: E402
from omni_actors.workers.engines.hf_ar_causal import CausalLMAdapter  # noqa: E402
from omni_actors.workers.engines.torch_setup import weights_device_map  # noqa: E402


def _ctx(path: Path, dtype: str = "auto") -> EngineContext:
    return EngineContext(
        stage_id=0, replica=0, model_stage="x", model_path=path, device="cpu", max_num_seqs=1, dtype=dtype,
        gpu_memory_utilization=0.5, tensor_parallel_size=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def omni_dir(tiny_model) -> Path:
    return tiny_model("qwen3_omni_moe")


def _stored(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"
    ]
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out.update(load_file(path / name))
    return out


def test_cpu_loads_where_it_always_did(omni_dir: Path) -> None:
    assert weights_device_map(_ctx(omni_dir)) is None  # no device_map on CPU: from_pretrained as before
    assert direct_load(_ctx(omni_dir)) is True  # (on by default; it only changes an accelerator's load)
    with pytest.raises(ValueError, match="direct_load"):
        direct_load(replace(_ctx(omni_dir), engine_extras={"direct_load": "yes"}))


def test_a_codec_loads_every_stored_weight_unchanged_in_float32(omni_dir: Path) -> None:
    from transformers import Qwen3OmniMoeCode2Wav

    ctx = _ctx(omni_dir, dtype="bfloat16")  # (the codec is float32 whatever the stage's dtype)
    model, _ = load_codec(ctx, Qwen3OmniMoeCode2Wav, "code2wav_config", "code2wav")
    stored = {k.removeprefix("code2wav."): v for k, v in _stored(omni_dir).items() if k.startswith("code2wav.")}
    params = dict(model.state_dict())
    assert stored and set(stored) <= set(params)
    for name, value in stored.items():
        assert params[name].device.type == "cpu" and params[name].dtype == torch.float32, name
        assert torch.equal(params[name], value.float()), name
    assert not model.training
    assert ctx.startup.phases["weights"] > 0 and ctx.startup.phases["config"] > 0


def test_the_thinker_part_and_a_lone_tensor_load_unchanged(omni_dir: Path) -> None:
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    ctx = _ctx(omni_dir)
    config = load_config(omni_dir, ctx).thinker_config
    model = load_part(Qwen3OmniMoeThinkerForConditionalGeneration, omni_dir, config, "thinker", ctx)
    params = dict(model.state_dict())
    stored = {k.removeprefix("thinker."): v for k, v in _stored(omni_dir).items() if k.startswith("thinker.")}
    same = [k for k in stored if k in params]  # (per-expert weights are fused on load: other names)
    assert len(same) > len(stored) // 2
    for name in same:
        assert params[name].device.type == "cpu" and params[name].dtype == torch.float32, name
        assert torch.equal(params[name], stored[name].float()), name
    table = load_tensor(omni_dir, "thinker.model.embed_tokens.weight", ctx)
    assert table.device.type == "cpu"
    assert torch.equal(table, load_tensor(omni_dir, "thinker.model.embed_tokens.weight"))
    assert torch.equal(table, stored["model.embed_tokens.weight"])


def test_a_causal_lm_loads_unchanged_and_times_its_phases(tmp_path: Path) -> None:
    path = make_tiny("llama", tmp_path / "llama", seed=0)
    ctx = _ctx(path, dtype="bfloat16")  # (CPU loads float32 whatever the deploy says)
    adapter = CausalLMAdapter(ctx)
    model = adapter.load()
    params = dict(model.state_dict())
    for name, value in _stored(path).items():
        if name in params:
            assert params[name].device.type == "cpu" and params[name].dtype == torch.float32, name
            assert torch.equal(params[name], value.float()), name
    assert not model.training
    assert set(ctx.startup.phases) == {"weights", "processors"}
    assert all(v > 0 for v in ctx.startup.phases.values())
