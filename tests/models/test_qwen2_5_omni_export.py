"""The Qwen2.5-Omni thinker exported as a Qwen2 causal LM: same model for text, served by vLLM."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.qwen2_5_omni.export import export_thinker_lm  # noqa: E402

MESSAGES = [{"role": "user", "content": "Tell me a short story about a cat."}]


@pytest.fixture(scope="module")
def omni(tiny_model) -> Path:
    return tiny_model("qwen2_5_omni")


@pytest.fixture(scope="module")
def exported(omni, tmp_path_factory) -> Path:
    return export_thinker_lm(omni, tmp_path_factory.mktemp("thinker-lm"))


def test_export_is_a_qwen2_folder_without_towers(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["vocab_size"] == 152064 and config["head_dim"] == 32
    assert config["eos_token_id"] == 151645
    from safetensors import safe_open

    with safe_open(str(exported / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert all(n.startswith(("model.", "lm_head.")) for n in names)
    assert (exported / "chat_template.jinja").is_file()


def test_export_equals_the_thinker_on_text(omni, exported):
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        Qwen2_5OmniThinkerForConditionalGeneration,
    )

    tok = AutoTokenizer.from_pretrained(exported)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    lm = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        omni, config=AutoConfig.from_pretrained(omni).thinker_config, dtype=torch.float32,
        key_mapping={r"^thinker\.": ""},
    ).eval()  # fmt: skip
    with torch.no_grad():
        a, b = lm(ids).logits, thinker(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    ga = lm.generate(ids, max_new_tokens=8, do_sample=False)
    gb = thinker.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert ga.tolist() == gb.tolist()


@pytest.mark.slow  # (26 s: a vLLM engine on the export; the export's weights are checked in the default suite)
def test_vllm_serves_the_export(exported, tmp_path):
    pytest.importorskip("vllm")
    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines.vllm_ar import VllmAREngine

    ctx = EngineContext(
        stage_id=0, replica=0, model_stage="thinker", model_path=exported, device="cpu",
        max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"max_model_len": 256, "kv_cache_space_gib": 1, "cache_dir": str(tmp_path)},
    )  # fmt: skip
    engine = VllmAREngine(dataclasses.replace(ctx))
    try:
        engine.add("r", {"messages": MESSAGES}, {"max_tokens": 6, "temperature": 0.0})
        tokens, finished = [], False
        for _ in range(200):
            for out in engine.step():
                tokens.extend(out.payload.get("token_ids") or [])
                finished = finished or out.finished
            if finished:
                break
        assert finished and 1 <= len(tokens) <= 6
    finally:
        engine.close()


def _omni_run(*args: str) -> subprocess.CompletedProcess:
    """The CLI in its own process (it configures logging for its process)."""
    cmd = [sys.executable, "-m", "omni_actors.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_export_and_a_clear_error(omni, tmp_path):
    assert _omni_run("export-thinker", str(omni), str(tmp_path / "lm")).returncode == 0
    assert (tmp_path / "lm" / "model.safetensors").is_file()
    bad = _omni_run("export-thinker", str(tmp_path / "missing"), str(tmp_path / "x"))
    assert bad.returncode == 2
    assert "missing: model folder not found" in bad.stderr
