"""Diffusion benchmark: images/s of the DiffusionEngine (and later the served runtime) vs diffusers called directly.

Baseline, measured in the same run: the diffusers pipeline called directly in
one process, one image per call (batch 1) and four prompts per call (batch 4).
Against it: the DiffusionEngine driven in-process at concurrency 1 and 4 (four
compatible requests in flight are one batch), which isolates the engine's
stepping overhead; and the served path (`bench_served`: orchestrator plus a
real worker process, no HTTP).

    .venv/bin/python scripts/bench_diffusion.py                 # tiny SD checkpoint, CPU
    .venv/bin/python scripts/bench_diffusion.py --family qwen_image --size 64 --steps 4   # a tiny image family
    .venv/bin/python scripts/bench_diffusion.py --model DIR --device cuda --size 512 --steps 20

Each number is the best of --repeats runs (the box may be shared). Prints one JSON line.
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
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--repeats", type=int, default=3, help="best of N for each number (shared box)")
    ap.add_argument(
        "--no-served", dest="served", action="store_false", help="skip the runtime part"
    )
    return ap.parse_args()


def bench_direct(pipe: Any, args: argparse.Namespace, batch: int) -> float:
    """Images/s calling `pipe(...)` directly with `batch` prompts per call."""
    import torch

    def call(seed: int) -> None:
        gens = [torch.Generator("cpu").manual_seed(seed + i) for i in range(batch)]
        pipe(
            prompt=[PROMPT] * batch,
            num_inference_steps=args.steps,
            width=args.size,
            height=args.size,
            generator=gens,
            output_type="np",
        )

    call(0)  # warm-up
    calls = max(1, args.images // batch)

    def once() -> float:
        start = time.perf_counter()
        for c in range(calls):
            call(c * batch)
        return calls * batch / (time.perf_counter() - start)

    return max(once() for _ in range(args.repeats))


def bench_engine(engine: Any, args: argparse.Namespace, concurrency: int) -> float:
    """Images/s of the DiffusionEngine with `concurrency` one-image requests in flight."""
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

    return max(once(k) for k in range(args.repeats))


def bench_served(model: Path, args: argparse.Namespace) -> dict[str, float] | None:
    """Served images/s at concurrency 1 and 4, plus start-up seconds.

    "Served" here is the runtime without HTTP: the in-process orchestrator and
    a real DIFFUSION worker process (the `diffusion` pipeline on `model`,
    max_num_seqs 4), requests through `Orchestrator.submit` (served_rates.py).
    """
    from omni_actors.config.deploy import build_deploy
    from scripts.served_rates import served_rates

    params = {"num_inference_steps": args.steps, "width": args.size, "height": args.size}
    deploy = build_deploy(
        {
            "pipeline": "diffusion",
            "model": str(model),
            "stages": [{"stage_id": 0, "max_num_seqs": 4, "dtype": args.dtype}],
        },
        source="bench_diffusion",
    )
    return served_rates(deploy, {"prompt": PROMPT}, params, "images", args.images, args.repeats)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines.diffusion import DiffusionEngine, load_pipeline

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
        direct = {b: bench_direct(pipe, args, b) for b in (1, 4)}
        del pipe
        ctx = EngineContext(
            stage_id=0,
            replica=0,
            model_stage="diffusion",
            model_path=Path(model),
            device=args.device,
            max_num_seqs=4,
            dtype=args.dtype,
            gpu_memory_utilization=0.9,
            tensor_parallel_size=1,
        )
        engine = DiffusionEngine(ctx)
        if args.device == "cpu":
            torch.set_num_threads(args.threads)  # the engine sets one thread; keep the baseline's
        engine_ips = {c: bench_engine(engine, args, c) for c in (1, 4)}
        engine.close()
        del engine
        served = bench_served(Path(model), args) if args.served else None

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    result = {
        "bench": "diffusion",
        "model": str(args.model) if args.model else f"tiny-{args.family or args.kind}",
        "device": args.device,
        "size": args.size,
        "steps": args.steps,
        "threads": args.threads if args.device == "cpu" else None,
        "images_per_measurement": args.images,
        "repeats": args.repeats,
        "direct_images_per_s": {f"batch{b}": r(v) for b, v in direct.items()},
        "engine_images_per_s": {f"c{c}": r(v) for c, v in engine_ips.items()},
        "served_images_per_s": {f"c{c}": r(served[f"c{c}"]) for c in (1, 4)} if served else None,
        "served_vs_direct": {f"c{c}": r(served[f"c{c}"] / direct[c]) for c in (1, 4)}
        if served
        else None,
        "served_startup_s": r(served["startup_s"]) if served else None,
        "engine_vs_direct": {f"c{c}": r(engine_ips[c] / direct[c]) for c in (1, 4)},
        "engine_batching_gain": r(engine_ips[4] / engine_ips[1]),
        "direct_batching_gain": r(direct[4] / direct[1]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
