"""Video benchmark: videos/s served (orchestrator + a real video worker) vs diffusers called directly.

Baseline, measured in the same run: the pipeline called directly in one process,
with each --concurrency value as its batch size (default one video per call and
four prompts per call). Against it: the served runtime without HTTP (the
in-process orchestrator and a real worker process running `workers/engines/video.py`,
the pipeline `omni-run --model` detects for the folder, max_num_seqs = the largest
concurrency) at each concurrency (that many compatible requests in flight are one
batch). The MP4 encode is not counted (the same for both).

    .venv/bin/python scripts/bench_video.py                          # tiny Wan2.2, CPU
    .venv/bin/python scripts/bench_video.py --model DIR --device cuda --dtype bfloat16 --size 1280x704 \\
        --frames 49 --steps 4 --videos 2 --repeats 1 --concurrency 1,2     # Wan2.2-TI2V-5B-sized (make_sized_wan.py)

--first-frame: image-to-video (default the tiny wan2_2_i2v): every request has its own first frame.
diffusers takes one image a call, so the direct calls use the family's `image_batches` wrapper
(models/video/wan_i2v.py) to batch; the served run is made twice, with the family's
`image_batches` and without it (`served_unbatched_videos_per_s`: each request its own call).

Stage engine_extras for the served run: --stage-extras JSON; by default a folder whose VAE
has 48 latent channels (the Wan2.2 TI2V VAE: 16x spatial, 2x2 patches) is served with
{"size_multiple": 32, "fps": 24} as Wan2.2-TI2V-5B is, anything else with its family defaults.

Each rate is the best of --repeats runs (the box may be shared). Prints one JSON line; besides the
rates it carries, per batch size / concurrency:
    direct_step_ms          median denoising step of the direct calls (device-synchronised step callback),
                            each call's first step left out
    direct_call_overhead_ms a call's wall time minus its steps: text encoding, VAE decode, postprocess
    direct_peak_gb          torch.cuda.max_memory_allocated over the direct measurement (null off CUDA)
    served_s_per_video      1 / served videos/s at concurrency 1
    served_step_ms          median gap between the served c1 requests' per-step progress outputs at the
                            orchestrator (no device sync in the worker: the pace steps are issued at)
    served_gpu_used_gb      nvidia-smi used memory of the whole device after the served run, worker up
                            (every process: this one's CUDA context too); served_gpu_used_before_gb is the
                            same reading before the worker started (null without nvidia-smi)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.gpu_mem import free_cached
from scripts.served_rates import concurrency_list

PROMPT = "a cat walks on the beach at sunset"
TI2V_EXTRAS = {"size_multiple": 32, "fps": 24}
"""Wan2.2-TI2V-5B's engine_extras (docs/media.md): sides in multiples of 32, 24 fps."""
TI2V_Z_DIM = 48


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="diffusers video folder; default: build the tiny wan2_2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", default="32x32", help="WxH")
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--videos", type=int, default=8, help="videos per measurement")
    ap.add_argument("--concurrency", type=concurrency_list, default=[1, 4],
                    help="comma list of served concurrencies; the direct batch sizes (default 1,4)")
    ap.add_argument("--stage-extras", type=json.loads, default=None,
                    help="engine_extras of the served stage, JSON (default: TI2V-5B's for a 48-channel Wan VAE)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--first-frame", action="store_true", help="image-to-video: a first frame per request")
    return ap.parse_args()


def default_extras(model: Path) -> dict[str, Any]:
    """TI2V_EXTRAS for a folder with the Wan2.2 TI2V VAE (z_dim 48), else {} (the family defaults)."""
    try:
        vae = json.loads((model / "vae" / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    is_ti2v = vae.get("_class_name") == "AutoencoderKLWan" and vae.get("z_dim") == TI2V_Z_DIM
    return dict(TI2V_EXTRAS) if is_ti2v else {}


def first_frame(args: argparse.Namespace) -> Any:
    """The first frame every --first-frame request gives (uint8 [H, W, 3], noise: nothing to compress)."""
    import numpy as np

    width, height = (int(v) for v in args.size.split("x"))
    return np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8)


def direct_kwargs(args: argparse.Namespace, pipe: Any) -> Any:
    import torch

    width, height = (int(v) for v in args.size.split("x"))
    frames = None
    if args.first_frame:
        from omni_actors.models.video.wan_i2v import batch_first_frames

        frames = batch_first_frames(pipe)
        assert frames is not None, "this image-to-video layout cannot batch first frames"

    def kwargs(batch: int, seed: int) -> dict[str, Any]:
        kw = {"prompt": [PROMPT] * batch, "num_frames": args.frames, "width": width, "height": height,
              "num_inference_steps": args.steps, "output_type": "np",
              "generator": [torch.Generator("cpu").manual_seed(seed + i) for i in range(batch)]}
        if frames is not None:
            kw["image"] = frames([first_frame(args)] * batch, width, height)
        return kw

    return kwargs


def bench_served(model: Path, args: argparse.Namespace, extras: dict[str, Any]) -> dict[str, Any]:
    from omni_actors.config.deploy import build_deploy
    from omni_actors.models.detect import detect_pipeline
    from scripts.served_rates import served_rates

    width, height = (int(v) for v in args.size.split("x"))
    params = {"num_inference_steps": args.steps, "width": width, "height": height, "num_frames": args.frames}
    stage = {"stage_id": 0, "max_num_seqs": max(args.concurrency), "dtype": args.dtype, "engine_extras": extras}
    deploy = build_deploy({"pipeline": detect_pipeline(model), "model": str(model), "stages": [stage]},
                          source="bench_video")
    inputs = {"prompt": PROMPT, **({"image": first_frame(args)} if args.first_frame else {})}
    return served_rates(deploy, inputs, params, "frames", args.videos, args.repeats, args.concurrency)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from omni_actors.workers.engines.diffusion_loading import load_pipeline
    from scripts.direct_rates import direct_rates

    conc = args.concurrency
    tiny = "wan2_2_i2v" if args.first_frame else "wan2_2"
    with tempfile.TemporaryDirectory(prefix="bench-video-") as tmp:
        model = args.model
        if model is None:
            from omni_actors.models.tiny import make_tiny

            model = make_tiny(tiny, Path(tmp) / f"tiny-{tiny}", seed=0)
        extras = default_extras(Path(model)) if args.stage_extras is None else args.stage_extras
        pipe = load_pipeline(model, args.device, args.dtype)
        direct = direct_rates(pipe, direct_kwargs(args, pipe), conc, args.videos, args.repeats, args.device)
        del pipe
        free_cached(args.device)  # the worker process below needs the memory; nvidia-smi then reads it alone
        served = bench_served(Path(model), args, extras)
        unbatched = bench_served(Path(model), args, {**extras, "image_batches": None}) if args.first_frame else None

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    lo, hi = conc[0], conc[-1]
    print(json.dumps({
        "bench": "video", "model": str(args.model) if args.model else f"tiny-{tiny}", "device": args.device,
        "first_frame": args.first_frame,
        "dtype": args.dtype, "size": args.size, "frames": args.frames, "steps": args.steps,
        "threads": args.threads if args.device == "cpu" else None, "videos_per_measurement": args.videos,
        "repeats": args.repeats, "concurrency": conc, "stage_extras": extras,
        "direct_videos_per_s": {f"batch{b}": r(v["rate"]) for b, v in direct.items()},
        "served_videos_per_s": {f"c{c}": r(served[f"c{c}"]) for c in conc},
        "served_vs_direct": {f"c{c}": r(served[f"c{c}"] / direct[c]["rate"]) for c in conc},
        "served_batching_gain": r(served[f"c{hi}"] / served[f"c{lo}"]),
        "served_unbatched_videos_per_s": {f"c{c}": r(unbatched[f"c{c}"]) for c in conc} if unbatched else None,
        "direct_batching_gain": r(direct[hi]["rate"] / direct[lo]["rate"]),
        "served_startup_s": r(served["startup_s"]),
        "direct_step_ms": {f"batch{b}": r(v["step_ms"]) for b, v in direct.items()},
        "direct_call_overhead_ms": {f"batch{b}": r(v["call_overhead_ms"]) for b, v in direct.items()},
        "direct_peak_gb": {f"batch{b}": v["peak_gb"] for b, v in direct.items()},
        "served_s_per_video": r(1 / served["c1"]) if "c1" in served else None,
        "served_step_ms": r(served["step_ms"]),
        "served_gpu_used_before_gb": served["gpu_used_before_gb"],
        "served_gpu_used_gb": served["gpu_used_gb"],
    }))


if __name__ == "__main__":
    main()
