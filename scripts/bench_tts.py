"""TTS benchmark (csm, dia, vibevoice, higgs_audio_v2, ...): first audio and real-time factor at several concurrencies, async chunk on vs off.

Two orchestrators serve the same folder (`--pipeline`, or the one `--model` is detected
as) one after the other in one run, with `async_chunk` on (each AR frame goes to the
codec as it is made) and off (the codec gets the whole utterance at the end): the "off" numbers are the
same-run baseline. Requests go straight to the orchestrator (no HTTP). Per request:
first audio (submit -> first non-empty audio chunk) and RTF (end to end / seconds of
audio). Closed loop at each `--concurrency` (every client sends its next request as
its last one ends); with `--rate R`, also an open loop of Poisson arrivals at R
requests/s for `--rate-seconds`.

    .venv/bin/python scripts/bench_tts.py                          tiny csm on CPU (built in a temp dir)
    .venv/bin/python scripts/bench_tts.py --model DIR --device cuda --rate 10
    omni-run make-tiny csm-1b-sized DIR                            CSM-1B sizes, random weights (GPU;
                                                                   its generation_config caps a request
                                                                   at 125 frames, 10 s of audio)
    .venv/bin/python scripts/bench_tts.py --pipeline dia           tiny dia on CPU
    omni-run make-tiny dia-1.6b-sized DIR                          Dia-1.6B sizes, random weights (GPU;
                                                                   860 frames, 10 s of audio, a request)
    omni-run make-tiny vibevoice-1.5b-sized DIR                    VibeVoice-1.5B sizes (75 latents, 10 s)
    omni-run make-tiny higgs_audio_v2-3b-sized DIR                 Higgs-Audio-V2-generation-3B sizes (5.4 B
                                                                   parameters, 250 frames, 10 s a request)
    .venv/bin/python scripts/bench_tts.py --model DIR --device cuda \
        --ar-extras '{}' '{"cuda_graphs": false}' '{"kv_cache": "dynamic"}'
                                                                   the first stage's engine_extras: the
                                                                   first set runs async on and off, each
                                                                   other one async on ("variants"), all
                                                                   in the same run
    .venv/bin/python scripts/bench_tts.py --model DIR --device cuda \
        --codec-extras '{}' '{"first_chunk_size": 3, "chunk_size": 10}'
                                                                   the codec stage's engine_extras, the
                                                                   same way (variants beyond the first
                                                                   keep the first --ar-extras)

Each level also reports per stage the engine steps, seconds in steps, mean step and busy
fraction ("stages", from the workers' heartbeats): which stage first audio waited on.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec
from scripts.bench_omni_pipeline import stage_deltas, stage_work

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."


def _pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 4) if xs else float("nan")


async def _one(orch: Orchestrator, seed: int, frames: int | None) -> dict[str, float]:
    voice = orch.pipeline.speech.voices[0] if orch.pipeline.speech else None
    params: dict[str, Any] = {"seed": seed}
    if frames:
        params["max_tokens"] = frames
    t0 = time.perf_counter()
    first = None
    samples, rate = 0, 24000
    async for chunk in orch.submit(RequestSpec(inputs={"text": TEXT, "voice": voice}, params=params)):
        audio = chunk.data.get("audio") if chunk.output_type == "audio" else None
        if audio is not None and len(audio):
            first = first if first is not None else time.perf_counter() - t0
            samples += len(audio)
            rate = int(chunk.data.get("sample_rate", rate))
    total = time.perf_counter() - t0
    seconds = samples / rate
    return {"first_s": first if first is not None else total, "e2e_s": total, "audio_s": seconds,
            "rtf": total / seconds if seconds else float("inf")}


def _summary(rows: list[dict[str, float]], wall: float) -> dict[str, Any]:
    if not rows:
        return {"requests": 0}
    first = [r["first_s"] for r in rows]
    return {
        "requests": len(rows), "first_audio_p50_s": _pct(first, 50), "first_audio_p95_s": _pct(first, 95),
        "first_audio_p99_s": _pct(first, 99), "rtf_p50": _pct([r["rtf"] for r in rows], 50),
        "audio_s_per_request": round(statistics.mean(r["audio_s"] for r in rows), 3),
        "audio_s_per_wall_s": round(sum(r["audio_s"] for r in rows) / wall, 3),
    }  # fmt: skip


async def _closed(orch: Orchestrator, conc: int, per_client: int, frames: int | None) -> dict[str, Any]:
    rows: list[dict[str, float]] = []

    async def client(i: int) -> None:
        for k in range(per_client):
            rows.append(await _one(orch, 1000 * i + k, frames))

    before = await stage_work(orch)
    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(conc)))
    wall = time.perf_counter() - t0
    stages = stage_deltas(before, await stage_work(orch), wall)
    return {"concurrency": conc, **_summary(rows, wall), "stages": stages}


async def _open(orch: Orchestrator, rate: float, seconds: float, frames: int | None) -> dict[str, Any]:
    rng = random.Random(0)
    tasks = []
    before = await stage_work(orch)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        tasks.append(asyncio.ensure_future(_one(orch, n, frames)))
        n += 1
        await asyncio.sleep(rng.expovariate(rate))  # the arrival process itself, not a wait on work
    done = await asyncio.gather(*tasks, return_exceptions=True)
    rows = [r for r in done if isinstance(r, dict)]
    failed = sorted({type(r).__name__ for r in done if not isinstance(r, dict)})
    wall = time.perf_counter() - t0
    stages = stage_deltas(before, await stage_work(orch), wall)
    return {"rate_per_s": rate, "failed": len(done) - len(rows), "failures": failed,
            **_summary(rows, wall), "stages": stages}


async def _mode(model: Path, async_chunk: bool, args: argparse.Namespace,
                extras: dict[str, Any] | None = None, codec: dict[str, Any] | None = None) -> dict[str, Any]:
    seqs = args.max_num_seqs or max(args.concurrency)
    first = {"stage_id": 0, "max_num_seqs": seqs, "engine_extras": extras or {}}
    raw: dict[str, Any] = {"pipeline": args.pipeline, "model": str(model), "async_chunk": async_chunk,
                           "gpu_sharing": args.gpu_sharing, "stages": [first]}
    second: dict[str, Any] = {"stage_id": 1, "engine_extras": codec or {}}
    if args.device == "cuda":
        raw["stages"][0]["devices"] = second["devices"] = "0"
    raw["stages"].append(second)
    orch = Orchestrator(build_deploy(raw, source="bench_tts"))
    t0 = time.perf_counter()
    await orch.start()
    startup = time.perf_counter() - t0
    try:
        await _one(orch, 0, args.frames)  # warm-up
        out: dict[str, Any] = {"startup_s": round(startup, 2), "gpu_sharing": orch.gpu_sharing, "closed": []}
        for conc in args.concurrency:
            out["closed"].append(await _closed(orch, conc, args.per_client, args.frames))
        if args.rate:
            out["open"] = await _open(orch, args.rate, args.rate_seconds, args.frames)
        return out
    finally:
        await orch.stop()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a TTS folder (default: a tiny one built in a temp dir)")
    p.add_argument("--pipeline", default="csm", help="the family of the tiny folder (with --model: detected)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--per-client", type=int, default=2)
    p.add_argument("--frames", type=int, default=None, help="frames per request (default: the checkpoint's)")
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--max-num-seqs", type=int, default=None, help="stage 0's batch (default: the top concurrency)")
    p.add_argument("--rate-seconds", type=float, default=20.0)
    p.add_argument("--ar-extras", type=json.loads, nargs="+", default=[{}], metavar="JSON",
                   help="engine_extras of the first stage, one JSON object per variant (the first one is "
                        "also run with async chunk off)")
    p.add_argument("--codec-extras", type=json.loads, nargs="+", default=[{}], metavar="JSON",
                   help="engine_extras of the codec stage, one JSON object per variant (the first one goes "
                        "with every --ar-extras variant)")
    p.add_argument("--no-whole", action="store_true", help="skip the async-chunk-off run (device time)")
    p.add_argument("--gpu-sharing", default="off", choices=("auto", "mps", "off"), help="deploy gpu_sharing")
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        model = Path(args.model) if args.model else None
        if model is None:
            from omni_actors.models.tiny import make_tiny

            model = make_tiny(args.pipeline, Path(tmp) / f"tiny-{args.pipeline}")
        else:
            from omni_actors.models.detect import detect_pipeline

            args.pipeline = detect_pipeline(model)
        result: dict[str, Any] = {"bench": "tts", "pipeline": args.pipeline, "model": str(model) if args.model else "tiny",
                                  "device": args.device, "cpus": os.cpu_count(), "load_before": os.getloadavg()}
        main_extras, *others = args.ar_extras
        codec, *codec_others = args.codec_extras
        result["engine_extras"], result["codec_extras"] = main_extras, codec
        result["async"] = await _mode(model, True, args, main_extras, codec)
        if not args.no_whole:
            result["whole"] = await _mode(model, False, args, main_extras, codec)
        variants = [(x, codec) for x in others] + [(main_extras, c) for c in codec_others]
        if variants:
            result["variants"] = [
                {"engine_extras": x, "codec_extras": c, "async": await _mode(model, True, args, x, c)}
                for x, c in variants
            ]
    if "whole" in result:
        result["async_first_audio_gain"] = [
            round(w["first_audio_p50_s"] / a["first_audio_p50_s"], 2) if a["first_audio_p50_s"] else None
            for a, w in zip(result["async"]["closed"], result["whole"]["closed"], strict=True)
        ]
    result["load_after"] = os.getloadavg()
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
