"""Text-completions benchmark: POST /v1/completions on omni-run's one-stage `llm` pipeline vs `vllm serve`.

Both serve the assistant's SmolLM2-135M-Instruct folder (`omni-run prepare assistant`, by default
~/.cache/omni-actors/assistant/llm) on CPU with one OpenMP thread each, with the same engine settings:
the assistant deploy's llm stage (max_num_seqs, dtype, max_model_len, KV cache) turned into vLLM
EngineArgs by our own vllm_backend.engine_kwargs, which the vLLM side gets as command-line flags
(and backend_env's CPU variables). Ours runs vLLM's LLMEngine in-process in a worker behind the
orchestrator; vLLM's server runs AsyncLLM with its engine core in a child process, its default.

Both servers start side by side (their start-up times overlap on the shared cores) and stay up; one
client here (openai's AsyncOpenAI, streamed completions, temperature 0, a fixed output length through
`ignore_eos` and `min_tokens`) drives each in turn. Each concurrency level alternates the servers
ROUNDS times, the first server swapped every round, so background load lands on both alike.

    .venv/bin/python scripts/bench_completions.py                  # c1 and c8, 64 tokens, 3 rounds
    .venv/bin/python scripts/bench_completions.py --quick          # smoke: 16 tokens, 2 rounds

On the 2-core box at load 6 the default takes ~4 min and --quick ~2 min, of which ~70-95 s is
`vllm serve` starting (ours is up in ~40 s, the two loading at once).

Prints one JSON line. Per level and server: TTFT p50/p99 (first non-empty text chunk), ITL p50 (gap
between text chunks), TPOT p50 ((e2e - TTFT) / (tokens - 1)), output tokens/s and requests/s over
the measured wall time; `ratio` is ours/vLLM for throughput and vLLM/ours for latencies (above 1:
ours is better). `leaks`: processes either server left behind (killed), our run's /dev/shm segments
and runtime folder, our engine's temp folders; vLLM's server leaves its IPC socket files (counted),
which go with this script's temp folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import yaml
from openai import AsyncOpenAI

from omni_actors.cli import bundled_deploy
from omni_actors.models.assistant import LLM
from omni_actors.settings import settings
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines import vllm_backend

READY_TIMEOUT_S = 240.0
"""Longest wait for a server's line saying it serves (both load at once on 2 cores)."""
STOP_TIMEOUT_S = 30.0
"""Longest wait for a server to exit after SIGINT before it (and what it started) is killed."""
REAP_TIMEOUT_S = 10.0
"""Longest wait for a killed process to be gone."""
REQUEST_TIMEOUT_S = 120.0
ROUNDS = 3
SERVED_NAME = "smollm2"
OURS_READY = "server.ready"
VLLM_READY = "Application startup complete"
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colours are",
    "def fibonacci(n):",
    "The best way to learn a new language is",
    "Water boils at a temperature of",
    "In the year 2050, cities will",
    "A recipe for pancakes: first,",
)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--per-round", type=int, default=0,
                    help="requests per server per round at each level (default: one batch, at least 2)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--model-dir", type=Path, default=settings().data_dir / "assistant" / "llm",
                    help="the SmolLM2 folder (default: the prepared assistant's llm)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 tokens, 2 rounds, few requests")
    args = ap.parse_args()
    if args.quick:
        args.max_tokens, args.rounds = 16, 2
    return args


# ---- the same engine settings on both sides ------------------------------------------


def llm_stage() -> dict[str, Any]:
    """The assistant deploy's llm stage as written (max_num_seqs, dtype, engine_extras)."""
    raw = yaml.safe_load(bundled_deploy().read_text())
    stage = next(s for s in raw["stages"] if s["stage_id"] == LLM)
    extras = {k: v for k, v in stage.get("engine_extras", {}).items() if k in ("max_model_len", "kv_cache_space_gib")}
    return {"max_num_seqs": stage.get("max_num_seqs", 8), "dtype": stage.get("dtype", "auto"), "engine_extras": extras}


def engine_context(model_dir: Path, stage: dict[str, Any]) -> EngineContext:
    return EngineContext(stage_id=0, replica=0, model_stage="llm", model_path=model_dir, device="cpu",
                         max_num_seqs=stage["max_num_seqs"], dtype=stage["dtype"], gpu_memory_utilization=0.0,
                         tensor_parallel_size=1, engine_extras=dict(stage["engine_extras"]))


def cli_value(value: Any) -> str:
    if dataclasses.is_dataclass(value):  # (StructuredOutputsConfig: the fields set away from their defaults)
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                 if f.default is not dataclasses.MISSING and getattr(value, f.name) != f.default}
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def vllm_flags(ctx: EngineContext) -> list[str]:
    """Our engine's EngineArgs keywords as `vllm serve` flags."""
    flags = []
    for key, value in vllm_backend.engine_kwargs(ctx).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, cli_value(value)]
    return flags


# ---- servers as subprocesses ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (its workers start their own sessions, so a process group misses them)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = {int(k) for k in (task / "children").read_text().split()}
                todo += kids - found
                found |= kids
    return found


async def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Wait (on pidfds, no polling) for `pids` to exit; the ones still alive after `timeout_s`."""
    loop = asyncio.get_running_loop()
    waits: dict[int, asyncio.Future[None]] = {}
    fds = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds.append(fd)
        fut = waits[pid] = loop.create_future()
        loop.add_reader(fd, lambda f=fut: f.done() or f.set_result(None))
    try:
        if waits:
            await asyncio.wait(waits.values(), timeout=timeout_s)
        return {pid for pid, fut in waits.items() if not fut.done()}
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)


class Server:
    """A server command in a subprocess; ready when a line of its output contains `ready`."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], ready: str) -> None:
        self.name, self.cmd, self.env, self.marker = name, cmd, env, ready
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.tail: list[str] = []
        self.start_s = 0.0
        self.shm_prefix: str | None = None
        self.runtime_dir: str | None = None
        self.leftovers: list[int] = []
        self._drain: asyncio.Future[None] | None = None

    async def start(self) -> None:
        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            *self.cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True)
        self._drain = asyncio.ensure_future(self._read())
        exited = asyncio.ensure_future(self.proc.wait())
        ready = asyncio.ensure_future(self.ready.wait())
        await asyncio.wait({ready, exited}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        exited.cancel()
        if not self.ready.is_set():
            raise RuntimeError(f"{self.name} did not start within {READY_TIMEOUT_S} s (exit {self.proc.returncode}):\n"
                               + "".join(self.tail[-30:]))
        self.start_s = round(time.perf_counter() - t0, 1)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self.tail = [*self.tail[-60:], line]
            if self.marker in line and not self.ready.is_set():
                plain = re.sub(r"\x1b\[[0-9;]*m", "", line)
                for key in ("shm_prefix", "runtime_dir"):  # (ours says where its run lives: checked at the end)
                    if found := re.search(key + r"=(\S+)", plain):
                        setattr(self, key, found.group(1).strip("'\""))
                self.ready.set()

    async def stop(self) -> None:
        """SIGINT, as Ctrl-C; past STOP_TIMEOUT_S, SIGKILL to it and everything it started."""
        if self.proc is None:
            return
        family = descendants(self.proc.pid)
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        left = await wait_gone(family, STOP_TIMEOUT_S if self.proc.returncode == 0 else REAP_TIMEOUT_S)
        for pid in left:  # (counted in the JSON line: a leak to look at)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.leftovers = sorted(left)
        await wait_gone(left, REAP_TIMEOUT_S)
        if self._drain is not None:
            await asyncio.gather(self._drain, return_exceptions=True)


def servers(args: argparse.Namespace, private_dir: Path) -> tuple[Server, Server, dict[str, Any]]:
    stage = llm_stage()
    ctx = engine_context(args.model_dir, stage)
    base = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    overrides = json.dumps({"0": stage})
    ours = Server("ours", [sys.executable, "-m", "omni_actors.cli", "--model", str(args.model_dir),
                           "--served-model-name", SERVED_NAME, "--port", str(free_port()),
                           "--stage-overrides", overrides, "--log-level", "info"],
                  {**base, "NO_COLOR": "1"}, OURS_READY)
    (private_dir / "rpc").mkdir(exist_ok=True)  # (vLLM's IPC sockets: backend_env)
    env = vllm_backend.backend_env(ctx, private_dir)
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CONFIGURE_LOGGING"):  # (its server's own defaults)
        env.pop(key, None)
    theirs = Server("vllm_serve", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *vllm_flags(ctx),
                                   "--served-model-name", SERVED_NAME, "--host", "127.0.0.1",
                                   "--port", str(free_port())],
                    {**base, **env}, VLLM_READY)
    return ours, theirs, stage


def url_of(server: Server) -> str:
    return f"http://127.0.0.1:{server.cmd[server.cmd.index('--port') + 1]}/v1"


# ---- load generation --------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    ttft: float
    e2e: float
    tokens: int
    gaps: list[float]


async def one(client: AsyncOpenAI, prompt: str, max_tokens: int) -> Sample:
    t0 = time.perf_counter()
    stream = await client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "min_tokens": max_tokens})
    times, tokens = [], 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    e2e = time.perf_counter() - t0
    if not times or tokens != max_tokens:
        raise RuntimeError(f"{client.base_url}: {len(times)} text chunks, {tokens} tokens, {max_tokens} asked")
    return Sample(times[0] - t0, e2e, tokens, list(np.diff(times)))


async def run_level(client: AsyncOpenAI, concurrency: int, n: int, max_tokens: int, start: int,
                    samples: list[Sample]) -> float:
    """`n` requests, `concurrency` in flight, prompts in turn from `start`; the wall time."""
    todo = iter(range(start, start + n))

    async def worker() -> None:
        for i in todo:
            samples.append(await one(client, PROMPTS[i % len(PROMPTS)], max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def summarize(samples: list[Sample], wall: float) -> dict[str, Any]:
    ttft = [s.ttft for s in samples]
    gaps = [g for s in samples for g in s.gaps]
    tpot = [(s.e2e - s.ttft) / (s.tokens - 1) for s in samples if s.tokens > 1]
    return {"n": len(samples), "ttft_p50_ms": ms(ttft, 50), "ttft_p99_ms": ms(ttft, 99), "itl_p50_ms": ms(gaps, 50),
            "tpot_p50_ms": ms(tpot, 50), "chunks_per_token": round(sum(len(s.gaps) + 1 for s in samples)
                                                                   / sum(s.tokens for s in samples), 3),
            "e2e_p50_ms": ms([s.e2e for s in samples], 50),
            "output_tok_s": round(sum(s.tokens for s in samples) / wall, 1), "rps": round(len(samples) / wall, 3)}


def ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out = {k: div(ours[k], theirs[k]) for k in ("output_tok_s", "rps")}
    out |= {k: div(theirs[k], ours[k]) for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "tpot_p50_ms")}
    return out


async def bench(args: argparse.Namespace, clients: dict[str, AsyncOpenAI], levels: list[int]) -> dict[str, Any]:
    for client in clients.values():  # warm-up: one full batch each
        await run_level(client, max(levels), max(levels), 8, 0, [])
    results: dict[str, Any] = {}
    for c in levels:
        per_round = args.per_round or max(2, c)
        samples: dict[str, list[Sample]] = {name: [] for name in clients}
        walls = dict.fromkeys(clients, 0.0)
        for r in range(args.rounds):
            order = list(clients) if r % 2 == 0 else list(clients)[::-1]
            for name in order:
                walls[name] += await run_level(clients[name], c, per_round, args.max_tokens, r * per_round,
                                               samples[name])
        level = {name: summarize(samples[name], walls[name]) for name in clients}
        level["ratio"] = ratio(level["ours"], level["vllm_serve"])
        results[str(c)] = level
    return results


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def engine_dirs() -> set[str]:
    """Our vLLM engine's private folders (vllm_ar.py: mkdtemp "omni-vllm-")."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("omni-vllm-*")}


async def main() -> None:
    args = parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"{args.model_dir}: no model folder; run `omni-run prepare assistant` (or pass --model-dir)")
    t0, shm_before, tmp_before = time.perf_counter(), shm_names(), engine_dirs()
    with tempfile.TemporaryDirectory(prefix="bench-completions-") as tmp:
        ours, theirs, stage = servers(args, Path(tmp))
        try:
            for failed in await asyncio.gather(ours.start(), theirs.start(), return_exceptions=True):
                if failed is not None:  # (both started tasks are done either way: stopped below)
                    raise failed
            clients = {s.name: AsyncOpenAI(base_url=url_of(s), api_key="unused", max_retries=0,
                                           timeout=REQUEST_TIMEOUT_S) for s in (ours, theirs)}
            try:
                results = await bench(args, clients, levels)
            finally:
                for client in clients.values():
                    await client.close()
        finally:
            await asyncio.gather(ours.stop(), theirs.stop())
        left_in_tmp = list((Path(tmp) / "rpc").iterdir())  # (vLLM's server leaves its IPC socket files)
    shm_new = sorted(shm_names() - shm_before)
    tmp_new = sorted(engine_dirs() - tmp_before)
    line = {
        "bench": "completions", "model": str(args.model_dir), "max_tokens": args.max_tokens, "rounds": args.rounds,
        "concurrency": levels, "engine": {**stage, "omp_threads": 1},
        "start_s": {"ours": ours.start_s, "vllm_serve": theirs.start_s, "note": "started together"},
        "results": results,
        "leaks": {"processes": ours.leftovers + theirs.leftovers, "shm_prefix_ours": ours.shm_prefix,
                  "shm_ours": [n for n in shm_new if ours.shm_prefix and n.startswith(ours.shm_prefix)],
                  "shm_new_any_process": shm_new,
                  "runtime_dir_ours": bool(ours.runtime_dir and Path(ours.runtime_dir).exists()),
                  "engine_tmp_dirs_any_process": tmp_new, "vllm_serve_ipc_files": len(left_in_tmp)},
        "load_avg": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    asyncio.run(main())
