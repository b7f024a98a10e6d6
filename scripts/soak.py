"""Soak: N minutes of mixed load against a server; per interval latency, memory, fds and shm segments.

Load, open loop at `--rate` requests/s (Poisson arrivals, mix by `--mix`):
    chat      streamed chat completion with text + audio (pcm16), read to [DONE]
    speech    /v1/audio/speech, streamed pcm, read to the end
    realtime  one WebSocket session for the whole run; a turn is an out-of-band
              response.create (text in, audio out), read to response.done (one at a time)

Every `--interval-s` it prints (stderr) p50/p99 per workload, errors, the RSS
and open fds of the server process and of each of its children (the workers),
and the server's shared-memory segments (/dev/shm/omni-<pid>-*). At the end it
fits slopes (per minute) and prints one JSON line (stdout). The baseline is
the same run's first interval: `p99_drift_pct` compares the last interval's p99
with it; `p99_thirds_drift_pct` compares the median per-interval p99 of the last
third of the run with that of the first third (one spiky minute moves it less),
and `p99_slope_ms_per_min` is the least-squares slope of the per-interval p99. Before the measured minutes the rate ramps up over `--warmup-s`
(first requests, lazy imports, a backlog of arrivals), which is not measured.

Where a drift comes from, in the same run: each interval also records the CPU
time the server's processes (main and workers) and this load generator spent
per finished request, and the share of the host's CPU time the hypervisor
took from this VM (`steal`, /proc/stat). `thirds` in the JSON line compares
the first and last thirds of the run on each: a server that got slower per
request shows in `server_cpu_ms_per_req` (and each process's own `cpu_ms_per_req`
under `procs`); a generator that did, in
`gen_cpu_ms_per_req`; a box that got slower with neither, in `steal_pct` or in
nothing the run can see.

    .venv/bin/python scripts/soak.py --minutes 5 --rate 20            # starts omni-run (synthetic)
    .venv/bin/python scripts/soak.py --url http://host:8000 --pid 1234 --minutes 30 --rate 400

Targets (issue 14, over 30 minutes at ~75% of what the box sustains): p99 drift < 10%,
RSS slope < 1 MB/min per process, fds and segments flat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import numpy as np
import psutil
import yaml
from bench_serve import ServerProcess, free_port

from omni_actors import logs

PROMPT = "the quick brown fox jumps over the lazy dog"
MAX_IN_FLIGHT = 512
"""Arrivals beyond this many unfinished requests are counted as `shed` instead of sent."""
REQUEST_TIMEOUT_S = 120.0
SHM = Path("/dev/shm")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second, all workloads")
    ap.add_argument("--mix", default="chat=0.6,speech=0.3,realtime=0.1")
    ap.add_argument("--interval-s", type=float, default=30.0)
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="the rate ramps up over this long first; it is not measured")
    ap.add_argument("--tokens", type=int, default=16, help="text chunks per request (0.1 s of audio each)")
    ap.add_argument("--step-ms", type=float, default=2.0, help="synthetic compute per engine step")
    ap.add_argument("--url", default=None, help="an already running server (else omni-run is started)")
    ap.add_argument("--pid", type=int, default=None, help="that server's main pid (for RSS, fds, shm)")
    ap.add_argument("--key", default=None, help="API key for --url")
    ap.add_argument("--connections", type=int, default=MAX_IN_FLIGHT,
                    help="most open HTTP connections of the load generator (its keep-alive pool)")
    return ap.parse_args()


def deploy_raw(args: argparse.Namespace, port: int) -> dict[str, Any]:
    stages = [{"stage_id": s, "max_num_seqs": 64, "max_queue": 1024,
               "engine_extras": {"step_delay_ms": args.step_ms, "chunks": args.tokens} if s == 0 else {}}
              for s in (0, 1, 2)]
    return {"pipeline": "synthetic", "async_chunk": True, "stages": stages,
            "server": {"host": "127.0.0.1", "port": port}}


# ---- the three workloads ------------------------------------------------------------


async def chat(session: aiohttp.ClientSession, url: str, args: argparse.Namespace) -> None:
    body = {"model": "synthetic", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.tokens,
            "stream": True, "modalities": ["text", "audio"], "audio": {"voice": "a", "format": "pcm16"}}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"chat HTTP {resp.status}")
        done = False
        async for line in resp.content:
            if line.startswith(b"data: {\"error\""):
                raise RuntimeError("chat in-band error")
            done = done or line.startswith(b"data: [DONE]")
        if not done:
            raise RuntimeError("chat stream ended without [DONE]")


async def speech(session: aiohttp.ClientSession, url: str, args: argparse.Namespace) -> None:
    body = {"model": "synthetic", "input": PROMPT, "voice": "alloy", "response_format": "pcm", "stream": True}
    async with session.post(url + "/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"speech HTTP {resp.status}")
        n = 0
        async for part in resp.content.iter_any():
            n += len(part)
        if not n:
            raise RuntimeError("speech: no audio")


class Busy(Exception):
    """The realtime session is still answering the previous turn: this arrival is skipped."""


class Realtime:
    """One session for the whole run; `turn()` is one text turn answered with audio."""

    def __init__(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
        self.session, self.url, self.headers = session, url, headers
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        ws_url = self.url.replace("http://", "ws://") + "/v1/realtime?model=synthetic"
        self.ws = await self.session.ws_connect(ws_url, headers=self.headers, max_msg_size=0)
        await self.ws.send_json({"type": "session.update", "session": {"turn_detection": None}})
        await self._until("session.updated")

    async def _until(self, kind: str) -> dict[str, Any]:
        assert self.ws is not None
        while True:
            event = await self.ws.receive_json(timeout=REQUEST_TIMEOUT_S)
            if event["type"] == "error":
                raise RuntimeError(f"realtime error {event['error'].get('code')}")
            if event["type"] == kind:
                return event

    async def turn(self) -> None:
        """An out-of-band response (`conversation: none`): the session's context does not grow.
        Raises Busy while the previous turn runs (this client keeps one turn at a time; the server runs up to 4)."""
        if self.lock.locked():
            raise Busy
        async with self.lock:
            assert self.ws is not None
            await self.ws.send_json({"type": "response.create", "response": {"conversation": "none", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]}})
            done = await self._until("response.done")
            if done["response"]["status"] != "completed":
                raise RuntimeError(f"realtime response {done['response']['status']}")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


# ---- process probes -------------------------------------------------------------------


def probe(pid: int | None) -> dict[str, Any]:
    """RSS (MB), open fds and CPU seconds so far of the server and each child, and its shm segments."""
    if pid is None:
        return {}
    out: dict[str, Any] = {"procs": {}}
    try:
        main = psutil.Process(pid)
        procs = [main, *main.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for i, p in enumerate(procs):
        try:
            name = "main" if i == 0 else f"child-{p.pid}"
            cpu = p.cpu_times()
            out["procs"][name] = {"rss_mb": round(p.memory_info().rss / 2**20, 1), "fds": p.num_fds(),
                                  "cpu_s": cpu.user + cpu.system}
        except psutil.NoSuchProcess:
            continue
    out["shm_segments"] = sum(1 for _ in SHM.glob(f"omni-{pid}-*"))
    return out


class CpuMeter:
    """Per interval: the server's and this generator's CPU time a finished request, and the steal share."""

    def __init__(self) -> None:
        self.server_s: dict[str, float] = {}
        self.gen_s = self._gen()
        self.stat = self._stat()

    @staticmethod
    def _gen() -> float:
        t = psutil.Process().cpu_times()
        return t.user + t.system

    @staticmethod
    def _stat() -> tuple[int, int]:
        """(steal, total) jiffies over all CPUs since boot; (0, 0) where /proc/stat is not there."""
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return 0, 0
        return fields[7], sum(fields)

    def interval(self, procs: dict[str, dict[str, Any]], finished: int) -> dict[str, Any]:
        server = {name: p.pop("cpu_s") for name, p in procs.items() if "cpu_s" in p}
        each = {name: v - self.server_s.get(name, v) for name, v in server.items()}  # a new process counts from now
        used = sum(each.values())
        for name, p in procs.items():
            if finished and self.server_s and name in each:
                p["cpu_ms_per_req"] = round(each[name] / finished * 1000, 3)
        gen, stat = self._gen(), self._stat()
        steal, total = stat[0] - self.stat[0], stat[1] - self.stat[1]
        row = {"server_cpu_ms_per_req": round(used / finished * 1000, 3) if finished and self.server_s else None,
               "gen_cpu_ms_per_req": round((gen - self.gen_s) / finished * 1000, 3) if finished else None,
               "steal_pct": round(steal / total * 100, 2) if total else None}
        self.server_s, self.gen_s, self.stat = server, gen, stat
        return row


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def slope_per_min(t_min: list[float], values: list[float]) -> float | None:
    if len(values) < 3:
        return None
    return round(float(np.polyfit(t_min, values, 1)[0]), 3)


# ---- the run ---------------------------------------------------------------------------


async def soak(url: str, pid: int | None, args: argparse.Namespace, headers: dict[str, str]) -> dict[str, Any]:
    mix = {k: float(v) for k, v in (p.split("=") for p in args.mix.split(","))}
    names, weights = list(mix), list(mix.values())
    lat: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    counts = {"sent": 0, "shed": 0, "realtime_busy": 0, "warmup_errors": 0}
    in_flight: set[asyncio.Task] = set()
    conn = aiohttp.TCPConnector(limit=args.connections)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    intervals: list[dict[str, Any]] = []
    meter = CpuMeter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, headers=headers) as session:
        rt = Realtime(session, url, headers)
        await rt.open()
        work = {"chat": lambda: chat(session, url, args), "speech": lambda: speech(session, url, args),
                "realtime": rt.turn}

        async def one(kind: str) -> None:
            t0 = time.perf_counter()
            try:
                await work[kind]()
                lat[kind].append(time.perf_counter() - t0)
            except Busy:
                counts["realtime_busy"] += 1
            except Exception as err:  # counted, and the soak goes on
                errors[f"{kind}: {type(err).__name__}: {err}"[:120]] += 1

        warm_start = time.perf_counter()
        start = warm_start + args.warmup_s
        end = start + args.minutes * 60
        next_report = start + args.interval_s
        rng = random.Random(0)
        measuring = False
        while (now := time.perf_counter()) < end:
            if not measuring and now >= start:  # warm-up over: measure from here
                counts["warmup_errors"] = sum(errors.values())
                lat, errors = defaultdict(list), defaultdict(int)
                meter.interval(probe(pid).get("procs", {}), 0)  # CPU counted from here
                measuring = True
            if now >= next_report:
                intervals.append(report(len(intervals), (now - start) / 60, lat, errors, counts, pid, meter))
                lat, errors = defaultdict(list), defaultdict(int)
                next_report += args.interval_s
            rate = args.rate * min(1.0, max(0.05, (now - warm_start) / args.warmup_s if args.warmup_s else 1.0))
            await asyncio.sleep(min(rng.expovariate(rate), max(0.0, next_report - now)))
            if len(in_flight) >= MAX_IN_FLIGHT:
                counts["shed"] += 1
                continue
            kind = rng.choices(names, weights)[0]
            task = asyncio.ensure_future(one(kind))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            counts["sent"] += 1
        await asyncio.gather(*in_flight)
        intervals.append(report(len(intervals), (time.perf_counter() - start) / 60, lat, errors, counts, pid,
                                meter))
        await rt.close()
    return summarize(intervals, counts, args)


def report(i: int, t_min: float, lat: dict[str, list[float]], errors: dict[str, int], counts: dict[str, int],
           pid: int | None, meter: CpuMeter) -> dict[str, Any]:
    found = probe(pid)
    finished = sum(len(v) for v in lat.values()) + sum(errors.values())
    row = {"interval": i, "t_min": round(t_min, 2),
           "latency_ms": {k: {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99)} for k, v in sorted(lat.items())},
           "all_p99_ms": pct([x for v in lat.values() for x in v], 99), "finished": finished,
           **meter.interval(found.get("procs", {}), finished),
           "errors": dict(errors), "sent": counts["sent"], **found}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def summarize(intervals: list[dict[str, Any]], counts: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    t = [r["t_min"] for r in intervals]
    slopes: dict[str, Any] = {}
    names = {n for r in intervals for n in r.get("procs", {})}
    for name in sorted(names):
        rows = [(r["t_min"], r["procs"][name]) for r in intervals if name in r.get("procs", {})]
        slopes[name] = {"rss_mb_per_min": slope_per_min([x for x, _ in rows], [p["rss_mb"] for _, p in rows]),
                        "fds_per_min": slope_per_min([x for x, _ in rows], [p["fds"] for _, p in rows]),
                        "cpu_ms_per_req": thirds([p["cpu_ms_per_req"] for _, p in rows if "cpu_ms_per_req" in p]),
                        "rss_mb_first": rows[0][1]["rss_mb"], "rss_mb_last": rows[-1][1]["rss_mb"]}
    shm = [r.get("shm_segments", 0) for r in intervals]
    p99 = [r["all_p99_ms"] for r in intervals if r["all_p99_ms"] is not None]
    base = p99[0] if p99 else None
    third = len(p99) // 3
    early, late = (float(np.median(p99[:third])), float(np.median(p99[-third:]))) if third else (None, None)
    return {
        "bench": "soak", "minutes": args.minutes, "rate": args.rate, "mix": args.mix, "tokens": args.tokens,
        "step_ms": args.step_ms, "warmup_s": args.warmup_s, "sent": counts["sent"], "shed": counts["shed"],
        "realtime_busy": counts["realtime_busy"], "warmup_errors": counts["warmup_errors"],
        "errors": sum(sum(r["errors"].values()) for r in intervals), "intervals": len(intervals),
        "p99_ms_baseline": base, "p99_ms_last": p99[-1] if p99 else None,
        "p99_drift_pct": round((p99[-1] - base) / base * 100, 1) if base else None,
        "p99_median_first_third_ms": early, "p99_median_last_third_ms": late,
        "p99_thirds_drift_pct": round((late - early) / early * 100, 1) if early else None,
        "p99_slope_ms_per_min": slope_per_min([r["t_min"] for r in intervals if r["all_p99_ms"] is not None], p99),
        "connections": args.connections,
        "shm_segments_first": shm[0] if shm else None, "shm_segments_last": shm[-1] if shm else None,
        "shm_slope_per_min": slope_per_min(t, shm), "procs": slopes,
        "thirds": {key: thirds([r[key] for r in intervals if r.get(key) is not None])
                   for key in ("finished", "server_cpu_ms_per_req", "gen_cpu_ms_per_req", "steal_pct")},
    }


def thirds(values: list[float]) -> dict[str, float] | None:
    """Median of the first and of the last third of `values`, and the change between them (%)."""
    k = len(values) // 3
    if not k:
        return None
    early, late = float(np.median(values[:k])), float(np.median(values[-k:]))
    return {"first": round(early, 3), "last": round(late, 3),
            "change_pct": round((late - early) / early * 100, 1) if early else None}


async def main() -> None:
    args = parse_args()
    logs.configure("bench")  # logs to stderr; stdout carries only the JSON line
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    if args.url:
        result = await soak(args.url.rstrip("/"), args.pid, args, headers)
    else:
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "soak.yaml"
            path.write_text(yaml.safe_dump(deploy_raw(args, port)))
            async with ServerProcess(path, port) as server:
                assert server.proc is not None
                result = await soak(f"http://127.0.0.1:{port}", server.proc.pid, args, headers)
    print(json.dumps(result))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
