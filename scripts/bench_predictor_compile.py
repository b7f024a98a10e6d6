"""Qwen3-Omni's code predictor at real size: what its compile costs at start-up, cold and warm.

The talker is the Qwen3-Omni stage ready last on a cold start (docs/benchmarks.md, "Ninth H200
session"): its `engine.depth_passes` phase compiles the predictor's straight-line pass and captures
every batch bucket's frame. This times that phase alone, without the rest of the pipeline, in a
fresh process per start: a cold start (an empty inductor cache folder), then a warm one (the same
folder), per variant. Each start reports the phase, dynamo's own compile-time breakdown, and the
frame's time at batch 1 and at the largest bucket after it (so a faster start-up that costs frame
time shows). Variants are engine_extras (JSON) plus environment settings; the first is the same-run
baseline.

    python3 scripts/bench_predictor_compile.py --device cuda --max-num-seqs 10 \
        --variant '{}' --variant '{"depth_passes": "fused"}'

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FRAMES = 30
"""Frames timed per batch size after the start."""


def child(args: argparse.Namespace) -> None:
    import torch
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    from omni_actors.models.qwen3_omni_moe.predictor import CodePredictorRunner
    from omni_actors.workers.engine import StartupClock
    from scripts.make_sized_qwen_omni import sized_config_qwen3

    extras = json.loads(args.extras)
    t0 = time.perf_counter()
    tc = sized_config_qwen3(args.layers_scale).talker_config
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(tc, dtype=dtype).eval()
    built = time.perf_counter() - t0
    ctx = SimpleNamespace(
        device=args.device, max_num_seqs=args.max_num_seqs, engine_extras=extras, startup=StartupClock()
    )
    t1 = time.perf_counter()
    runner = CodePredictorRunner(talker, ctx, tc.num_code_groups)
    start_s = time.perf_counter() - t1
    out = {"build_s": round(built, 2), "runner_s": round(start_s, 2), "mode": runner.mode,
           "sizes": runner.sizes, "phases": {k: round(v, 2) for k, v in ctx.startup.phases.items()}}  # fmt: skip
    try:
        from torch._dynamo.utils import compilation_time_metrics

        out["dynamo"] = {k: round(sum(v), 3) for k, v in compilation_time_metrics.items() if sum(v) > 0.05}
        from torch._dynamo.utils import counters

        out["dynamo_counters"] = {k: dict(v) for k, v in counters.items() if v and k != "inductor"}
    except Exception as err:  # only a report
        out["dynamo"] = f"{type(err).__name__}: {err}"
    hidden = torch.randn(args.max_num_seqs, tc.text_config.hidden_size, dtype=dtype, device=args.device)
    first = torch.randint(0, 1000, (args.max_num_seqs,), device=args.device)
    frames = {}
    for n in (1, args.max_num_seqs):
        times = []
        for _ in range(FRAMES + 3):
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            runner.run(hidden[:n], first[:n], [True] * n, [None] * n)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        times = sorted(times[3:])
        frames[f"b{n}"] = round(times[len(times) // 2], 3)
    out["frame_ms_p50"] = frames
    print("RESULT " + json.dumps(out), flush=True)


def start(args: argparse.Namespace, extras: str, env: dict[str, str], cache: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--extras", extras, "--device", args.device,
           "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
           "--layers-scale", str(args.layers_scale)]  # fmt: skip
    full_env = {**os.environ, **env, "TORCHINDUCTOR_CACHE_DIR": cache}
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": proc.returncode, "stderr": proc.stderr[-2000:]}
    return {**json.loads(lines[-1][len("RESULT ") :]), "process_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=10)
    ap.add_argument("--layers-scale", type=int, default=1)
    ap.add_argument("--variant", action="append", default=None,
                    help="engine_extras JSON, optionally followed by ' ENV=VALUE ...'")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--extras", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = {}
    for variant in args.variant or ["{}"]:
        extras, _, rest = variant.partition("} ")
        extras = extras if extras.endswith("}") else extras + "}"
        env = dict(kv.split("=", 1) for kv in rest.split())
        with tempfile.TemporaryDirectory(prefix="predictor-compile-") as cache:
            results[variant] = {"cold": start(args, extras, env, cache), "warm": start(args, extras, env, cache)}
    print(json.dumps({"bench": "predictor_compile", "device": args.device, "dtype": args.dtype,
                      "max_num_seqs": args.max_num_seqs, "results": results}))  # fmt: skip


if __name__ == "__main__":
    main()
