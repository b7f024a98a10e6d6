"""Omni pipeline benchmark: time to first audio through the runtime, async chunk on vs off.

The qwen2_5_omni pipeline (thinker -> talker -> code2wav, each a real worker
process) on a checkpoint folder, driven through an in-process Orchestrator (no
HTTP). For each mode (async chunk on, then off) it starts the runtime
(start-up seconds), warms up, then runs concurrency 1 (--requests-c1 requests,
one at a time) and each other level (all of its requests in flight at once).
Per level: time to first text and first audio (p50/max), audio chunks per
request, end-to-end p50, requests/s and audio seconds per wall second, and
"stages": per stage the engine steps, seconds in steps, mean step (ms) and the
busy fraction of the level's wall time, from the workers' heartbeats.
Workers' resident memory and GPU memory (nvidia-smi) are read after each mode.

Requests: one chat message; the thinker decodes --text-tokens tokens and the
talker --codes codec codes (ignore_eos on both, so random-weight checkpoints
do the same work every time); talker sampling is the model's default.

    python scripts/bench_omni_pipeline.py --model DIR                   # CPU
    python scripts/bench_omni_pipeline.py --model DIR --devices 0 --dtype bfloat16
    python scripts/bench_omni_pipeline.py --model DIR --placements "0,0,0;0,1,1" --dtype bfloat16

`--priority on,off` runs each mode with first-chunk priority on, then off
(engine_extras `first_chunk_priority` on every stage; off also turns off the
talker's batched prefill, `batch_prefill: false`, i.e. the scheduling before
priority), in one run: the same-run baseline. `--stagger-ms N` starts the
requests of each level above 1 N ms apart instead of all at once (arrivals
while others stream); first audio is counted from each request's own start.

Start-up: `startup_s` is Orchestrator.start() (every worker spawned at once, all
Ready); `startup_phases` next to it gives each stage replica's own account
(bus.messages.StartupPhases): "ready" (spawn -> Ready, seen by the orchestrator),
"boot" (process start -> worker main), "imports" (torch, transformers, the model
code), "engine" (the engine's construction) and inside it "engine.weights"
(disk -> device), "engine.config", "engine.processors", "engine.warmup" where
the engine has them. `--startup-only` starts and stops the runtime `--starts`
times (the first run fills the page cache, later ones show warm restarts) and
skips the requests. `--direct-load on,off` runs each mode with weights loaded
straight onto the device, then the old way (host memory, then `.to(device)`;
engine_extras `direct_load: false` on every stage): the same-run baseline.

`--placements` runs each mode once per placement (a device per stage, stages
separated by commas, placements by semicolons), all in one run, so the first
is the same-run baseline of the others. With more than one GPU placement it
also times the cross-device handoff of one thinker step's payload (the
"embeds" and "hidden" rows the thinker sends per token: device -> host numpy
in the producer, message, host -> device in the consumer).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.latency import summary_ms
from omni_actors.orchestrator.launcher import HEARTBEAT_INTERVAL_S
from omni_actors.orchestrator.requests import RequestSpec
from scripts.gpu_mem import gpu_used_gb

PROMPT = "Hello! Please tell me a short story about a small boat at sea, in two sentences."


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--pipeline", default="qwen2_5_omni")
    ap.add_argument("--devices", default=None, help='deploy "devices" for every stage, e.g. "0"')
    ap.add_argument(
        "--placements", default=None,
        help='per-stage devices, placements separated by ";", e.g. "0,0,0;0,1,1"',
    )  # fmt: skip
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests-c1", type=int, default=3)
    ap.add_argument("--text-tokens", type=int, default=32)
    ap.add_argument("--codes", type=int, default=256)
    ap.add_argument("--modes", default="on,off", help="async chunk modes to run")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--priority", default="on", help='first-chunk priority modes, e.g. "on,off"')
    ap.add_argument("--stagger-ms", type=float, default=0.0, help="gap between starts (levels > 1)")
    ap.add_argument("--startup-only", action="store_true", help="time start-up only (no requests)")
    ap.add_argument("--starts", type=int, default=2, help="start-ups per mode with --startup-only")
    ap.add_argument("--direct-load", default="on", help='weights straight onto the device: "on", "off" or "on,off"')
    ap.add_argument(
        "--ar-extras", type=json.loads, default={},
        help='engine_extras for the two AR stages, e.g. \'{"kv_cache": "dynamic"}\'',
    )  # fmt: skip
    ap.add_argument(
        "--talker-extras", type=json.loads, default={},
        help='engine_extras for the talker only, over --ar-extras, e.g. \'{"fused_decode": true}\'',
    )  # fmt: skip
    ap.add_argument(
        "--deploy-extras", type=json.loads, default={},
        help='top-level deploy fields, e.g. \'{"first_output_priority": true}\'',
    )  # fmt: skip
    ap.add_argument(
        "--code2wav-extras", type=json.loads, default={},
        help='engine_extras for the last (codec) stage, e.g. \'{"first_chunk_size": 5, "chunk_size": 25}\'',
    )  # fmt: skip
    return ap.parse_args()


def stage_extras(args: argparse.Namespace, stage: int, priority: bool, direct: bool = True) -> dict[str, Any]:
    extras: dict[str, Any] = dict(args.ar_extras) if stage < 2 else {}
    if stage == 1:
        extras.update(args.talker_extras)
    if stage == 2:
        extras.update(args.code2wav_extras)
    extras["first_chunk_priority"] = priority
    extras["direct_load"] = direct
    if stage == 1 and not priority:
        extras["batch_prefill"] = False  # talker prompts one by one, as before priority
    return extras


def deploy_for(
    args: argparse.Namespace, async_chunk: bool, placement: list[str | None], priority: bool = True,
    direct: bool = True,
) -> Any:
    stage = {"max_num_seqs": args.max_num_seqs, "max_queue": 256, "dtype": args.dtype}
    raw = {
        "pipeline": args.pipeline,
        "model": str(args.model),
        "async_chunk": async_chunk,
        **args.deploy_extras,
        "stages": [
            {
                "stage_id": s, **stage,
                **({"devices": placement[s]} if placement[s] is not None else {}),
                "engine_extras": stage_extras(args, s, priority, direct),
            }
            for s in (0, 1, 2)
        ],
    }  # fmt: skip
    return build_deploy(raw, source="bench_omni_pipeline")


def spec(orch: Orchestrator, args: argparse.Namespace, seed: int) -> RequestSpec:
    params = {
        "max_tokens": args.text_tokens, "ignore_eos": True, "temperature": 0.0, "seed": seed,
        "talker_max_tokens": args.codes, "talker_ignore_eos": True,
        "modalities": ["text", "audio"],
    }  # fmt: skip
    return RequestSpec(
        {"messages": [{"role": "user", "content": PROMPT}]},
        params,
        stages=orch.pipeline.stages_for_outputs({"text", "audio"}),
        deadline_s=600.0,
    )


async def one(
    orch: Orchestrator, args: argparse.Namespace, seed: int, delay_s: float = 0.0
) -> dict[str, Any]:
    if delay_s:
        await asyncio.sleep(delay_s)  # a staggered arrival
    t0 = time.perf_counter()
    ttft = ttfa = None
    chunks = 0
    audio_s = 0.0
    async for chunk in orch.submit(spec(orch, args, seed)):
        now = time.perf_counter() - t0
        if "error" in chunk.data:
            raise RuntimeError(f"request failed: {chunk.data['error']}")
        if chunk.output_type == "text" and ttft is None and chunk.data.get("text"):
            ttft = now
        if chunk.output_type == "audio" and len(chunk.data.get("audio", ())):
            ttfa = now if ttfa is None else ttfa
            chunks += 1
            audio_s += chunk.data["audio"].size / chunk.data["sample_rate"]
    return {"ttft": ttft, "ttfa": ttfa, "chunks": chunks, "audio_s": audio_s,
            "e2e": time.perf_counter() - t0}  # fmt: skip


def summarize(samples: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    def ms(key: str, q: float | None = None) -> float | None:
        vals = [s[key] for s in samples if s[key] is not None]
        if not vals:
            return None
        return round((max(vals) if q is None else float(np.percentile(vals, q))) * 1000, 1)

    return {
        "n": len(samples),
        "ttft_p50_ms": ms("ttft", 50),
        "ttfa_p50_ms": ms("ttfa", 50),
        "ttfa_max_ms": ms("ttfa"),
        "e2e_p50_ms": ms("e2e", 50),
        "audio_chunks_p50": float(np.median([s["chunks"] for s in samples])),
        "audio_s_per_request": round(float(np.mean([s["audio_s"] for s in samples])), 3),
        "rps": round(len(samples) / wall, 3),
        "audio_s_per_wall_s": round(sum(s["audio_s"] for s in samples) / wall, 3),
    }


def worker_rss_gb() -> float:
    """Resident memory of this process's children (the stage workers), GB."""
    me, total = os.getpid(), 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != me:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 1e9, 2)


def placements(args: argparse.Namespace) -> list[list[str | None]]:
    if args.placements:
        return [[d.strip() for d in p.split(",")] for p in args.placements.split(";")]
    return [[args.devices] * 3]


def handoff_cost(width: int, dtype: str, src: str, dst: str, n: int = 200) -> dict[str, Any]:
    """Per thinker step: two [1, width] rows made on `src`, read to host as float32 numpy (the
    producer's `_np`), then put on `dst` (the consumer) — the host path every cross-device chunk
    takes. Timed with device syncs on both sides, best of a few hundred, in microseconds."""
    import torch

    rows = [torch.randn(1, width, device=src, dtype=getattr(torch, dtype)) for _ in range(2)]
    times = []
    for i in range(n + 20):
        torch.cuda.synchronize(src)
        t0 = time.perf_counter()
        host = [r.float().cpu().numpy() for r in rows]
        back = [torch.tensor(h).to(dst) for h in host]
        torch.cuda.synchronize(dst)
        if i >= 20:
            times.append(time.perf_counter() - t0)
    del back
    us = np.array(times) * 1e6
    return {"path": "host", "src": src, "dst": dst, "bytes": 2 * width * 4,
            "p50_us": round(float(np.percentile(us, 50)), 1), "p99_us": round(float(np.percentile(us, 99)), 1)}  # fmt: skip


async def run_mode(
    args: argparse.Namespace, async_chunk: bool, placement: list[str | None], priority: bool = True,
    direct: bool = True,
) -> dict[str, Any]:
    orch = Orchestrator(deploy_for(args, async_chunk, placement, priority, direct))
    t0 = time.perf_counter()
    await orch.start()
    out: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 2), "startup_phases": startup_phases(orch),
                           "gpu_sharing": orch.gpu_sharing}
    if args.startup_only:
        await orch.stop()
        return out
    levels = [int(c) for c in args.concurrency.split(",")]
    try:
        t1 = time.perf_counter()
        await one(orch, args, 0)  # warm-up: one alone, then one batch at the top level
        t2 = time.perf_counter()
        await asyncio.gather(*(one(orch, args, 100 + i) for i in range(max(levels))))
        # what the first requests after a start paid (buckets compiled and captured at first use)
        out["warmup_s"] = {"first": round(t2 - t1, 2), "batch": round(time.perf_counter() - t2, 2)}
        for c in levels:
            before = await stage_work(orch)
            holds = orch.statistics().first_output_holds
            if os.environ.get("OMNI_BENCH_PHASE_DIR"):  # a profiler outside waits for this file
                (Path(os.environ["OMNI_BENCH_PHASE_DIR"]) / f"c{c}.start").touch()
            t1 = time.perf_counter()
            if c == 1:
                samples = [await one(orch, args, 1000 + i) for i in range(args.requests_c1)]
            else:
                gap = args.stagger_ms / 1000
                runs = (one(orch, args, 2000 + i, i * gap) for i in range(c))
                samples = list(await asyncio.gather(*runs))
            wall = time.perf_counter() - t1
            out[f"c{c}"] = summarize(samples, wall)
            out[f"c{c}"]["stages"] = stage_deltas(before, await stage_work(orch), wall)
            out[f"c{c}"]["first_output_holds"] = orch.statistics().first_output_holds - holds
        out["workers_rss_gb"] = worker_rss_gb()
        out["gpu_used_gb"] = gpu_used_gb()
    finally:
        await orch.stop()
    return out


async def stage_work(orch: Orchestrator) -> dict[str, tuple[int, float, dict[str, Any]]]:
    """Each stage's (engine steps, seconds in steps, first-output p50s since the last call), summed over
    replicas, as the workers' heartbeats report them: read one heartbeat interval after the last
    activity, so nothing done is missing. The first-output samples are taken (and cleared) here."""
    await asyncio.sleep(HEARTBEAT_INTERVAL_S * 1.2)
    out = {}
    for st in orch.statistics().stages:
        lat = orch.first_outputs[st.stage_id]
        out[st.model_stage] = (sum(r.steps for r in st.replicas), sum(r.busy_s for r in st.replicas),
                               summary_ms(lat))
        lat.recent.clear()
    return out


def stage_deltas(
    before: dict[str, tuple[int, float, dict[str, Any]]], after: dict[str, tuple[int, float, dict[str, Any]]],
    wall: float,
) -> dict[str, dict[str, Any]]:
    """Per stage over one level: engine steps, seconds in steps, the mean step, the busy fraction of
    the level's wall time (the stage's worker was stepping, not waiting for input), and its first
    outputs (`first_out`: p50 since submit, and of the stage's own share, since it was started)."""
    out = {}
    for stage, (steps, busy, first) in after.items():
        n, s = steps - before[stage][0], busy - before[stage][1]
        out[stage] = {"steps": n, "busy_s": round(s, 3), "step_ms": round(1000 * s / n, 2) if n else None,
                      "busy_frac": round(s / wall, 3) if wall > 0 else None}
        if first["n"]:
            out[stage]["first_out"] = {k: v for k, v in first.items() if k != "n"}
    return out


def startup_phases(orch: Orchestrator) -> dict[str, dict[str, float]]:
    """Each stage replica's start-up phases, seconds ("thinker/0": {"ready": ..., "engine.weights": ...})."""
    return {f"{st.model_stage}/{r.replica}": r.startup for st in orch.statistics().stages for r in st.replicas}


async def startup_runs(args: argparse.Namespace, *mode: Any) -> dict[str, Any]:
    """--startup-only: `--starts` start-ups in a row; the first one's phases and every total."""
    runs = [await run_mode(args, *mode) for _ in range(max(1, args.starts))]
    return {**runs[0], "startup_s_runs": [r["startup_s"] for r in runs],
            "startup_phases_last": runs[-1]["startup_phases"]}


async def main() -> None:
    args = parse_args()
    from omni_actors import logs

    logs.configure("bench")  # logs to stderr; stdout carries only the JSON line
    modes = {"on": True, "off": False}
    results = {}
    places = placements(args)
    prios = args.priority.split(",")
    directs = args.direct_load.split(",")
    for place in places:
        tag = "" if len(places) == 1 else "@" + ",".join(str(d) for d in place)
        for name in args.modes.split(","):
            for prio in prios:
                ptag = "" if prios == ["on"] else f"_priority_{prio}"
                for direct in directs:
                    dtag = "" if directs == ["on"] else f"_direct_{direct}"
                    measure = startup_runs if args.startup_only else run_mode
                    results[f"async_chunk_{name}{ptag}{dtag}{tag}"] = await measure(
                        args, modes[name], place, prio == "on", direct == "on"
                    )
    line: dict[str, Any] = {
        "bench": "omni_pipeline",
        "pipeline": args.pipeline,
        "model": str(args.model),
        "devices": args.devices,
        "placements": args.placements,
        "dtype": args.dtype,
        "text_tokens": args.text_tokens,
        "codes": args.codes,
        "ar_extras": args.ar_extras,
        "talker_extras": args.talker_extras,
        "code2wav_extras": args.code2wav_extras,
        "deploy_extras": args.deploy_extras,
        "priority": args.priority,
        "stagger_ms": args.stagger_ms,
        "direct_load": args.direct_load,
        "startup_only": args.startup_only,
        "results": results,
    }
    for name in args.modes.split(","):
        on = results.get(f"async_chunk_{name}_priority_on")
        off = results.get(f"async_chunk_{name}_priority_off")
        if on and off:  # first audio, priority off / on (> 1: priority gives it sooner)
            line.setdefault("ttfa_priority_off_over_on", {})[name] = {
                f"{k}_{q}": round(off[k][f"ttfa_{q}_ms"] / on[k][f"ttfa_{q}_ms"], 2)
                for k in on
                for q in ("p50", "max")
                if k.startswith("c") and on[k][f"ttfa_{q}_ms"] and off[k][f"ttfa_{q}_ms"]
            }
    on, off = results.get("async_chunk_on"), results.get("async_chunk_off")
    if on and off:
        line["ttfa_off_over_on"] = {
            k: round(off[k]["ttfa_p50_ms"] / on[k]["ttfa_p50_ms"], 2)
            for k in on
            if k.startswith("c") and on[k]["ttfa_p50_ms"] and off[k]["ttfa_p50_ms"]
        }
    for name, res in results.items():
        levels = [k for k in res if k.startswith("c") and k != "c1"]
        if "c1" in res and levels:
            top = levels[-1]
            line.setdefault("throughput_gain", {})[name] = round(
                res[top]["audio_s_per_wall_s"] / res["c1"]["audio_s_per_wall_s"], 2
            )
    gpus = sorted({d for p in places for d in p if d is not None})
    import torch

    if len(gpus) > 1 and torch.cuda.is_available():
        width = int(json.loads((args.model / "config.json").read_text()).get("thinker_config", {})
                    .get("text_config", {}).get("hidden_size", 2048))  # fmt: skip
        line["handoff_per_step"] = {
            "same_gpu": handoff_cost(width, "bfloat16", "cuda:0", "cuda:0"),
            "cross_gpu": handoff_cost(width, "bfloat16", "cuda:0", f"cuda:{torch.cuda.device_count() - 1}"),
        }
    print(json.dumps(line))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
