"""Speech decoder step benchmark (dia, vibevoice, csm, higgs_audio_v2): one engine step at several batch sizes, per engine_extras variant.

The family's own stage engine in this process, no workers: for each `--ar-extras`
variant (engine_extras; the first is the same-run baseline of the others) and each
`--batch` size B, B seeded requests are added at once and prefilled, `--warmup` steps
run, and `--steps` steps are timed one by one (device synchronised). The RTF of a
stream is about step_ms / the audio one step makes. `first_frame_ms_max`: from the
burst's arrival to the last of its B requests' first output (dia: its first audio
frame, 15 steps after its prompt by Dia's delay pattern; dia's start-up warm-up,
engine_extras "warmup", on by default on CUDA, captures the graphs at load, in
`load_s`, so the first burst pays no captures).

- dia (default): a step decodes one position for all B requests (2 B rows with the
  guidance rows) and draws their ids; 86 positions a second (11.6 ms of audio each).
- vibevoice: a step runs the conditioned LM branch, picks the tokens, runs the guidance
  branch and all the diffusion head's denoising passes, and decodes + re-encodes each
  latent for the LM's feedback (per request); 7.5 latents a second (133 ms each).
- csm: a step is one backbone step and the depth decoder's 31 passes (one graph replay
  on CUDA) for all B requests; 12.5 frames a second (80 ms each).
- higgs_audio_v2: a step is one LM step drawing all 8 codebooks; 25 a second (40 ms each).

`--profile-dir DIR`: 20 more steps of each batch, after the timed ones, run under torch's profiler
(workers/step_profile.py), its operator table and a one-line summary (device kernel
time against wall time a step) written to DIR as `<family>-<variant>-b<B>.txt/.json`.

    .venv/bin/python scripts/bench_dia_step.py                       tiny dia on CPU (temp dir)
    omni-run make-tiny dia-1.6b-sized DIR
    .venv/bin/python scripts/bench_dia_step.py --model DIR --device cuda \\
        --ar-extras '{}' '{"cuda_graphs": false}' '{"kv_cache": "dynamic"}'
    omni-run make-tiny vibevoice-1.5b-sized DIR
    .venv/bin/python scripts/bench_dia_step.py --family vibevoice --model DIR --device cuda \\
        --ar-extras '{}' '{"cuda_graphs": false}' '{"kv_cache": "dynamic"}'
    .venv/bin/python scripts/bench_dia_step.py --model DIR --device cuda --batch 10 1 16 \\
        --ar-extras '{"warmup": false, "batch_prefill": false}' '{}'     first audio of a burst

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNI_LOG_LEVEL", "warning")

import numpy as np
import torch

from omni_actors.workers.engine import EngineContext
from omni_actors.workers.step_profile import StepProfiler

PROFILED_STEPS = 20
"""Steps run under the profiler (--profile-dir), after the timed ones."""
HF_AR = "omni_actors.workers.engines.hf_ar:HfAREngine"
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."
FAMILIES: dict[str, dict[str, Any]] = {
    "dia": {"engine": "omni_actors.models.dia.engine:DiaEngine", "stage": "decoder",
            "inputs": {"text": f"[S1] {TEXT}", "voice": "S1"}, "frame_s": 512 / 44100, "first": "codes"},
    "vibevoice": {"engine": "omni_actors.models.vibevoice.engine:VibeVoiceEngine", "stage": "lm",
                  "inputs": {"text": TEXT, "voice": "0"}, "frame_s": 3200 / 24000, "first": "latents"},
    "csm": {"engine": HF_AR, "adapter": "omni_actors.models.csm.backbone:CsmBackboneAdapter", "stage": "backbone",
            "inputs": {"text": TEXT, "voice": "0"}, "frame_s": 0.08, "first": "codes"},
    "higgs_audio_v2": {"engine": HF_AR, "adapter": "omni_actors.models.higgs_audio_v2.lm:HiggsLMAdapter",
                       "stage": "lm", "inputs": {"text": TEXT, "voice": "default"}, "frame_s": 0.04, "first": "codes"},
}  # fmt: skip
"""Per family: its engine, stage name, one request's inputs, and the seconds of audio one step makes."""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step(engine: Any, first: dict[str, float], since: float, device: str, key: str) -> None:
    """One engine step (device synchronised); notes each request's first audio frame (ms since `since`)."""
    outputs = engine.step()
    _sync(device)
    now = time.perf_counter()
    for out in outputs:
        if key in out.payload:
            first.setdefault(out.request_id, (now - since) * 1000)


def _variant(model: Path, extras: dict[str, Any], args: argparse.Namespace, index: int) -> dict[str, Any]:
    fam = FAMILIES[args.family]
    module, name = fam["engine"].split(":")
    engine_cls = getattr(importlib.import_module(module), name)
    full = {"adapter": fam["adapter"], **extras} if "adapter" in fam else extras
    ctx = EngineContext(0, 0, fam["stage"], model, args.device, max(args.batch), args.dtype, 0.9, 1,
                        engine_extras=full)  # fmt: skip
    t0 = time.perf_counter()
    engine = engine_cls(ctx)
    out: dict[str, Any] = {"engine_extras": extras, "load_s": round(time.perf_counter() - t0, 2), "batches": []}
    frames = args.warmup + args.steps + PROFILED_STEPS + 32
    try:
        for b in args.batch:
            for i in range(b):
                engine.add(f"r{i}", dict(fam["inputs"]), {"seed": i, "max_tokens": frames, "ignore_eos": True})
            _sync(args.device)
            first: dict[str, float] = {}
            burst = t0 = time.perf_counter()
            _step(engine, first, burst, args.device, fam["first"])  # prefills all b in one forward
            prefill_ms = (time.perf_counter() - t0) * 1000
            for _ in range(args.warmup):
                _step(engine, first, burst, args.device, fam["first"])
            times = []
            for _ in range(args.steps):
                _sync(args.device)
                t0 = time.perf_counter()
                _step(engine, first, burst, args.device, fam["first"])
                times.append((time.perf_counter() - t0) * 1000)
            if args.profile_dir:  # after the timed steps: the profiler's own cost stays out of them
                prof = StepProfiler(Path(args.profile_dir), f"{args.family}-{index}-b{b}", 0, PROFILED_STEPS)
                for _ in range(PROFILED_STEPS):
                    with prof.step():
                        _step(engine, first, burst, args.device, fam["first"])
            live = engine.requests if hasattr(engine, "requests") else engine.seqs  # own engines / HfAREngine
            running = len(live)
            for rid in list(live):
                engine.abort(rid)
            p50 = statistics.median(times)
            out["batches"].append({
                "batch": b, "running_at_end": running, "prefill_ms_per_request": round(prefill_ms / b, 2),
                "step_ms_p50": round(p50, 3), "step_ms_p99": round(float(np.percentile(times, 99)), 3),
                "rtf_per_stream": round(p50 / 1000 / fam["frame_s"], 3),
                "first_frame_ms_max": round(max(first.values()), 1) if len(first) == b else None,
            })  # fmt: skip
    finally:
        engine.close()
        del engine
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES), default="dia")
    p.add_argument("--model", help="a folder of the family (default: a tiny one built in a temp dir)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", default="auto", help="bfloat16 on CUDA for auto; CPU is float32")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ar-extras", type=json.loads, nargs="+", default=[{}], metavar="JSON",
                   help="engine_extras per variant; the first is the same-run baseline")
    p.add_argument("--profile-dir", help="profile the timed steps (torch profiler); reports written here")
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.family}-step-") as tmp:
        model = Path(args.model) if args.model else None
        if model is None:
            from omni_actors.models.tiny import make_tiny

            model = make_tiny(args.family, Path(tmp) / f"tiny-{args.family}")
        result: dict[str, Any] = {
            "bench": f"{args.family}_step", "model": str(model) if args.model else "tiny", "device": args.device,
            "dtype": args.dtype, "steps": args.steps,
            "budget_ms_real_time": round(FAMILIES[args.family]["frame_s"] * 1000, 2),
            "variants": [_variant(model, x, args, i) for i, x in enumerate(args.ar_extras)],
        }  # fmt: skip
    base = result["variants"][0]["batches"]
    for v in result["variants"][1:]:
        v["step_ms_vs_first"] = [round(b["step_ms_p50"] / a["step_ms_p50"], 2) for a, b in zip(base, v["batches"], strict=True)]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
