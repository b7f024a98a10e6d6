"""Diffusion benchmark: images/s of the DiffusionEngine and the served runtime vs diffusers called directly.

Baseline, measured in the same run: the diffusers pipeline called directly in
one process with each --concurrency value as its batch size (default one image
per call and four prompts per call). Against it: the DiffusionEngine driven
in-process at each concurrency (that many compatible requests in flight are one
batch), which isolates the engine's stepping overhead; and the served path
(`served_rates`: orchestrator plus a real worker process, max_num_seqs = the
largest concurrency, no HTTP).

    .venv/bin/python scripts/bench_diffusion.py                 # tiny SD checkpoint, CPU
    .venv/bin/python scripts/bench_diffusion.py --family qwen_image --size 64 --steps 4   # a tiny image family
    .venv/bin/python scripts/bench_diffusion.py --model DIR --device cuda --dtype bfloat16 --size 1024 --steps 6 \
        --images 4 --repeats 1                                  # Qwen-Image-sized (make_sized_qwen_image.py)

Each rate is the best of --repeats runs (the box may be shared). `--order sequential` (the default)
measures direct, then engine, then served, each loaded alone; `--order interleaved` loads all three and
measures a round of each in turn per repeat, so a host whose speed drifts over minutes moves them alike
(peak memory is then not read). Prints one JSON line; besides the
rates it carries, per batch size / concurrency:
    direct_step_ms          median denoising step of the direct calls (device-synchronised step callback),
                            each call's first step left out
    direct_call_overhead_ms a call's wall time minus its steps: text encoding, VAE decode, postprocess
    direct_peak_gb          torch.cuda.max_memory_allocated over the direct measurement (null off CUDA)
    engine_peak_gb          the same for the in-process engine
    served_s_per_image      1 / served images/s at concurrency 1
    served_step_ms          median gap between the served c1 requests' per-step progress outputs at the
                            orchestrator (no device sync in the worker: the pace steps are issued at)
    served_gpu_used_gb      nvidia-smi used memory of the whole device after the served run, workers up
                            (every process: this one's CUDA context too); served_gpu_used_before_gb is the
                            same reading before the workers started (null without nvidia-smi)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.gpu_mem import free_cached, gpu_used_gb, peak_gb, reset_peak
from scripts.served_rates import concurrency_list

PROMPT = "a photo of a cat sitting on the red chair in the garden"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="diffusers folder; default: build a tiny one")
    ap.add_argument("--kind", default="sd", help="tiny checkpoint kind when --model is not given")
    ap.add_argument("--family", help="tiny image family (omni-run make-tiny NAME) instead of --kind")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", type=int, default=32, help="image side in pixels")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--images", type=int, default=16, help="images per measurement")
    ap.add_argument("--concurrency", type=concurrency_list, default=[1, 4],
                    help="comma list of served/engine concurrencies; the direct batch sizes (default 1,4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--repeats", type=int, default=3, help="best of N for each number (shared box)")
    ap.add_argument("--order", choices=("sequential", "interleaved"), default="sequential",
                    help="sequential: direct, then engine, then served, each loaded alone (peak memory read); "
                         "interleaved: all three loaded, a round of each in turn per repeat (fairer ratios "
                         "on a host whose speed drifts; needs memory for three copies of the model)")
    ap.add_argument(
        "--no-served", dest="served", action="store_false", help="skip the runtime part"
    )
    return ap.parse_args()


def direct_kwargs(args: argparse.Namespace) -> Any:
    import torch

    def kwargs(batch: int, seed: int) -> dict[str, Any]:
        return {
            "prompt": [PROMPT] * batch, "num_inference_steps": args.steps, "width": args.size,
            "height": args.size, "output_type": "np",
            "generator": [torch.Generator("cpu").manual_seed(seed + i) for i in range(batch)],
        }  # fmt: skip

    return kwargs


def bench_engine(engine: Any, args: argparse.Namespace, concurrency: int,
                 repeats: int | None = None) -> tuple[float, float | None]:
    """(images/s, peak GiB) of the DiffusionEngine with `concurrency` one-image requests in flight."""
    params = {"num_inference_steps": args.steps, "width": args.size, "height": args.size}

    def round_(tag: str) -> None:
        for i in range(concurrency):
            engine.add(f"{tag}-{i}", {"prompt": PROMPT}, {**params, "seed": i})
        while engine.has_work():
            for out in engine.step():
                if out.error:
                    raise RuntimeError(out.error)

    round_("warm")
    rounds = max(1, args.images // concurrency)

    def once(k: int) -> float:
        start = time.perf_counter()
        for r in range(rounds):
            round_(f"{k}-{r}")
        return rounds * concurrency / (time.perf_counter() - start)

    reset_peak(args.device)
    best = max(once(k) for k in range(repeats or args.repeats))
    return best, peak_gb(args.device)


def _served_deploy(model: Path, args: argparse.Namespace) -> Any:
    from omni_actors.config.deploy import build_deploy

    return build_deploy(
        {
            "pipeline": "diffusion",
            "model": str(model),
            "stages": [{"stage_id": 0, "max_num_seqs": max(args.concurrency), "dtype": args.dtype}],
        },
        source="bench_diffusion",
    )


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"num_inference_steps": args.steps, "width": args.size, "height": args.size}


def bench_served(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Served images/s at each concurrency, plus start-up seconds, step pace and GPU memory.

    "Served" here is the runtime without HTTP: the in-process orchestrator and
    a real DIFFUSION worker process (the `diffusion` pipeline on `model`,
    max_num_seqs = the largest concurrency), requests through `Orchestrator.submit` (served_rates.py).
    """
    from scripts.served_rates import served_rates

    return served_rates(_served_deploy(model, args), {"prompt": PROMPT}, _params(args), "images", args.images,
                        args.repeats, args.concurrency)


def bench_interleaved(pipe: Any, engine: Any, model: Path, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """--order interleaved: the direct pipeline, the in-process engine and the served runtime all loaded
    at once, measured in turn, one round of each per repeat and concurrency (a host whose speed drifts
    over minutes moves all three alike); each rate is the best round. Returns what the sequential path's
    direct_rates, bench_engine and bench_served return, less the peak memory readings (all three share
    this process's GPU allocations: null)."""
    import statistics

    from scripts.direct_rates import direct_rates
    from scripts.served_rates import ServedRun

    conc = args.concurrency
    run = ServedRun(_served_deploy(model, args), {"prompt": PROMPT}, _params(args), "images")
    try:
        direct_runs: dict[int, list[dict[str, Any]]] = {c: [] for c in conc}
        engine_best = dict.fromkeys(conc, 0.0)
        served_best = dict.fromkeys(conc, 0.0)
        for c in conc:
            run.rate(c, 1, record=False)  # warm-up (the direct and engine rounds warm up themselves)
        for _ in range(args.repeats):
            for c in conc:
                direct_runs[c].append(direct_rates(pipe, direct_kwargs(args), [c], args.images, 1, args.device)[c])
                engine_best[c] = max(engine_best[c], bench_engine(engine, args, c, repeats=1)[0])
                served_best[c] = max(served_best[c], run.rate(c, max(1, args.images // c)))
        served: dict[str, Any] = {"startup_s": run.startup_s, "gpu_used_before_gb": run.gpu_used_before_gb,
                                  "gpu_used_gb": gpu_used_gb(), **{f"c{c}": served_best[c] for c in conc}}
    finally:
        run.close()
    served["step_ms"] = run.step_ms

    def median(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    direct = {c: {"rate": max(r["rate"] for r in rs), "peak_gb": None,
                  "step_ms": median([r["step_ms"] for r in rs]),
                  "call_overhead_ms": median([r["call_overhead_ms"] for r in rs])} for c, rs in direct_runs.items()}
    return direct, {c: (engine_best[c], None) for c in conc}, served


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines.diffusion import DiffusionEngine, load_pipeline
    from scripts.direct_rates import direct_rates

    conc = args.concurrency
    with tempfile.TemporaryDirectory(prefix="bench-diffusion-") as tmp:
        model = args.model
        if model is None:
            from omni_actors.models.tiny import make_tiny
            from omni_actors.models.tiny.diffusion import make_tiny_diffusion

            if args.family:
                model = make_tiny(args.family, Path(tmp) / "tiny", seed=0)
            else:
                model = make_tiny_diffusion(Path(tmp) / "tiny", seed=0, kind=args.kind)
        pipe = load_pipeline(model, args.device, args.dtype)
        if args.order == "sequential":
            direct = direct_rates(pipe, direct_kwargs(args), conc, args.images, args.repeats, args.device)
            del pipe
            free_cached(args.device)
        ctx = EngineContext(
            stage_id=0,
            replica=0,
            model_stage="diffusion",
            model_path=Path(model),
            device=args.device,
            max_num_seqs=max(conc),
            dtype=args.dtype,
            gpu_memory_utilization=0.9,
            tensor_parallel_size=1,
        )
        engine = DiffusionEngine(ctx)
        if args.device == "cpu":
            torch.set_num_threads(args.threads)  # the engine sets one thread; keep the baseline's
        if args.order == "interleaved":
            direct, engine_runs, served = bench_interleaved(pipe, engine, Path(model), args)
            engine.close()
        else:
            engine_runs = {c: bench_engine(engine, args, c) for c in conc}
            engine.close()
            del engine
            free_cached(args.device)  # the worker process below needs the memory; nvidia-smi then reads it alone
            served = bench_served(Path(model), args) if args.served else None

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    lo, hi = conc[0], conc[-1]
    engine_ips = {c: v[0] for c, v in engine_runs.items()}
    result = {
        "bench": "diffusion",
        "model": str(args.model) if args.model else f"tiny-{args.family or args.kind}",
        "device": args.device,
        "dtype": args.dtype,
        "size": args.size,
        "steps": args.steps,
        "threads": args.threads if args.device == "cpu" else None,
        "images_per_measurement": args.images,
        "repeats": args.repeats,
        "order": args.order,
        "concurrency": conc,
        "direct_images_per_s": {f"batch{b}": r(v["rate"]) for b, v in direct.items()},
        "engine_images_per_s": {f"c{c}": r(v) for c, v in engine_ips.items()},
        "served_images_per_s": {f"c{c}": r(served[f"c{c}"]) for c in conc} if served else None,
        "served_vs_direct": {f"c{c}": r(served[f"c{c}"] / direct[c]["rate"]) for c in conc}
        if served
        else None,
        "served_startup_s": r(served["startup_s"]) if served else None,
        "engine_vs_direct": {f"c{c}": r(engine_ips[c] / direct[c]["rate"]) for c in conc},
        "engine_batching_gain": r(engine_ips[hi] / engine_ips[lo]),
        "direct_batching_gain": r(direct[hi]["rate"] / direct[lo]["rate"]),
        "direct_step_ms": {f"batch{b}": r(v["step_ms"]) for b, v in direct.items()},
        "direct_call_overhead_ms": {f"batch{b}": r(v["call_overhead_ms"]) for b, v in direct.items()},
        "direct_peak_gb": {f"batch{b}": v["peak_gb"] for b, v in direct.items()},
        "engine_peak_gb": {f"c{c}": v[1] for c, v in engine_runs.items()},
        "served_s_per_image": r(1 / served["c1"]) if served and "c1" in served else None,
        "served_step_ms": r(served["step_ms"]) if served else None,
        "served_gpu_used_before_gb": served["gpu_used_before_gb"] if served else None,
        "served_gpu_used_gb": served["gpu_used_gb"] if served else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
