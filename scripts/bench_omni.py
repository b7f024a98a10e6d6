"""Full omni pipeline on CPU: time to first audio, async chunk on vs off, start-up, memory.

The qwen2_5_omni pipeline (thinker -> talker -> code2wav, each a worker
process) on the tiny checkpoint (`make_tiny("qwen2_5_omni")`: hidden 64,
head_dim 32, 2 layers, Qwen's real 152,064-token vocabulary), driven through
Orchestrators in this process (no HTTP). Two orchestrators serve side by side,
one with async chunk on and one with it off; each is started alone (start-up:
`start()` until every worker is Ready) and the modes alternate round by round.

Every request: one chat message; the thinker decodes --text-tokens tokens and
the talker --codes codec codes (ignore_eos on both, so the random weights do
the same work every time; talker sampling is the model's default, seeded per
request), so code2wav makes codes x 20 ms of 24 kHz audio.

Per mode and concurrency (1: --requests-c1 requests one after another;
8: --rounds batches of 8 in flight at once):
    time to first audio (submit -> first non-empty audio chunk) p50 / max,
    audio chunks per request, end to end, requests/s.
Resident memory: this process (orchestrator + client) plus every worker, psutil
RSS summed, after the run.

Baseline, same run: the stages' own compute. A child process builds the three
stage engines from the contexts their workers get and drives them on the same
requests (same concurrency, seeds, hand-offs through the pipeline's own
processors), stepping one stage after another and timing only `step()`:
    compute first audio (async)  = step time of all three stages until the first
                                   audio delta, stepping each stage in turn
    compute first audio (whole)  = thinker to its end + talker to its end + code2wav
so `served - compute` is what the runtime adds (or saves, by running the
stages in parallel processes). A baseline round runs before each served round.

    .venv/bin/python scripts/bench_omni.py [--model DIR] [--text-tokens 32] [--codes 64]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMNI_LOG_LEVEL", "warning")

import numpy as np

from omni_actors.config.deploy import DeployConfig, build_deploy

PROMPT = "Hello! Please tell me a short story about a small boat at sea, in two sentences."
PIPELINE = "qwen2_5_omni"
TARGETS = {
    "ttfa_c1_s": 0.3, "ttfa_c8_p50_s": 1.0, "async_ttfa_gain": 5.0, "throughput_c8_over_c1": 4.0,
    "startup_s": 60.0, "rss_gb": 5.0, "audio_chunks_min": 2,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="qwen2_5_omni folder (default: a fresh tiny one)")
    ap.add_argument("--text-tokens", type=int, default=32)
    ap.add_argument(
        "--codes", type=int, default=64, help="talker codes per request (20 ms of audio each)"
    )
    ap.add_argument("--requests-c1", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--code2wav-replicas", type=int, default=1, help="served only")
    ap.add_argument(
        "--code2wav-extras", type=json.loads, default={},
        help='code2wav engine_extras (JSON), e.g. \'{"chunk_growth": 1}\' for fixed windows',
    )  # fmt: skip
    ap.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def deploy_for(
    model: Path,
    async_chunk: bool,
    max_num_seqs: int,
    code2wav_replicas: int = 1,
    code2wav_extras: dict[str, Any] | None = None,
) -> DeployConfig:
    stages = [{"stage_id": s, "max_num_seqs": max_num_seqs, "max_queue": 256} for s in (0, 1, 2)]
    stages[2]["num_replicas"] = code2wav_replicas
    if code2wav_extras:
        stages[2]["engine_extras"] = code2wav_extras
    raw = {"pipeline": PIPELINE, "model": str(model), "async_chunk": async_chunk, "stages": stages}
    return build_deploy(raw, source="bench_omni")


def request_params(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {
        "max_tokens": args.text_tokens, "ignore_eos": True, "temperature": 0.0, "seed": seed,
        "talker_max_tokens": args.codes, "talker_ignore_eos": True, "modalities": ["text", "audio"],
    }  # fmt: skip


def request_inputs() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}]}


def p50(values: list[float]) -> float | None:
    return round(float(statistics.median(values)), 4) if values else None


# -- baseline: the stage engines in one process, only step() timed -------------------------


class Baseline:
    def __init__(self, args: argparse.Namespace) -> None:
        from omni_actors.config.pipeline import get_pipeline, resolve
        from omni_actors.workers.main import build_context
        from omni_actors.workers.spec import WorkerSpec

        self.args = args
        deploy = deploy_for(
            args.model, True, args.max_num_seqs, code2wav_extras=args.code2wav_extras
        )
        self.pipe = get_pipeline(PIPELINE)
        self.engines = []
        for st in self.pipe.stages:
            spec = WorkerSpec(
                endpoint="",
                identity="bench",
                stage=st,
                deploy=deploy.stage(st.stage_id),
                replica=0,
                generation=0,
                model_path=deploy.model,
                shm_prefix="bench",
                platform="cpu",
                heartbeat_interval_s=1.0,
            )
            self.engines.append(resolve(st.engine)(build_context(spec)))
        self.full = [resolve(s.processor) if s.processor else None for s in self.pipe.stages]
        self.chunk = [
            resolve(s.chunk_processor) if s.chunk_processor else None for s in self.pipe.stages
        ]
        self.next_id = 0

    def _requests(self, n: int) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        out = {}
        for i in range(n):
            self.next_id += 1
            out[f"b{self.next_id}"] = (request_inputs(), request_params(self.args, 1000 + i))
        return out

    def _step(self, stage: int, spent: list[float]) -> list[Any]:
        t0 = time.perf_counter()
        outs = self.engines[stage].step()
        spent[stage] += time.perf_counter() - t0
        for out in outs:
            if out.error is not None:
                raise RuntimeError(f"stage {stage}: {out.error}")
        return outs

    def run_async(self, n: int) -> dict[str, Any]:
        """Every output handed downstream at once (the chunk processors), stages stepped in turn."""
        reqs = self._requests(n)
        spent = [0.0, 0.0, 0.0]
        states: list[dict[str, dict]] = [{rid: {} for rid in reqs} for _ in self.engines]
        first: dict[str, float] = {}
        chunks = dict.fromkeys(reqs, 0)
        for rid, (inputs, params) in reqs.items():
            for stage, eng in enumerate(self.engines):
                eng.add(rid, inputs, params, streaming=stage > 0)
        while any(e.has_work() for e in self.engines):
            for stage, eng in enumerate(self.engines):
                if not eng.has_work():
                    continue
                for out in self._step(stage, spent):
                    rid = out.request_id
                    if stage == 2 and len(out.payload.get("audio", ())):
                        first.setdefault(rid, sum(spent))
                        chunks[rid] += 1
                    if stage + 1 < len(self.engines):
                        nxt = self.chunk[stage + 1](
                            stage, out.payload, out.finished, reqs[rid][0], states[stage + 1][rid]
                        )
                        if nxt is not None or out.finished:
                            self.engines[stage + 1].feed(rid, nxt or {}, out.finished)
        return {"ttfa_s": p50(list(first.values())), "ttfa_max_s": round(max(first.values()), 4),
                "audio_chunks": p50(list(chunks.values())), "total_s": round(sum(spent), 4),
                "stage_s": [round(s, 4) for s in spent]}  # fmt: skip

    def run_whole(self, n: int) -> dict[str, Any]:
        """Each stage runs all requests to the end before the next starts (full payloads)."""
        reqs = self._requests(n)
        spent = [0.0, 0.0, 0.0]
        upstream: dict[str, list[dict[str, Any]]] = {}
        first: dict[str, float] = {}
        for stage, eng in enumerate(self.engines):
            for rid, (inputs, params) in reqs.items():
                data = (
                    inputs if stage == 0 else self.full[stage]({stage - 1: upstream[rid]}, inputs)
                )
                eng.add(rid, data, params)
            got: dict[str, list[dict[str, Any]]] = {rid: [] for rid in reqs}
            while eng.has_work():
                for out in self._step(stage, spent):
                    got[out.request_id].append(out.payload)
                    if stage == 2 and len(out.payload.get("audio", ())):
                        first.setdefault(out.request_id, sum(spent))
            upstream = got
        return {"ttfa_s": p50(list(first.values())), "ttfa_max_s": round(max(first.values()), 4),
                "total_s": round(sum(spent), 4), "stage_s": [round(s, 4) for s in spent]}  # fmt: skip

    def measure(self, n: int) -> dict[str, Any]:
        return {"async": self.run_async(n), "whole": self.run_whole(n)}


def baseline_child(args: argparse.Namespace) -> None:
    """Serve `measure n` lines on stdin with JSON lines on stdout."""
    from omni_actors import logs

    logs.configure("bench-baseline")  # logs to stderr: stdout carries the JSON lines
    base = Baseline(args)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        n = int(line)
        print(json.dumps(base.measure(n)), flush=True)


class BaselineProc:
    def __init__(self, args: argparse.Namespace) -> None:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        cmd = [sys.executable, __file__, "--baseline-child", "--model", str(args.model),
               "--text-tokens", str(args.text_tokens), "--codes", str(args.codes),
               "--max-num-seqs", str(args.max_num_seqs),
               "--code2wav-extras", json.dumps(args.code2wav_extras)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._read()
        self.samples: dict[int, list[dict[str, Any]]] = {}

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("baseline child exited")
        return json.loads(line)

    def measure(self, n: int, keep: bool = True) -> None:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        got = self._read()
        if keep:
            self.samples.setdefault(n, []).append(got)

    def summary(self, n: int) -> dict[str, Any]:
        got = self.samples[n]
        out: dict[str, Any] = {}
        for mode in ("async", "whole"):
            rows = [g[mode] for g in got]
            out[mode] = {k: p50([r[k] for r in rows]) for k in rows[0] if k != "stage_s"}
            out[mode]["stage_s"] = [p50([r["stage_s"][i] for r in rows]) for i in range(3)]
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


# -- served ------------------------------------------------------------------------------


async def one(orch: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from omni_actors.orchestrator.requests import RequestSpec

    spec = RequestSpec(
        request_inputs(),
        request_params(args, seed),
        stages=orch.pipeline.stages_for_outputs({"text", "audio"}),
        deadline_s=600.0,
    )
    t0 = time.perf_counter()
    ttft = ttfa = None
    chunks, samples, rate = 0, 0, 24000
    async for chunk in orch.submit(spec):
        now = time.perf_counter() - t0
        if "error" in chunk.data:
            raise RuntimeError(f"request failed: {chunk.data['error']}")
        if chunk.output_type == "text" and ttft is None and chunk.data.get("text"):
            ttft = now
        if chunk.output_type == "audio":
            size = int(np.size(chunk.data.get("audio", ())))
            rate = int(chunk.data.get("sample_rate", rate))
            if size:
                ttfa = now if ttfa is None else ttfa
                chunks += 1
                samples += size
    return {"ttft": ttft, "ttfa": ttfa, "chunks": chunks, "audio_s": samples / rate,
            "e2e": time.perf_counter() - t0}  # fmt: skip


def summarize(batches: list[tuple[float, list[dict[str, Any]]]]) -> dict[str, Any]:
    samples = [s for _, batch in batches for s in batch]
    wall = sum(w for w, _ in batches)

    def vals(key: str) -> list[float]:
        return [s[key] for s in samples if s[key] is not None]

    return {
        "requests": len(samples),
        "ttft_p50_s": p50(vals("ttft")),
        "ttfa_p50_s": p50(vals("ttfa")), "ttfa_max_s": round(max(vals("ttfa")), 4),
        "e2e_p50_s": p50(vals("e2e")),
        "audio_chunks_p50": p50(vals("chunks")), "audio_chunks_min": min(vals("chunks")),
        "audio_s_per_request": round(float(np.mean(vals("audio_s"))), 3),
        "requests_per_s": round(len(samples) / wall, 3),
        "audio_s_per_wall_s": round(sum(vals("audio_s")) / wall, 3),
    }  # fmt: skip


def rss_gb(orch: Any) -> dict[str, float]:
    """Memory of this process and of every worker of `orch` (and their children), GB.

    RSS counts shared pages (libraries, the bus's shared memory) once per process
    that touched them, so its sum over-counts; PSS splits them between the sharers
    (Linux), so its sum is what the processes hold together.
    """
    import psutil

    procs = [psutil.Process()]
    for st in orch.statistics().stages:
        for rep in st.replicas:
            if rep.pid:
                try:
                    p = psutil.Process(rep.pid)
                    procs += [p, *p.children(recursive=True)]
                except psutil.Error:
                    pass
    rss, pss = [], []
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss.append(info.rss)
        pss.append(getattr(info, "pss", info.rss))
    return {
        "orchestrator_gb": round(rss[0] / 1e9, 3),
        "workers_gb": round(sum(rss[1:]) / 1e9, 3),
        "total_gb": round(sum(rss) / 1e9, 3),
        "total_pss_gb": round(sum(pss) / 1e9, 3),
        "orchestrator_pss_gb": round(pss[0] / 1e9, 3),
        "torch_in_orchestrator": "torch" in sys.modules,
    }


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.orchestrator.core import Orchestrator

    load_before = load_avg()
    base = BaselineProc(args)  # loads its engines before any worker starts
    orchs: dict[str, Any] = {}
    startup: dict[str, float] = {}
    served: dict[tuple[str, int], list[tuple[float, list[dict[str, Any]]]]] = {}
    rss: dict[str, dict[str, float]] = {}
    seed = iter(range(10_000, 1_000_000))
    n = args.concurrency
    try:
        for mode in ("async", "whole"):  # one at a time: start-up alone on the cores
            deploy = deploy_for(
                args.model, mode == "async", args.max_num_seqs, args.code2wav_replicas,
                args.code2wav_extras,
            )  # fmt: skip
            orchs[mode] = Orchestrator(deploy)
            t0 = time.perf_counter()
            await orchs[mode].start()
            startup[mode] = round(time.perf_counter() - t0, 2)
        for o in orchs.values():  # warm-up: one alone, one batch
            await one(o, args, next(seed))
            await asyncio.gather(*(one(o, args, next(seed)) for _ in range(n)))
        for c in (1, n):
            await asyncio.to_thread(base.measure, c, False)  # warm-up
        for r in range(args.rounds):
            await asyncio.to_thread(base.measure, 1)
            await asyncio.to_thread(base.measure, n)
            for mode in ("async", "whole") if r % 2 == 0 else ("whole", "async"):
                o = orchs[mode]
                t0 = time.perf_counter()
                got = [await one(o, args, next(seed)) for _ in range(args.requests_c1)]
                served.setdefault((mode, 1), []).append((time.perf_counter() - t0, got))
                t0 = time.perf_counter()
                got = list(await asyncio.gather(*(one(o, args, next(seed)) for _ in range(n))))
                served.setdefault((mode, n), []).append((time.perf_counter() - t0, got))
        for mode, o in orchs.items():
            rss[mode] = rss_gb(o)
        load_after = load_avg()
    finally:
        for o in orchs.values():
            await o.stop()
        base.close()
    results = []
    for c in (1, n):
        comp = base.summary(c)
        row: dict[str, Any] = {"concurrency": c}
        for mode in ("async", "whole"):
            s = summarize(served[(mode, c)])
            s["compute_ttfa_s"] = comp[mode]["ttfa_s"]
            s["runtime_ttfa_s"] = round(s["ttfa_p50_s"] - comp[mode]["ttfa_s"], 4)
            row[mode] = s
        row["async_ttfa_gain"] = round(row["whole"]["ttfa_p50_s"] / row["async"]["ttfa_p50_s"], 2)
        row["compute"] = comp
        results.append(row)
    a1, an = results[0]["async"], results[1]["async"]
    measured = {
        "ttfa_c1_s": a1["ttfa_p50_s"], "ttfa_c8_p50_s": an["ttfa_p50_s"],
        "async_ttfa_gain": results[0]["async_ttfa_gain"],
        "throughput_c8_over_c1": round(an["requests_per_s"] / a1["requests_per_s"], 2),
        "startup_s": max(startup.values()), "rss_gb": rss["async"]["total_gb"],
        "audio_chunks_min": min(a1["audio_chunks_min"], an["audio_chunks_min"]),
    }  # fmt: skip
    lower_better = {"ttfa_c1_s", "ttfa_c8_p50_s", "startup_s", "rss_gb"}
    met = {
        k: (v <= TARGETS[k]) if k in lower_better else (v >= TARGETS[k])
        for k, v in measured.items()
    }
    return {
        "startup_s": startup,
        "rss": rss,
        "results": results,
        "measured": measured,
        "targets": TARGETS,
        "met": met,
        "load_before": load_before,
        "load_after": load_after,
    }


async def main() -> None:
    from omni_actors import logs

    logs.configure("bench")  # logs to stderr: stdout carries only the JSON line
    args = parse_args()
    t0 = time.perf_counter()
    tmp = None
    if args.model is None:
        # In a child process: torch and transformers stay out of this (orchestrator) process.
        tmp = tempfile.TemporaryDirectory(prefix="bench-omni-")
        args.model = Path(tmp.name) / "tiny"
        subprocess.run(
            [sys.executable, "-m", "omni_actors.cli", "make-tiny", PIPELINE, str(args.model)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    try:
        out = await run(args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    tiny = "tiny (hidden 64, head_dim 32, 2 layers, vocab 152064)"
    line = {
        "bench": "omni", "pipeline": PIPELINE, "model": tiny if tmp else str(args.model),
        "cpus": os.cpu_count(), "text_tokens": args.text_tokens, "codes": args.codes,
        "audio_s_per_request": round(args.codes * 0.02, 2), "requests_c1": args.requests_c1,
        "concurrency": args.concurrency, "rounds": args.rounds,
        "code2wav_replicas": args.code2wav_replicas, "code2wav_extras": args.code2wav_extras,
        **out, "wall_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    a = parse_args()
    if a.baseline_child:
        baseline_child(a)
    else:
        asyncio.run(main())
