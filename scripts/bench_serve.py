"""REST API benchmark: chat (text, text+audio), speech and images over HTTP+SSE vs the orchestrator called directly.

For each workload and concurrency level it sends `--requests` requests with
that many in flight and reports requests/s, time to first token (TTFT), time
to first audio (TTFA), end-to-end p50/p99 and the audio real-time factor
(processing seconds per second of audio, lower is better).

Baseline, measured in the same run: the same work submitted to an
Orchestrator in this process (the RequestSpec each route builds, same deploy,
no HTTP). Against it: `omni-run` serving that deploy in a subprocess, driven
over HTTP by an aiohttp client here (SSE for chat, chunked audio for speech).
Both run side by side and each level alternates between them in ROUNDS
rounds, so background load on a shared machine lands on both alike.

    .venv/bin/python scripts/bench_serve.py                          # 1,4,16,64; synthetic pipelines
    .venv/bin/python scripts/bench_serve.py --concurrency 1,4 --requests 16 --workloads chat_text,speech

Prints one JSON line; `--markdown` also prints a table to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import numpy as np
import yaml

from omni_actors import logs
from omni_actors.config.deploy import load_deploy
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec

PROMPT = "the quick brown fox jumps over the lazy dog"
SERVER_READY_TIMEOUT_S = 180.0
WARMUP_REQUESTS = 4
ROUNDS = 4
"""Each level alternates direct and HTTP this many times (samples pooled per mode)."""
WORKLOADS = ("chat_text", "chat_audio", "speech", "images")
PIPELINE_OF = {"chat_text": "synthetic", "chat_audio": "synthetic", "speech": "synthetic", "images": "synthetic_image"}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default max(32, 2 x level))")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--tokens", type=int, default=16, help="text chunks per chat / speech request (audio: 0.1 s each)")
    ap.add_argument("--step-ms", type=float, default=5.0, help="synthetic compute per engine step")
    ap.add_argument("--image-steps", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    return ap.parse_args()


def deploy_raw(pipeline: str, args: argparse.Namespace) -> dict[str, Any]:
    extras = {"step_delay_ms": args.step_ms, "chunks": args.tokens}
    if pipeline == "synthetic":
        stages = [{"stage_id": s, "max_num_seqs": 64, "max_queue": 512,
                   "engine_extras": extras if s == 0 else {}} for s in (0, 1, 2)]
    else:
        stages = [{"stage_id": 0, "max_num_seqs": 64, "max_queue": 512, "engine_extras": extras}]
    return {"pipeline": pipeline, "async_chunk": True, "stages": stages,
            "server": {"host": "127.0.0.1", "port": 8000}}


# ---- one request, two ways ------------------------------------------------------------


class Sample:
    __slots__ = ("audio_s", "e2e", "ttfa", "ttft")

    def __init__(self) -> None:
        self.ttft: float | None = None
        self.ttfa: float | None = None
        self.e2e = 0.0
        self.audio_s = 0.0


def specs(workload: str, orch: Orchestrator, args: argparse.Namespace) -> RequestSpec:
    """What the route for `workload` submits (see omni_actors/api/{chat,speech,images}.py)."""
    pipe = orch.pipeline
    deadline = orch.deploy.server.request_timeout_s
    if workload == "chat_text":
        return RequestSpec({"messages": [{"role": "user", "content": PROMPT}]},
                           {"max_tokens": args.tokens, "modalities": ["text"]},
                           stages=pipe.stages_for_outputs({"text"}), deadline_s=deadline)
    if workload == "chat_audio":
        return RequestSpec({"messages": [{"role": "user", "content": PROMPT}]},
                           {"max_tokens": args.tokens, "modalities": ["text", "audio"], "audio_format": "pcm16"},
                           stages=pipe.stages_for_outputs({"text", "audio"}), deadline_s=deadline)
    if workload == "speech":
        return RequestSpec({"text": PROMPT, "speed": 1.0}, {},
                           stages=pipe.stages_for_outputs({"audio"}), deadline_s=deadline)
    return RequestSpec({"prompt": PROMPT}, {"n": 1, "width": 64, "height": 64,
                                            "num_inference_steps": args.image_steps},
                       stages=pipe.stages_for_outputs({"image"}), deadline_s=deadline)


async def direct_one(orch: Orchestrator, workload: str, args: argparse.Namespace) -> Sample:
    s, t0 = Sample(), time.perf_counter()
    async for chunk in orch.submit(specs(workload, orch, args)):
        now = time.perf_counter() - t0
        if chunk.output_type == "text" and s.ttft is None and chunk.data.get("text"):
            s.ttft = now
        if chunk.output_type == "audio" and "audio" in chunk.data:
            s.ttfa = now if s.ttfa is None else s.ttfa
            s.audio_s += chunk.data["audio"].size / chunk.data["sample_rate"]
    s.e2e = time.perf_counter() - t0
    return s


def http_body(workload: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    msgs = [{"role": "user", "content": PROMPT}]
    if workload == "chat_text":
        return "/v1/chat/completions", {"model": "synthetic", "messages": msgs, "max_tokens": args.tokens,
                                        "stream": True}
    if workload == "chat_audio":
        return "/v1/chat/completions", {"model": "synthetic", "messages": msgs, "max_tokens": args.tokens,
                                        "stream": True, "modalities": ["text", "audio"],
                                        "audio": {"voice": "a", "format": "pcm16"}}
    if workload == "speech":
        return "/v1/audio/speech", {"model": "synthetic", "input": PROMPT, "response_format": "pcm",
                                    "stream": True}
    return "/v1/images/generations", {"prompt": PROMPT, "size": "64x64", "num_inference_steps": args.image_steps}


async def http_one(session: aiohttp.ClientSession, url: str, workload: str, args: argparse.Namespace,
                   rate: int = 24000) -> Sample:
    import base64

    path, body = http_body(workload, args)
    s, t0 = Sample(), time.perf_counter()
    async with session.post(url + path, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {await resp.text()}")
        if workload == "speech":
            async for part in resp.content.iter_any():
                s.ttfa = time.perf_counter() - t0 if s.ttfa is None else s.ttfa
                s.audio_s += len(part) / 2 / rate
        elif workload == "images":
            await resp.read()
        else:
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                delta = json.loads(line[6:])["choices"]
                delta = delta[0]["delta"] if delta else {}
                now = time.perf_counter() - t0
                if delta.get("content") and s.ttft is None:
                    s.ttft = now
                if (delta.get("audio") or {}).get("data"):
                    s.ttfa = now if s.ttfa is None else s.ttfa
                    s.audio_s += len(base64.b64decode(delta["audio"]["data"])) / 2 / rate
    s.e2e = time.perf_counter() - t0
    return s


# ---- load generation and summaries ---------------------------------------------------


async def run_level(one: Callable[[], Awaitable[Sample]], concurrency: int, n: int,
                    samples: list[Sample]) -> float:
    """Send `n` requests, `concurrency` at a time; append their samples and return the wall time."""
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            samples.append(await one())

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def summarize(samples: list[Sample], wall: float) -> dict[str, Any]:
    e2e = [s.e2e for s in samples]
    ttft = [s.ttft for s in samples if s.ttft is not None]
    ttfa = [s.ttfa for s in samples if s.ttfa is not None]
    rtf = [s.e2e / s.audio_s for s in samples if s.audio_s > 0]
    return {
        "n": len(samples), "rps": round(len(samples) / wall, 2),
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99),
        "ttft_p50_ms": _pct(ttft, 50), "ttfa_p50_ms": _pct(ttfa, 50),
        "rtf_p50": round(float(np.median(rtf)), 4) if rtf else None,
    }


# ---- the two modes, interleaved ------------------------------------------------------


class ServerProcess:
    """`omni-run --deploy FILE --port P` in a subprocess; ready when it logs server.ready."""

    def __init__(self, deploy_file: Path, port: int) -> None:
        self.cmd = [sys.executable, "-m", "omni_actors.cli", "--deploy", str(deploy_file), "--port", str(port)]
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.tail: list[str] = []

    async def __aenter__(self) -> ServerProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "OMNI_LOG_LEVEL": "info"})
        self._drain = asyncio.ensure_future(self._read_logs())
        try:
            await asyncio.wait_for(self.ready.wait(), SERVER_READY_TIMEOUT_S)
        except TimeoutError:
            await self.__aexit__(None, None, None)
            raise RuntimeError(f"server did not start (exit {self.proc and self.proc.returncode}): "
                               + "".join(self.tail[-20:])) from None
        return self

    async def _read_logs(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.tail = [*self.tail[-50:], line]
            if "server.ready" in line:
                self.ready.set()

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
        self._drain.cancel()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def n_for(concurrency: int, args: argparse.Namespace) -> int:
    return args.requests or max(32, 2 * concurrency)


async def bench_pipeline(deploy_file: Path, workloads: list[str], levels: list[int],
                         args: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    """Both modes side by side (same deploy), alternating in ROUNDS rounds per level so that
    drifting background load on a shared machine hits both alike."""
    orch = Orchestrator(load_deploy(deploy_file))
    await orch.start()
    url = f"http://127.0.0.1:{(port := free_port())}"
    out: dict[str, dict[str, dict[str, Any]]] = {w: {"direct": {}, "http": {}} for w in workloads}
    try:
        async with ServerProcess(deploy_file, port):
            conn = aiohttp.TCPConnector(limit=max(levels))
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
                for w in workloads:
                    modes = {"direct": lambda w=w: direct_one(orch, w, args),
                             "http": lambda w=w: http_one(session, url, w, args)}
                    for one in modes.values():
                        for _ in range(WARMUP_REQUESTS):
                            await one()
                    for c in levels:
                        per_round = max(c, n_for(c, args) // ROUNDS)
                        samples: dict[str, list[Sample]] = {m: [] for m in modes}
                        walls = dict.fromkeys(modes, 0.0)
                        for _ in range(ROUNDS):
                            for mode, one in modes.items():
                                walls[mode] += await run_level(one, c, per_round, samples[mode])
                        for mode in modes:
                            out[w][mode][str(c)] = summarize(samples[mode], walls[mode])
    finally:
        await orch.stop()
    return out


def overhead(results: dict[str, Any], key: str = "e2e_p50_ms", level: str = "1") -> dict[str, float | None]:
    out = {}
    for w, modes in results.items():
        d, h = modes["direct"].get(level, {}).get(key), modes["http"].get(level, {}).get(key)
        out[w] = round((h - d) / d * 100, 1) if d and h is not None else None
    return out


def markdown(results: dict[str, Any]) -> str:
    rows = ["| workload | mode | conc | req/s | TTFT p50 ms | TTFA p50 ms | e2e p50 ms | e2e p99 ms | RTF p50 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for w, modes in results.items():
        for mode in ("direct", "http"):
            for c, r in modes[mode].items():
                rows.append(f"| {w} | {mode} | {c} | {r['rps']} | {r['ttft_p50_ms']} | {r['ttfa_p50_ms']} | "
                            f"{r['e2e_p50_ms']} | {r['e2e_p99_ms']} | {r['rtf_p50']} |")
    return "\n".join(rows)


async def main() -> None:
    args = parse_args()
    logs.configure("bench")  # logs to stderr; stdout carries only the JSON line
    levels = [int(c) for c in args.concurrency.split(",")]
    workloads = [w for w in args.workloads.split(",") if w]
    results: dict[str, Any] = {w: {} for w in workloads}
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline in dict.fromkeys(PIPELINE_OF[w] for w in workloads):
            mine = [w for w in workloads if PIPELINE_OF[w] == pipeline]
            path = Path(tmp) / f"{pipeline}.yaml"
            path.write_text(yaml.safe_dump(deploy_raw(pipeline, args)))
            results.update(await bench_pipeline(path, mine, levels, args))
    line = {
        "bench": "serve", "concurrency": levels, "tokens": args.tokens, "step_ms": args.step_ms,
        "http_overhead_e2e_p50_pct_c1": overhead(results), "target_pct": 5.0, "results": results,
    }
    print(json.dumps(line))
    if args.markdown:
        print(markdown(results), file=sys.stderr)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
