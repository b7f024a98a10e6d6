"""Guided decoding on the transformers AR engine: what a JSON-schema mask costs a decode step.

The tiny Qwen2.5-Omni thinker (random weights, `omni-run make-tiny qwen2_5_omni`) driven directly
(no workers): batches of B requests decode N tokens each, plain (the baseline, same run) and with
every row guided by a JSON schema (llguidance, hf_ar_grammar.py), alternating in rounds. The
schema is open enough (an array of 400 enum words) that no row ends early, so both modes do the
same number of steps. Reports ms per decode step, p50 over rounds, and guided / plain.

    .venv/bin/python scripts/bench_hf_guided.py                   # batch 1 and 8, 32 tokens
    .venv/bin/python scripts/bench_hf_guided.py --device cuda --batch 1 16

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

ROUNDS = 5
MSGS = [{"role": "user", "content": "List colors."}]
SCHEMA = {"type": "array", "minItems": 400, "items": {"type": "string", "enum": ["red", "green", "blue"]}}


def run(engine, batch: int, tokens: int, guided: bool) -> float:
    """ms per decode step for one batch of `batch` requests of `tokens` tokens."""
    params = {"max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    if guided:
        params["structured_outputs"] = {"json": SCHEMA}
    for i in range(batch):
        engine.add(f"r{i}", {"messages": MSGS}, dict(params))
    engine.step()  # the prefill step
    steps, t0 = 0, time.perf_counter()
    while engine.has_work():
        engine.step()
        steps += 1
    return (time.perf_counter() - t0) * 1000 / max(steps, 1)


def main(args: argparse.Namespace) -> dict:
    from omni_actors.config.pipeline import get_pipeline, resolve
    from omni_actors.models.tiny import make_tiny
    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines.torch_setup import one_cpu_thread

    with tempfile.TemporaryDirectory(prefix="bench-hf-guided-") as tmp:
        path = make_tiny("qwen2_5_omni", Path(tmp) / "tiny", seed=0)
        spec = get_pipeline("qwen2_5_omni").stage(0)
        ctx = EngineContext(stage_id=0, replica=0, model_stage="thinker", model_path=path, device=args.device,
                            max_num_seqs=max(args.batch), dtype="float32", gpu_memory_utilization=0.5,
                            tensor_parallel_size=1, engine_extras=dict(spec.engine_defaults))
        one_cpu_thread(ctx)
        engine = resolve(spec.engine)(ctx)
        run(engine, 1, 4, True)  # warm-up: the grammar compiler built, code paths taken
        results = {}
        for b in args.batch:
            plain, guided = [], []
            for _ in range(ROUNDS):
                plain.append(run(engine, b, args.tokens, False))
                guided.append(run(engine, b, args.tokens, True))
            p, g = float(np.median(plain)), float(np.median(guided))
            results[f"b{b}"] = {"plain_step_ms": round(p, 3), "guided_step_ms": round(g, 3),
                                "guided_over_plain": round(g / p, 3)}
        engine.close()
    return {"bench": "hf_guided", "model": "tiny-qwen2_5_omni-thinker", "device": args.device,
            "tokens": args.tokens, "rounds": ROUNDS, "results": results}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=32)
    print(json.dumps(main(ap.parse_args())))
