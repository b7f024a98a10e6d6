"""Realtime benchmark: the latency /v1/realtime adds on top of the pipeline, and barge-in time.

N concurrent sessions (default 1, 4, 16) replay espeak-ng speech at real-time
pace with server VAD; every turn's answer is long enough that the next turn
talks over it (barge-in). Measured by the clients (a separate process):

- first audio: from `speech_stopped` to the response's first audio delta;
- barge-in: from `speech_started` to `response.done` (cancelled, turn_detected),
  and from the moment the client sent the first audio of that speech.

Baselines, same run: (1) per response, the pipeline's own time to first audio
for that very response (orchestrator submit to first audio chunk, recorded by
the server's realtime statistics); runtime-added latency = client-seen first
audio - that (`added_*`). (2) The same request (same audio, params, empty
history: the clients delete each finished turn) submitted straight to the
orchestrator with the same concurrency and stagger, p50 against p50
(`added_vs_baseline_p50_ms`; noisy with a real LLM, whose answers vary).
Target: added p50 <= 30 ms at 16 sessions; barge-in <= 100 ms after the VAD fires.

    .venv/bin/python scripts/bench_realtime.py [--sessions 1 4 16] [--turns 4]
    .venv/bin/python scripts/bench_realtime.py --pipeline assistant --sessions 1 4 --turns 3 --gap 6

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNI_LOG_LEVEL", "warning")

import numpy as np

PHRASES = ("What is the weather like in Paris today?", "Please book a table for two at eight.",
           "How far away is the moon from here?", "Tell me a short story about a cat.")
CHUNK_S = 0.04
"""Audio per append, as a microphone client sends it."""
GAP_S = 1.0
"""Silence after each phrase (--gap); the VAD ends the turn 500 ms into it, the next phrase barges in."""
ANSWER_TOKENS = 80
"""Answer length: at 20 ms per token (1.6 s) it outlasts the gap, so each next turn interrupts it."""
STEP_MS = {0: 20, 1: 5, 2: 5}
PARAMS = {"temperature": 0.0, "voice": "alloy", "modalities": ["text", "audio"], "max_tokens": ANSWER_TOKENS}
TURN = {"role": "user", "content": [{"type": "input_audio", "array": "audio", "sample_rate": 16_000}]}
"""What the realtime layer sends for these sessions' turns; the baseline sends the same."""
WIRE_RATE = 24_000


def p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(values, q)), 2)


def make_speech(tmp: Path) -> list[np.ndarray]:
    import soundfile as sf

    from omni_actors.api.realtime.audio import resample

    out = []
    for i, text in enumerate(PHRASES):
        wav = tmp / f"p{i}.wav"
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp)}  # else espeak-ng leaves a /tmp/pulse-* behind
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True, env=env)
        x, rate = sf.read(wav, dtype="float32")
        out.append(resample(x, rate, WIRE_RATE))
    return out


# ---- the client process ----------------------------------------------------------------


def session_stream(k: int, turns: int, speech: list[np.ndarray], gap_s: float) -> tuple[np.ndarray, list[int]]:
    """The microphone signal of session k and the sample index where each phrase starts."""
    parts, onsets, pos = [], [], 0
    for j in range(turns):
        phrase = speech[(k + j) % len(speech)]
        onsets.append(pos)
        gap = np.zeros(int((gap_s if j < turns - 1 else max(4.0, gap_s)) * WIRE_RATE), np.float32)
        parts += [phrase, gap]
        pos += len(phrase) + len(gap)
    return np.concatenate(parts), onsets


async def run_session(url: str, k: int, offset_s: float, turns: int, speech: list[np.ndarray],
                      gap_s: float) -> dict[str, list]:
    import aiohttp

    stream, onsets = session_stream(k, turns, speech, gap_s)
    res: dict[str, list] = {"first_audio": [], "barge_in": [], "barge_in_onset": []}
    state: dict[str, Any] = {"stop": None, "start": None, "active": False, "onset_sent": []}
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
        await ws.send_json({"type": "session.update", "session": {
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                               "silence_duration_ms": 500},
            "max_response_output_tokens": ANSWER_TOKENS, "temperature": 0.0}})
        done_all = asyncio.Event()

        async def reader() -> None:
            responses, items = 0, []
            async for msg in ws:
                ev = json.loads(msg.data)
                now = time.perf_counter()
                t = ev["type"]
                if t == "input_audio_buffer.speech_stopped":
                    state["stop"] = now
                elif t == "response.created":
                    state["response"] = ev["response"]["id"]
                elif t == "response.audio.delta" and state["stop"] is not None:
                    res["first_audio"].append((state["response"], (now - state["stop"]) * 1000))
                    state["stop"] = None
                elif t == "input_audio_buffer.speech_started":
                    state["start"] = now
                elif t == "conversation.item.created":
                    items.append(ev["item"]["id"])
                elif t == "response.done":
                    # forget the turn: every request then carries what the baseline's does
                    for item_id in items:
                        await ws.send_json({"type": "conversation.item.delete", "item_id": item_id})
                    items.clear()
                    responses += 1
                    r = ev["response"]
                    if r["status"] == "cancelled" and state["start"] is not None:
                        res["barge_in"].append((now - state["start"]) * 1000)
                        if state["onset_sent"]:
                            res["barge_in_onset"].append((now - state["onset_sent"][-1]) * 1000)
                    if responses == turns:
                        done_all.set()

        task = asyncio.ensure_future(reader())
        await asyncio.sleep(offset_s)
        step = int(CHUNK_S * WIRE_RATE)
        t0 = time.perf_counter()
        onset_chunks = {o // step for o in onsets}
        for i, at in enumerate(range(0, len(stream), step)):
            delay = t0 + i * CHUNK_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if i in onset_chunks:
                state["onset_sent"].append(time.perf_counter())
            pcm = (np.clip(stream[at:at + step], -1, 1) * 32767).astype("<i2").tobytes()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        await asyncio.wait_for(done_all.wait(), 120)
        await ws.close()
        task.cancel()
    return res


def client_main(url: str, sessions: int, turns: int, speech_dir: str, gap_s: float, out: Any) -> None:
    speech = [np.load(f) for f in sorted(Path(speech_dir).glob("*.npy"))]
    period = len(speech[0]) / WIRE_RATE + gap_s

    async def main() -> list[dict[str, list]]:
        return await asyncio.gather(*(
            run_session(url, k, k * period / sessions, turns, speech, gap_s) for k in range(sessions)))

    out.send(asyncio.run(main()))


# ---- the server process: orchestrator, baseline, app ---------------------------------------


async def baseline(orch: Any, sessions: int, turns: int, period: float, hold_s: float,
                   speech: list[np.ndarray]) -> list[float]:
    """Time to first audio straight through the orchestrator, same stagger; answers cut after hold_s."""
    from omni_actors.api.realtime.audio import resample
    from omni_actors.orchestrator.requests import RequestSpec

    # what a committed turn carries: prefix padding, the phrase, the silence that ended it
    heard = [resample(np.concatenate([np.zeros(int(0.3 * WIRE_RATE), np.float32), x,
                                      np.zeros(int(0.5 * WIRE_RATE), np.float32)]), WIRE_RATE, 16_000)
             for x in speech]
    lat: list[float] = []

    async def one(k: int) -> None:
        await asyncio.sleep(k * period / sessions)
        for j in range(turns):
            start = time.perf_counter()
            audio = heard[(k + j) % len(heard)]
            spec = RequestSpec(inputs={"messages": [TURN], "audio": audio, "sample_rate": 16_000},
                               params=PARAMS)
            stream = orch.submit(spec)
            async for chunk in stream:
                if chunk.output_type == "audio":
                    lat.append((time.perf_counter() - start) * 1000)
                    break
            await asyncio.sleep(max(0.0, start + hold_s - time.perf_counter()))
            stream.abort()
            await asyncio.sleep(max(0.0, start + period * (j + 1) - time.perf_counter()) if j < turns - 1 else 0)

    await asyncio.gather(*(one(k) for k in range(sessions)))
    return lat


async def serve_and_measure(args: argparse.Namespace, speech_dir: str, speech: list[np.ndarray]) -> dict[str, Any]:
    from aiohttp import web

    from omni_actors.api.app import build_app
    from omni_actors.api.realtime import STATS_KEY
    from omni_actors.config.deploy import build_deploy, load_deploy
    from omni_actors.orchestrator.core import Orchestrator

    server = {"max_realtime_sessions": max(args.sessions)}
    if args.pipeline == "assistant":
        from omni_actors.models.assistant.prepare import default_data_dir, prepare

        bundled = Path(__file__).resolve().parents[1] / "omni_actors" / "deploy" / "assistant.yaml"
        deploy = load_deploy(bundled, {"model": str(prepare(default_data_dir())), "server": server})
    else:
        stages = [{"stage_id": s, "engine_extras": {"step_delay_ms": ms, **({"chunks": 8} if s == 0 else {})}}
                  for s, ms in STEP_MS.items()]
        deploy = build_deploy({"pipeline": "synthetic", "async_chunk": True, "stages": stages,
                               "server": server}, source="bench")
    orch = Orchestrator(deploy)
    await orch.start()
    app = build_app(orch)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"ws://{host}:{port}/v1/realtime?model={args.pipeline}"
    period = len(speech[0]) / WIRE_RATE + args.gap
    rows = []
    try:
        await baseline(orch, 1, 1, period, hold_s=0.0, speech=speech)  # warm-up, not measured
        for n in args.sessions:
            base = await baseline(orch, n, args.turns, period, hold_s=args.gap - 0.5, speech=speech)
            parent, child = mp.Pipe()
            proc = mp.get_context("spawn").Process(target=client_main,
                                                 args=(url, n, args.turns, speech_dir, args.gap, child))
            proc.start()
            results = await asyncio.get_running_loop().run_in_executor(None, parent.recv)
            await asyncio.get_running_loop().run_in_executor(None, proc.join)
            first = [ms for r in results for _, ms in r["first_audio"]]
            # the same response's pipeline time (submit -> first audio chunk), recorded by the server
            pipeline = app[STATS_KEY].statistics().pipeline_first_audio_ms
            paired = [ms - pipeline[rid] for r in results for rid, ms in r["first_audio"] if rid in pipeline]
            barge = [x for r in results for x in r["barge_in"]]
            onset = [x for r in results for x in r["barge_in_onset"]]
            rows.append({
                "sessions": n, "turns": len(first),
                "first_audio_p50_ms": p(first, 50), "first_audio_p90_ms": p(first, 90),
                "baseline_first_audio_p50_ms": p(base, 50), "baseline_first_audio_p90_ms": p(base, 90),
                "added_p50_ms": p(paired, 50), "added_p90_ms": p(paired, 90),
                "added_vs_baseline_p50_ms": round(statistics.median(first) - statistics.median(base), 2)
                if first and base else None,
                "barge_ins": len(barge), "barge_in_p50_ms": p(barge, 50), "barge_in_p90_ms": p(barge, 90),
                "barge_in_from_speech_sent_p50_ms": p(onset, 50),
            })
            stats = orch.statistics()
            assert stats.requests_in_flight == 0 and stats.leases_held == 0, stats
    finally:
        await runner.cleanup()
        await orch.stop()
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--turns", type=int, default=4, help="spoken turns per session")
    ap.add_argument("--pipeline", choices=["synthetic", "assistant"], default="synthetic")
    ap.add_argument("--gap", type=float, default=GAP_S, help="silence between phrases, seconds")
    args = ap.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is needed to synthesise the speech")
    from omni_actors import logs

    logs.configure()
    with tempfile.TemporaryDirectory() as tmp:
        speech = make_speech(Path(tmp))
        for i, x in enumerate(speech):
            np.save(Path(tmp) / f"p{i}.npy", x)
        import uvloop

        out = uvloop.run(serve_and_measure(args, tmp, speech))
    rows = out["rows"]
    at16 = next((r for r in rows if r["sessions"] == 16), None)
    print(json.dumps({
        "bench": "realtime", "pipeline": args.pipeline,
        "step_ms": STEP_MS if args.pipeline == "synthetic" else None, "gap_s": args.gap, "cpus": os.cpu_count(),
        "chunk_ms": int(CHUNK_S * 1000), "results": rows,
        "target": {"added_p50_ms_at_16": 30, "barge_in_p50_ms": 100},
        "met": None if at16 is None else bool(
            at16["added_p50_ms"] is not None and at16["added_p50_ms"] <= 30
            and at16["barge_in_p50_ms"] is not None and at16["barge_in_p50_ms"] <= 100),
    }))


if __name__ == "__main__":
    main()
