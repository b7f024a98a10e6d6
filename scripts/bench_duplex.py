"""Full-duplex benchmark: N concurrent realtime sessions on a Moshi checkpoint, fed audio in real time.

For each N (default 1, 4, 16) a server is started with N duplex slots
(`max_num_seqs` = N); N WebSocket clients in a separate process each stream
audio in 80 ms appends at real-time pace for --seconds and read everything
that comes back. Reported per N:

- frame_ms p50/p99: the engine's step compute time for one frame of all slots
  (the server's duplex statistics); start_lag_ms p50/p99: how far past its tick
  each step began; late_ms p50/p99: how far past its deadline (its tick + one frame)
  each step ended, 0 when on time (start_lag alone stays near 0 when every other
  frame is skipped: the clock moves the next tick past an overrun); late_frames:
  ticks skipped because a step overran (per session);
- audio_out_per_wall_s: seconds of model audio the clients received per wall
  second, over all sessions (N x 1.0 when every frame is on time);
- input_to_output_ms p50/p99: per frame of user audio, from its last sample reaching the
  engine to the output of the step that took it (the serving path's added latency; the
  model's own delay, one frame for Moshi's acoustic codebooks, comes on top);
- first_audio_ms p50: first append sent to first audio delta received, per session.

Model only, same run (`model_only`): the frame step (MoshiFrame: Mimi encode, temporal +
depth step, Mimi decode, outputs copied to the host) of N live slots timed in this process
without the server, frame_ms p50/p99 over --frame-steps frames: what serving adds to the model.

Both parts run with CUDA graphs on and off (`--graphs`, default both on CUDA; on CPU
frames always run eagerly): served levels set the stage's engine_extras["cuda_graphs"];
`graphs_speedup_p99` is off/on model-only frame p99 per N; `graphs_on` says whether the
frame really replayed a graph (a failed capture falls back to eager and logs why).

    .venv/bin/python scripts/bench_duplex.py                        # tiny, CPU
    .venv/bin/python scripts/bench_duplex.py --size 7b --device cuda --dtype bfloat16 --work-dir /tmp/moshi7b \
        --sessions 1 16 --seconds 20

`--frame-budget 0 0.75` serves each N twice: N slots whatever a frame takes (0, the
default here), then with the engine sizing its slots to 0.75 of a frame (its own default):
`slots` kept, `sessions_refused` at that limit, and the late frames of the sessions served.
The targets are judged on the first budget.

`--size 7b` builds a random-weight checkpoint of Moshi-7B's real sizes (first run:
minutes, ~15 GB in bf16 under --work-dir; `python -m omni_actors.models.tiny.moshi DIR
--size 7b --dtype bfloat16` builds it alone). `--no-serve`: model only; `--no-model-only`: served
levels only. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNI_LOG_LEVEL", "warning")

import numpy as np

RATE = 24_000
FRAME = 1920
FRAME_S = FRAME / RATE
FRAME_STEPS = 200
WARM_FRAMES = 3
"""Frames stepped before timing: the first runs eagerly and is captured, the rest replay."""
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": "float32"}
CLIENT_TIMEOUT_S = 120.0
TARGET = {"frame_ms_p99_at_16": 40.0, "late_frames_at_16": 0, "input_to_output_ms_p50_at_1": 2 * FRAME_S * 1000}


def p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


async def run_session(url: str, k: int, seconds: float) -> dict[str, Any]:
    import aiohttp

    audio = (np.random.default_rng(k).standard_normal(int(seconds * RATE)) * 0.1).clip(-1, 1)
    pcm = (audio * 32767).astype("<i2").tobytes()
    out = {"audio_s": 0.0, "first_audio_ms": None, "refused": False}
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
        start = time.perf_counter()

        async def reader() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                event = json.loads(msg.data)
                if event["type"] == "error" and event["error"].get("code") == "session_limit_reached":
                    out["refused"] = True
                if event["type"] in ("response.audio.delta", "response.output_audio.delta"):
                    if out["first_audio_ms"] is None:
                        out["first_audio_ms"] = (time.perf_counter() - start) * 1000
                    out["audio_s"] += len(base64.b64decode(event["delta"])) / 2 / RATE

        task = asyncio.ensure_future(reader())
        step = FRAME * 2
        for i, off in enumerate(range(0, len(pcm), step)):
            if ws.closed:
                break  # refused at the session limit
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm[off:off + step]).decode()}))
            delay = start + (i + 1) * FRAME_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the microphone's pace
        out["wall_s"] = time.perf_counter() - start
        await ws.close()
        await asyncio.wait({task}, timeout=CLIENT_TIMEOUT_S)
    return out


def client_main(url: str, sessions: int, seconds: float, conn: Any) -> None:
    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(run_session(url, k, seconds) for k in range(sessions)))

    conn.send(asyncio.run(main()))


def _frame_step(frame: Any, audio: np.ndarray) -> None:
    import torch

    text, out = frame.step(torch.from_numpy(audio))
    out.cpu().numpy()  # as the adapter does: the frame is done when its audio is on the host
    text.tolist()


def model_only(model_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    """Frame p50/p99 of MoshiFrame with N live slots, per graphs mode, one model load for all."""
    import gc

    import torch
    from transformers import MoshiForConditionalGeneration

    from omni_actors.models.moshi.frame import MoshiFrame

    dtype = getattr(torch, DTYPES[args.dtype])
    model = MoshiForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for mode in args.graphs:
        for n in args.sessions:
            frame = MoshiFrame(model, n, graphs=mode == "on")
            for s in range(n):
                frame.start(s, seed=s)
            rng = np.random.default_rng(n)
            inputs = [(rng.standard_normal((n, FRAME)) * 0.1).astype(np.float32) for _ in range(8)]
            for i in range(WARM_FRAMES):
                _frame_step(frame, inputs[i % len(inputs)])
            times = []
            for i in range(args.frame_steps):
                t0 = time.perf_counter()
                _frame_step(frame, inputs[i % len(inputs)])
                times.append((time.perf_counter() - t0) * 1000)
            out.setdefault(f"graphs_{mode}", {})[str(n)] = {
                "frame_ms_p50": p(times, 50), "frame_ms_p99": p(times, 99), "frame_ms_max": p(times, 100),
                "graphs_on": frame.graphs_on,
            }
            del frame
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    del model
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


async def serve_level(model: Path, n: int, args: argparse.Namespace, graphs: str, budget: float) -> dict[str, Any]:
    from aiohttp import web

    from omni_actors.api.app import build_app
    from omni_actors.api.realtime import STATS_KEY
    from omni_actors.config.deploy import build_deploy
    from omni_actors.orchestrator.core import Orchestrator

    stage = {"stage_id": 0, "max_num_seqs": n, "dtype": args.dtype, "default_sampling_params": {"seed": 0},
             "engine_extras": {"cuda_graphs": graphs == "on", "frame_budget": budget}}
    if args.device == "cuda":
        stage["devices"] = "0"
    deploy = build_deploy({"pipeline": "moshi", "model": str(model), "stages": [stage],
                           "server": {"max_realtime_sessions": n}}, source="bench")
    orch = Orchestrator(deploy)
    await orch.start()
    app = build_app(orch)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        parent, child = mp.Pipe()
        proc = mp.get_context("spawn").Process(
            target=client_main, args=(f"ws://{host}:{port}/v1/realtime?model=moshi", n, args.seconds, child))
        proc.start()
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(None, parent.recv)
        await loop.run_in_executor(None, proc.join)
        raw = app[STATS_KEY].duplex
        overrun = [max(0.0, lag + ms - FRAME_S * 1000) for lag, ms in zip(raw.start_lag_ms, raw.frame_ms, strict=True)]
        d = raw.statistics()
        wall = max(r.get("wall_s", 0.0) for r in results)
        first = [r["first_audio_ms"] for r in results if r["first_audio_ms"] is not None]
        return {
            "sessions": n, "graphs": graphs, "frame_budget": budget,
            "slots": sum(h.capacity or n for h in orch.workers[0]),
            "sessions_refused": sum(r["refused"] for r in results), "seconds": args.seconds, "frames": d.frames,
            "frame_ms_p50": round(d.frame_ms_p50, 2), "frame_ms_p99": round(d.frame_ms_p99, 2),
            "start_lag_ms_p50": round(d.start_lag_ms_p50, 2), "start_lag_ms_p99": round(d.start_lag_ms_p99, 2),
            "late_ms_p50": p(overrun, 50), "late_ms_p99": p(overrun, 99), "late_frames": d.late_frames,
            "input_to_output_ms_p50": round(d.input_to_output_ms_p50, 2),
            "input_to_output_ms_p99": round(d.input_to_output_ms_p99, 2),
            "audio_out_per_wall_s": round(sum(r["audio_s"] for r in results) / wall, 3),
            "first_audio_ms_p50": p(first, 50),
        }
    finally:
        await runner.cleanup()
        await orch.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seconds", type=float, default=8.0, help="audio each session streams")
    ap.add_argument("--size", choices=["tiny", "7b"], default="tiny")
    ap.add_argument("--model", help="an existing Moshi folder (default: build --size under --work-dir)")
    ap.add_argument("--work-dir", help="where a built checkpoint is kept (default: a temporary folder)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--graphs", nargs="+", choices=["off", "on"], help="CUDA graphs modes (default: off on on CUDA)")
    ap.add_argument("--frame-steps", type=int, default=FRAME_STEPS, help="model-only frames timed per level")
    ap.add_argument("--frame-budget", type=float, nargs="+", default=[0.0],
                    help="engine_extras.frame_budget per served level (0: N slots whatever a frame takes, "
                         "the default here; the engine's own default sizes slots to 0.75 of a frame)")
    ap.add_argument("--no-serve", action="store_true", help="model-only timings, no server")
    ap.add_argument("--no-model-only", action="store_true", help="served levels only")
    args = ap.parse_args()
    if args.graphs is None:
        args.graphs = ["off", "on"] if args.device == "cuda" else ["off"]
    from omni_actors import logs
    from omni_actors.models.tiny.moshi import make_sized_moshi

    logs.configure()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else Path(args.work_dir or tmp) / f"moshi-{args.size}"
        if not args.model and not (model / "config.json").is_file():
            make_sized_moshi(model, args.size, dtype=args.dtype if args.size != "tiny" else "float32")
        alone = {} if args.no_model_only else model_only(model, args)
        rows = [] if args.no_serve else [
            asyncio.run(serve_level(model, n, args, mode, budget))
            for budget in args.frame_budget for mode in args.graphs for n in args.sessions]
    speedup = {}
    if "graphs_off" in alone and "graphs_on" in alone:
        speedup = {n: round(alone["graphs_off"][n]["frame_ms_p99"] / alone["graphs_on"][n]["frame_ms_p99"], 2)
                   for n in alone["graphs_on"]}
    best = "on" if "on" in args.graphs else "off"
    judged = [r for r in rows if r["graphs"] == best and r["frame_budget"] == args.frame_budget[0]]
    at16 = next((r for r in judged if r["sessions"] == 16), None)
    at1 = next((r for r in judged if r["sessions"] == 1), None)
    alone16 = alone.get(f"graphs_{best}", {}).get("16")
    print(json.dumps({
        "bench": "duplex", "size": args.size, "device": args.device, "dtype": args.dtype, "cpus": os.cpu_count(),
        "frame_ms_budget": FRAME_S * 1000, "model_only": alone, "graphs_speedup_p99": speedup, "results": rows,
        "target": TARGET, "judged_graphs": best,
        "met_model_only": None if alone16 is None else bool(alone16["frame_ms_p99"] <= TARGET["frame_ms_p99_at_16"]),
        "met": None if at16 is None or at1 is None else bool(
            at16["frame_ms_p99"] <= TARGET["frame_ms_p99_at_16"] and at16["late_frames"] == TARGET["late_frames_at_16"]
            and at1["input_to_output_ms_p50"] <= TARGET["input_to_output_ms_p50_at_1"]),
    }))


if __name__ == "__main__":
    main()
