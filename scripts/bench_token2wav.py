"""Qwen2.5-Omni Token2Wav window decode: CUDA graph replays against the eager decode, same run.

Two code2wav adapters load the same folder on the GPU: one eager (`cuda_graphs: false`, the
path before token2wav_graphs), one with CUDA graphs (the default on CUDA). Each decodes the
streaming windows the engine makes (first: 12 + 12 lookahead codes; later: 24 left + 24/48/96
new + 12 right) at batch 1 and 4, `--reps` times; the graphed one after it captured the shape.
`--tf32` adds a third pass of the graphed adapter with TF32 matmuls (process-wide, so last).

    python3 scripts/make_sized_qwen_omni.py /tmp/qo3b --device cuda --dtype bfloat16
    python3 scripts/bench_token2wav.py --model /tmp/qo3b --tf32

Prints one JSON line: ms per window (median) per shape and path, the speed-up, the largest
sample difference from the eager decode, and ms of GPU time per second of audio kept.
Without --model it builds the tiny checkpoint and runs on CPU (eager only: a smoke run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

ADAPTER = "omni_actors.models.qwen2_5_omni.code2wav:Qwen2_5OmniCode2WavAdapter"
SHAPES = ((24, 0, 12), (60, 24, 48), (84, 24, 72), (132, 24, 120))
"""(window codes, first kept code, end of kept codes): the engine's streaming windows."""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="Qwen2.5-Omni folder; default: the tiny one on CPU")
    ap.add_argument("--device", default=None, help="default: cuda with --model, else cpu")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tf32", action="store_true", help="also time the graphs with TF32 matmuls")
    return ap.parse_args()


def adapter(path: Path, device: str, **extras: Any) -> Any:
    from omni_actors.config.pipeline import resolve
    from omni_actors.workers.engine import EngineContext

    ctx = EngineContext(
        stage_id=2, replica=0, model_stage="code2wav", model_path=path, device=device,
        max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras=extras,
    )  # fmt: skip
    a = resolve(ADAPTER)(ctx)
    t0 = time.perf_counter()
    a.load()
    a.load_s = time.perf_counter() - t0
    return a


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_shape(a: Any, device: str, n: int, lo: int, hi: int, batch: int, reps: int) -> tuple[float, list]:
    gen = torch.Generator().manual_seed(n * 100 + batch)
    windows = [torch.randint(0, a.num_codes, (n,), generator=gen) for _ in range(batch)]
    starts = [lo * i for i in range(batch)]
    data = [{"speaker": "Chelsie", "seed": i} for i in range(batch)]
    keep = [(lo, hi)] * batch
    out = None
    for _ in range(3):  # warm-up; a graphed shape is captured by its second use
        out = a.decode_part(windows, starts, data, keep)
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        out = a.decode_part(windows, starts, data, keep)
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), [(w.float().cpu(), o) for w, o in out]


def max_diff(got: list, want: list) -> float:
    return max(float((g - w).abs().max()) for (g, _), (w, _) in zip(got, want, strict=True))


@torch.inference_mode()
def main() -> None:
    args = parse_args()
    tmp = None
    if args.model is None:
        from omni_actors.models.tiny import make_tiny

        tmp = tempfile.TemporaryDirectory()
        args.model = make_tiny("qwen2_5_omni", Path(tmp.name) / "q25", seed=0)
    device = args.device or ("cuda" if tmp is None else "cpu")
    batches = [int(b) for b in args.batches.split(",")]
    eager = adapter(args.model, device, cuda_graphs=False)
    graphed = adapter(args.model, device) if device.startswith("cuda") else None
    result: dict[str, Any] = {
        "bench": "token2wav", "model": str(args.model), "device": device, "reps": args.reps,
        "eager_load_s": round(eager.load_s, 2),
        "graphed_load_s": None if graphed is None else round(graphed.load_s, 2),
        "shapes": {},
    }  # fmt: skip
    wants: dict[str, list] = {}
    for n, lo, hi in SHAPES:
        for batch in batches:
            key = f"{n}codes_b{batch}"
            ms_eager, want = time_shape(eager, device, n, lo, hi, batch, args.reps)
            wants[key] = want
            row: dict[str, Any] = {"eager_ms": round(ms_eager, 2)}
            audio_s = batch * (hi - lo) * eager.samples_per_code / eager.sample_rate
            row["eager_ms_per_audio_s"] = round(ms_eager / audio_s, 1)
            if graphed is not None:
                ms, got = time_shape(graphed, device, n, lo, hi, batch, args.reps)
                row.update(graphed_ms=round(ms, 2), speedup=round(ms_eager / ms, 2))
                row["graphed_ms_per_audio_s"] = round(ms / audio_s, 1)
                row["max_abs_diff"] = round(max_diff(got, want), 6)
            result["shapes"][key] = row
    if graphed is not None and args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        for n, lo, hi in SHAPES:
            for batch in batches:
                row = result["shapes"][f"{n}codes_b{batch}"]
                ms, got = time_shape(graphed, device, n, lo, hi, batch, args.reps)
                row["graphed_tf32_ms"] = round(ms, 2)
                row["tf32_max_abs_diff"] = round(max_diff(got, wants[f"{n}codes_b{batch}"]), 6)
        result["graphs_captured"] = len(graphed.windows.slots)
    if graphed is not None:
        result["graphs_enabled"] = graphed.windows.enabled
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
