"""Qwen2.5-Omni Token2Wav window decode: CUDA graph replays against the eager decode, same run.

The code2wav adapter loads the same folder on the GPU once per mode: eager float32
(`cuda_graphs: false, precision: float32`, the path before token2wav_graphs: the baseline),
then CUDA graphs with float32, TF32 (the default) and bfloat16-autocast matmuls. Each decodes
the streaming windows the engine makes (first: 12 + 12 lookahead codes; later: 24 left +
24/48/96 new + 12 right) at batch 1 and 4, `--reps` times, after warm-up (a graphed shape is
captured by then). Differences are of the kept samples against the baseline's.

    python3 scripts/make_sized_qwen_omni.py /tmp/qo3b --device cuda --dtype bfloat16
    python3 scripts/bench_token2wav.py --model /tmp/qo3b

Prints one JSON line: ms per window (median) per shape and mode, the speed-up over the
baseline, the largest sample difference and the relative RMS difference from it, and ms per
second of audio kept.
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
MODES_ORDER = ("eager_fp32", "graphs_fp32", "graphs_tf32", "graphs_bf16")
SHAPES = ((24, 0, 12), (60, 24, 48), (84, 24, 72), (132, 24, 120))
"""(window codes, first kept code, end of kept codes): the engine's streaming windows."""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="Qwen2.5-Omni folder; default: the tiny one on CPU")
    ap.add_argument("--device", default=None, help="default: cuda with --model, else cpu")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--modes", default=",".join(MODES_ORDER), help="on CUDA; eager_fp32 first")
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


MODES = {
    "eager_fp32": {"cuda_graphs": False, "precision": "float32"},
    "graphs_fp32": {"precision": "float32"},
    "graphs_tf32": {"precision": "tf32"},
    "graphs_bf16": {"precision": "bfloat16"},
}
"""Each mode loads its own adapter (TF32 is process-wide: set by each load, before its captures)."""


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
    modes = args.modes.split(",") if device.startswith("cuda") else ["eager_fp32"]
    result: dict[str, Any] = {
        "bench": "token2wav", "model": str(args.model), "device": device, "reps": args.reps,
        "baseline": "eager_fp32", "load_s": {}, "shapes": {},
    }  # fmt: skip
    wants: dict[str, list] = {}
    for mode in modes:
        a = adapter(args.model, device, **MODES[mode])
        result["load_s"][mode] = round(a.load_s, 2)
        for n, lo, hi in SHAPES:
            for batch in batches:
                row = result["shapes"].setdefault(f"{n}codes_b{batch}", {})
                ms, got = time_shape(a, device, n, lo, hi, batch, args.reps)
                audio_s = batch * (hi - lo) * a.samples_per_code / a.sample_rate
                row[f"{mode}_ms"] = round(ms, 2)
                row[f"{mode}_ms_per_audio_s"] = round(ms / audio_s, 1)
                want = wants.setdefault(f"{n}_{batch}", got)
                if want is not got:
                    row[f"{mode}_speedup"] = round(row["eager_fp32_ms"] / ms, 2)
                    row[f"{mode}_max_abs_diff"] = round(max_diff(got, want), 6)
                    row[f"{mode}_rel_rms_diff"] = round(rel_rms(got, want), 6)
        if a.windows is not None:
            result.setdefault("graphs_captured", {})[mode] = len(a.windows.slots)
            result.setdefault("graphs_enabled", {})[mode] = a.windows.enabled
        del a
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()


def rel_rms(got: list, want: list) -> float:
    """RMS of the difference over RMS of the baseline, all windows together."""
    diff = sum(float(((g - w) ** 2).sum()) for (g, _), (w, _) in zip(got, want, strict=True))
    ref = sum(float((w**2).sum()) for w, _ in want)
    return (diff / max(ref, 1e-30)) ** 0.5


if __name__ == "__main__":
    main()
