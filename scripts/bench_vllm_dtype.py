"""The vLLM stage engine on CPU in float32 against bfloat16 (with the plain rotary embedding), same run.

Starts `VllmAREngine` twice on one checkpoint (default: the bundled assistant's LLM, prepared on
first use), `dtype: float32` first (the same-run baseline, what `auto` runs on CPU), then
`dtype: bfloat16`. Each answers a factual question greedily (the answers are printed: bfloat16 once
answered it wrongly on AMX CPUs, vllm_backend.CPU_BF16_CUSTOM_OPS) and decodes `--tokens` tokens
for `--batch` requests at once, best of `--rounds`. One JSON line: ms per step and tokens/s for each,
and the speed-up.

    python scripts/bench_vllm_dtype.py [--model DIR] [--batch 1 4] [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.vllm_ar import VllmAREngine
from omni_actors.workers.engines.vllm_backend import cpu_dtype

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]
MAX_STEPS = 10_000


def _drain(engine: VllmAREngine) -> dict[str, str]:
    texts: dict[str, str] = {}
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return texts
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.payload.get("text", "")
    raise RuntimeError("the engine did not finish")


def measure(model: Path, dtype: str, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    ctx = EngineContext(
        stage_id=1, replica=0, model_stage="llm", model_path=model, device="cpu", max_num_seqs=max(args.batch),
        dtype=dtype, gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"max_model_len": 1024, "kv_cache_space_gib": 1, "cache_dir": str(cache)},
    )  # fmt: skip
    t0 = time.perf_counter()
    engine = VllmAREngine(ctx)
    row: dict[str, Any] = {"dtype": dtype, "runs_as": cpu_dtype(dtype), "startup_s": round(time.perf_counter() - t0, 2)}
    try:
        engine.add("q", {"messages": QUESTION}, {"temperature": 0.0, "max_tokens": 24})
        row["answer"] = _drain(engine)["q"].strip()
        for batch in args.batch:
            best = float("inf")
            for r in range(args.rounds):
                for i in range(batch):
                    engine.add(f"s{batch}-{r}-{i}", {"messages": STORY},
                               {"temperature": 0.0, "max_tokens": args.tokens, "ignore_eos": True})
                t = time.perf_counter()
                _drain(engine)
                best = min(best, time.perf_counter() - t)
            row[f"b{batch}_ms_per_step"] = round(best / args.tokens * 1000, 1)
            row[f"b{batch}_tokens_per_s"] = round(batch * args.tokens / best, 1)
    finally:
        engine.close()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="a causal LM folder (default: the assistant's LLM)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = args.model
    if model is None:
        from omni_actors.models.prepare import prepare

        model = prepare("assistant") / "llm"
    with tempfile.TemporaryDirectory(prefix="bench-vllm-dtype-") as tmp:
        rows = [measure(model, dtype, Path(tmp), args) for dtype in ("float32", "bfloat16")]
    speedup = {f"b{b}": round(rows[0][f"b{b}_ms_per_step"] / rows[1][f"b{b}_ms_per_step"], 2) for b in args.batch}
    print(json.dumps({"bench": "vllm_dtype", "model": str(model), "cpus": os.cpu_count(),
                      "omp_threads": os.environ.get("OMP_NUM_THREADS"), "tokens": args.tokens, "rounds": args.rounds,
                      "results": rows, "speedup_bf16_vs_float32": speedup,
                      "same_answer": rows[0]["answer"] == rows[1]["answer"]}))


if __name__ == "__main__":
    main()
