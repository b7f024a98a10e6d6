"""Video benchmark: videos/s served (orchestrator + a real video worker) vs diffusers called directly.

Baseline, measured in the same run: the pipeline called directly in one process,
one video per call (batch 1) and four prompts per call (batch 4). Against it: the
served runtime without HTTP (the in-process orchestrator and a real worker process
running `workers/engines/video.py`, the pipeline `omni-run --model` detects for the
folder, max_num_seqs 4) at concurrency 1 and 4 (four compatible requests in flight
are one batch). The MP4 encode is not counted (the same for both).

    .venv/bin/python scripts/bench_video.py                          # tiny Wan2.2, CPU
    .venv/bin/python scripts/bench_video.py --model DIR --device cuda --size 1280x704 --frames 121 --steps 10

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

PROMPT = "a cat walks on the beach at sunset"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="diffusers video folder; default: build the tiny wan2_2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", default="32x32", help="WxH")
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--videos", type=int, default=8, help="videos per measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--repeats", type=int, default=2)
    return ap.parse_args()


def bench_direct(pipe: Any, args: argparse.Namespace, batch: int) -> float:
    import torch

    width, height = (int(v) for v in args.size.split("x"))

    def call(seed: int) -> None:
        pipe(prompt=[PROMPT] * batch, num_frames=args.frames, width=width, height=height,
             num_inference_steps=args.steps, output_type="np",
             generator=[torch.Generator("cpu").manual_seed(seed + i) for i in range(batch)])

    call(0)  # warm-up
    rounds = max(1, args.videos // batch)

    def once() -> float:
        start = time.perf_counter()
        for r in range(rounds):
            call(r * batch)
        return rounds * batch / (time.perf_counter() - start)

    return max(once() for _ in range(args.repeats))


def bench_served(model: Path, args: argparse.Namespace) -> dict[str, float]:
    from omni_actors.config.deploy import build_deploy
    from omni_actors.models.detect import detect_pipeline
    from scripts.served_rates import served_rates

    width, height = (int(v) for v in args.size.split("x"))
    params = {"num_inference_steps": args.steps, "width": width, "height": height, "num_frames": args.frames}
    deploy = build_deploy({"pipeline": detect_pipeline(model), "model": str(model),
                           "stages": [{"stage_id": 0, "max_num_seqs": 4, "dtype": args.dtype}]},
                          source="bench_video")
    return served_rates(deploy, {"prompt": PROMPT}, params, "frames", args.videos, args.repeats)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from omni_actors.workers.engines.diffusion_loading import load_pipeline

    with tempfile.TemporaryDirectory(prefix="bench-video-") as tmp:
        model = args.model
        if model is None:
            from omni_actors.models.tiny import make_tiny

            model = make_tiny("wan2_2", Path(tmp) / "tiny-wan2_2", seed=0)
        pipe = load_pipeline(model, args.device, args.dtype)
        direct = {b: bench_direct(pipe, args, b) for b in (1, 4)}
        del pipe
        served = bench_served(Path(model), args)

    def r(x: float) -> float:
        return round(x, 3)

    print(json.dumps({
        "bench": "video", "model": str(args.model) if args.model else "tiny-wan2_2", "device": args.device,
        "size": args.size, "frames": args.frames, "steps": args.steps,
        "threads": args.threads if args.device == "cpu" else None, "videos_per_measurement": args.videos,
        "repeats": args.repeats,
        "direct_videos_per_s": {f"batch{b}": r(v) for b, v in direct.items()},
        "served_videos_per_s": {f"c{c}": r(served[f"c{c}"]) for c in (1, 4)},
        "served_vs_direct": {f"c{c}": r(served[f"c{c}"] / direct[c]) for c in (1, 4)},
        "served_batching_gain": r(served["c4"] / served["c1"]),
        "direct_batching_gain": r(direct[4] / direct[1]),
        "served_startup_s": r(served["startup_s"]),
    }))


if __name__ == "__main__":
    main()
