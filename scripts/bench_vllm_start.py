"""Start-up of a vLLM stage engine with a new cache folder against one an earlier start filled.

vLLM inspects a model class in a subprocess the first time its cache folder sees it; the
engine's caches now default to `<data dir>/cache/vllm`, so a restart finds them. This starts
the vLLM engine three times on one checkpoint: with an empty cache folder (what every start
paid when the caches lived in the engine's private folder: the same-run baseline), then
twice with that folder (a restart). One JSON line.

    python scripts/bench_vllm_start.py                 # a tiny Llama from make_tiny (CPU)
    python scripts/bench_vllm_start.py --model DIR --device cuda
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.vllm_ar import VllmAREngine


def start_s(model: Path, cache: Path, device: str) -> float:
    ctx = EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=model, device=device, max_num_seqs=4,
        dtype="auto", gpu_memory_utilization=0.3, tensor_parallel_size=1,
        engine_extras={"max_model_len": 512, "kv_cache_space_gib": 1, "cache_dir": str(cache)},
    )  # fmt: skip
    t0 = time.perf_counter()
    engine = VllmAREngine(ctx)
    took = time.perf_counter() - t0
    engine.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-start-") as tmp:
        model = args.model or make_tiny("llama", Path(tmp) / "llama", seed=0)
        cache = Path(tmp) / "cache"
        cold = start_s(model, cache, args.device)
        warm = [start_s(model, cache, args.device) for _ in range(2)]
    print(json.dumps({"bench": "vllm_start", "model": str(args.model or "make_tiny llama"), "device": args.device,
                      "new_cache_s": round(cold, 2), "warm_cache_s": [round(w, 2) for w in warm],
                      "speedup": round(cold / min(warm), 2)}))


if __name__ == "__main__":
    main()
