"""Assistant benchmark: time to first audio and real-time factor, async chunk on versus off.

Two orchestrators serve the bundled assistant deploy side by side, one with
`async_chunk: true` (llm text streams to tts sentence by sentence, tts latents
to the vocoder chunk by chunk) and one with it off (each stage waits for its
upstream's whole output, as `omni-run --no-async-chunk`). Requests go straight
to each orchestrator (no HTTP: bench_serve.py measures that layer), with the
modes alternated every round so drifting background load lands on both.

Workloads, each at concurrency 1 and 4:
    speech  a fixed 3-sentence text -> tts -> vocoder
    chat    a prompt whose greedy answer is 3+ sentences (fixed max_tokens)
            -> llm -> tts -> vocoder (text and audio out)

Per request: time to first audio (TTFA, submit -> first non-empty audio chunk),
end to end, and real-time factor (end to end / seconds of audio).

Baseline, same run: the stages' own compute. Each stage engine is built in
this process with the context its worker gets and run on the same inputs
(same concurrency, batched as the worker would), timing only `step()`, one
round before each served round so both see the same background load:
    compute TTFA (async)  = llm until its first sentence + tts of that sentence
                            + the vocoder's first chunk
    compute TTFA (whole)  = llm until its end + tts of all + the vocoder's first chunk
    compute total         = every step of every stage
so `served - compute` is what the runtime (processes, bus, scheduling on a
shared CPU) adds. Target: TTFA with async chunk >= 3x earlier than without.

    .venv/bin/python scripts/bench_assistant.py [--rounds 3] [--concurrency 1 4] [--max-tokens 64]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNI_LOG_LEVEL", "warning")

import numpy as np

from omni_actors.cli import bundled_deploy
from omni_actors.config.deploy import DeployConfig, load_deploy
from omni_actors.config.pipeline import PipelineConfig, get_pipeline, resolve
from omni_actors.models.assistant import LLM, TTS, VOCODER
from omni_actors.models.assistant.processors import (
    llm_to_tts_chunk,
    split_sentences,
    tts_to_vocoder_chunk,
)
from omni_actors.models.prepare import prepare
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec
from omni_actors.workers.engine import StageEngine
from omni_actors.workers.main import build_context
from omni_actors.workers.spec import WorkerSpec

PROMPT = "Tell me a short story about a cat."
"""SmolLM2-135M's greedy answer: a short story, 3 sentences within 64 tokens."""
SPEECH_TEXT = (
    "The weather is lovely today. We should walk to the park after lunch. Bring a hat and some water."
)
TARGET_RATIO = 3.0
REQUEST_TIMEOUT_S = 300.0
_IDS = itertools.count()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per (workload, concurrency, mode)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", help="prepared assistant folder (default: prepare on first use)")
    ap.add_argument("--samples", action="store_true", help="also print every request's figures to stderr")
    return ap.parse_args()


def p50(values: list[float]) -> float | None:
    return round(float(statistics.median(values)), 4) if values else None


def deploys(model: str) -> dict[str, DeployConfig]:
    return {mode: load_deploy(bundled_deploy(), {"model": model, "async_chunk": mode == "async"})
            for mode in ("async", "whole")}


def specs(workload: str, n: int, max_tokens: int) -> list[RequestSpec]:
    if workload == "speech":
        return [RequestSpec(inputs={"text": SPEECH_TEXT}, deadline_s=REQUEST_TIMEOUT_S) for _ in range(n)]
    params = {"modalities": ["text", "audio"], "max_tokens": max_tokens, "temperature": 0.0}
    return [RequestSpec(inputs={"messages": [{"role": "user", "content": PROMPT}]}, params=params,
                        deadline_s=REQUEST_TIMEOUT_S) for _ in range(n)]


# -- the stages' own compute, in this process ----------------------------------------


def engine(pipe: PipelineConfig, deploy: DeployConfig, stage_id: int) -> StageEngine:
    """The stage engine built from exactly the context its worker would get."""
    spec = WorkerSpec(endpoint="", identity="bench", stage=pipe.stage(stage_id), deploy=deploy.stage(stage_id),
                      replica=0, generation=0, model_path=deploy.model, shm_prefix="bench", platform="cpu",
                      heartbeat_interval_s=1.0)
    return resolve(pipe.stage(stage_id).engine)(build_context(spec))


class Clock:
    """Cumulative compute time: only `step()` calls count."""

    def __init__(self) -> None:
        self.t = 0.0

    def step(self, eng: StageEngine) -> list:
        t0 = time.perf_counter()
        outs = eng.step()
        self.t += time.perf_counter() - t0
        for out in outs:
            if out.error is not None:
                raise RuntimeError(out.error)
        return outs


def llm_compute(llm: StageEngine, n: int, max_tokens: int) -> tuple[dict[str, Any], list[list[str]]]:
    """The llm on n copies of the chat request: time to each answer's first sentence and end."""
    clock, first, end = Clock(), {}, {}
    pieces: dict[str, list[str]] = {f"c{next(_IDS)}": [] for _ in range(n)}
    states: dict[str, dict] = {rid: {} for rid in pieces}
    for spec, rid in zip(specs("chat", n, max_tokens), pieces, strict=True):
        llm.add(rid, spec.inputs, spec.params)
    while llm.has_work():
        for out in clock.step(llm):
            inputs = llm_to_tts_chunk(LLM, out.payload, out.finished, {}, states[out.request_id])
            if inputs is not None and inputs["text"]:
                first.setdefault(out.request_id, clock.t)
                pieces[out.request_id].append(inputs["text"])
            if out.finished:
                end[out.request_id] = clock.t
    return {"first_sentence_s": p50(list(first.values())), "end_s": p50(list(end.values())),
            "total_s": round(clock.t, 4)}, list(pieces.values())


def speech_compute(tts: StageEngine, vocoder: StageEngine, texts: list[list[str]]) -> dict[str, Any]:
    """tts then vocoder on each request's text pieces (as the llm hands them on):
    time to the first piece's latent, to all latents, to the first audio chunk, to all audio."""
    rids = [f"s{next(_IDS)}" for _ in texts]
    tts_clock, tts_first, latents = Clock(), {}, {rid: [] for rid in rids}
    for rid, parts in zip(rids, texts, strict=True):
        tts.add(rid, {}, {}, streaming=True)
        tts.feed(rid, {"text": parts[0]}, last=len(parts) == 1)
    while tts.has_work():  # the first pieces, then the rest once they are out
        for out in tts_clock.step(tts):
            tts_first.setdefault(out.request_id, tts_clock.t)
            latents[out.request_id].append(out.payload)
        if len(tts_first) == len(rids) and any(len(p) > 1 for p in texts):
            for rid, parts in zip(rids, texts, strict=True):
                if len(parts) > 1:
                    tts.feed(rid, {"text": " ".join(parts[1:])}, last=True)
            texts = [[p[0]] for p in texts]
    voc_clock, voc_first, samples = Clock(), {}, dict.fromkeys(rids, 0)
    for rid in rids:
        vocoder.add(rid, {}, {}, streaming=True)
        vocoder.feed(rid, tts_to_vocoder_chunk(TTS, latents[rid][0], len(latents[rid]) == 1, {}, {}),
                     last=len(latents[rid]) == 1)
    fed_rest = False
    while vocoder.has_work():
        for out in voc_clock.step(vocoder):
            if out.payload["audio"].size:
                voc_first.setdefault(out.request_id, voc_clock.t)
            samples[out.request_id] += out.payload["audio"].size
        if len(voc_first) == len(rids) and not fed_rest:
            fed_rest = True
            for rid in rids:
                for k, payload in enumerate(latents[rid][1:], 2):
                    last = k == len(latents[rid])
                    inputs = tts_to_vocoder_chunk(TTS, payload, last, {}, {})
                    if inputs is not None:
                        vocoder.feed(rid, inputs, last)
    return {
        "tts_first_s": p50(list(tts_first.values())), "tts_total_s": round(tts_clock.t, 4),
        "vocoder_first_s": p50(list(voc_first.values())), "vocoder_total_s": round(voc_clock.t, 4),
        "audio_s": round(statistics.median(samples.values()) / 22050, 3),
    }


class ComputeBaseline:
    """The llm, tts and vocoder engines in this process, measured between served rounds
    (so both see the same background load)."""

    def __init__(self, model: str, max_tokens: int) -> None:
        deploy = deploys(model)["async"]
        pipe = get_pipeline("assistant")
        self.max_tokens = max_tokens
        self.tts, self.vocoder = engine(pipe, deploy, TTS), engine(pipe, deploy, VOCODER)
        self.llm = engine(pipe, deploy, LLM)
        self.samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.answer: list[str] = []

    def measure(self, n: int) -> None:
        llm_t, pieces = llm_compute(self.llm, n, self.max_tokens)
        chat = speech_compute(self.tts, self.vocoder, pieces)
        speech = speech_compute(self.tts, self.vocoder, [split_sentences(SPEECH_TEXT, final=True)[0]] * n)
        self.answer = split_sentences(" ".join(pieces[0]), final=True)[0]
        self.samples.setdefault(("chat", n), []).append({"llm": llm_t, **chat, **_compute_ttfa(llm_t, chat)})
        self.samples.setdefault(("speech", n), []).append({**speech, **_compute_ttfa(None, speech)})

    def p50s(self) -> dict[str, dict[str, Any]]:
        """Per concurrency and workload, the median of each figure over the rounds."""
        out: dict[str, dict[str, Any]] = {}
        for (workload, n), got in self.samples.items():
            med = {k: p50([g[k] for g in got]) for k in got[0] if k != "llm"}
            if workload == "chat":
                med["llm"] = {k: p50([g["llm"][k] for g in got]) for k in got[0]["llm"]}
            out.setdefault(str(n), {})[workload] = med
        return out

    def close(self) -> None:
        for eng in (self.llm, self.tts, self.vocoder):
            eng.close()


def _compute_ttfa(llm_t: dict[str, Any] | None, sp: dict[str, Any]) -> dict[str, float]:
    first, end = (llm_t["first_sentence_s"], llm_t["end_s"]) if llm_t else (0.0, 0.0)
    total = (llm_t["total_s"] if llm_t else 0.0) + sp["tts_total_s"] + sp["vocoder_total_s"]
    return {
        "ttfa_async_s": round(first + sp["tts_first_s"] + sp["vocoder_first_s"], 4),
        "ttfa_whole_s": round(end + sp["tts_total_s"] + sp["vocoder_first_s"], 4),
        "total_s": round(total, 4),
    }


# -- served -------------------------------------------------------------------------------


async def one(orch: Orchestrator, spec: RequestSpec) -> dict[str, Any]:
    """One request: time to first audio, end to end, seconds of audio; for chat also when the
    client saw the answer's first whole sentence and its last text (the llm's pace as served)."""
    t0 = time.perf_counter()
    got: dict[str, Any] = {"ttfa_s": None, "first_sentence_s": None, "text_end_s": None}
    samples, rate, text = 0, 22050, ""
    async for chunk in orch.submit(spec):
        now = time.perf_counter() - t0
        if chunk.output_type == "audio":
            size = int(np.size(chunk.data.get("audio", ())))
            rate = int(chunk.data.get("sample_rate", rate))
            if size and got["ttfa_s"] is None:
                got["ttfa_s"] = now
            samples += size
        elif chunk.output_type == "text":
            text += chunk.data.get("text", "")
            if got["first_sentence_s"] is None and (split_sentences(text)[0] or chunk.finished):
                got["first_sentence_s"] = now
            if chunk.finished:
                got["text_end_s"] = now
    e2e = time.perf_counter() - t0
    return {**got, "e2e_s": e2e, "audio_s": samples / rate, "sentences": split_sentences(text, final=True)[0]}


def aggregate(got: list[dict[str, Any]]) -> dict[str, Any]:
    out = {f"{k[:-2]}_p50_s": p50([g[k] for g in got if g[k] is not None])
           for k in ("ttfa_s", "first_sentence_s", "text_end_s", "e2e_s", "audio_s")}
    out["rtf_p50"] = p50([g["e2e_s"] / g["audio_s"] for g in got if g["audio_s"]])
    out["requests"] = len(got)
    return {k: v for k, v in out.items() if v is not None}


async def run(model: str, concurrency: list[int], rounds: int, max_tokens: int,
              verbose: bool = False) -> dict[str, Any]:
    """Served rounds (modes alternating) with a compute-baseline round before each."""
    baseline = ComputeBaseline(model, max_tokens)  # before any worker starts: nothing to keep waiting
    orchs = {mode: Orchestrator(d) for mode, d in deploys(model).items()}
    samples: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    answers: dict[str, list[str]] = {}
    try:
        for o in orchs.values():
            await o.start()
        for mode, o in orchs.items():  # warm-up: one of each, not counted
            for workload in ("speech", "chat"):
                got = await one(o, specs(workload, 1, max_tokens)[0])
                if workload == "chat":
                    answers[mode] = got["sentences"]
        for n in concurrency:
            await asyncio.to_thread(baseline.measure, n)  # warm-up
        for r in range(rounds):
            for n in concurrency:
                await asyncio.to_thread(baseline.measure, n)
                for workload in ("speech", "chat"):
                    for mode in list(orchs) if r % 2 == 0 else list(orchs)[::-1]:
                        got = await asyncio.gather(*(one(orchs[mode], s) for s in specs(workload, n, max_tokens)))
                        samples.setdefault((workload, n, mode), []).extend(got)
                        if verbose:
                            figures = [{k: round(v, 3) for k, v in g.items() if isinstance(v, float)} for g in got]
                            print(json.dumps({"round": r, "workload": workload, "n": n, "mode": mode,
                                              "requests": figures}), file=sys.stderr)
    finally:
        for o in orchs.values():
            await o.stop()
        baseline.close()
    compute = baseline.p50s()
    answers["compute"] = baseline.answer
    results = []
    for n in concurrency:
        for workload in ("speech", "chat"):
            c = compute[str(n)][workload]
            row: dict[str, Any] = {"workload": workload, "concurrency": n}
            for mode in orchs:
                served = aggregate(samples[(workload, n, mode)])
                ttfa_c = c[f"ttfa_{mode}_s"]
                row[mode] = {**served, "compute_ttfa_s": ttfa_c,
                             "runtime_ttfa_s": round(served["ttfa_p50_s"] - ttfa_c, 4)}
            row["ttfa_ratio"] = round(row["whole"]["ttfa_p50_s"] / row["async"]["ttfa_p50_s"], 2)
            row["compute_ttfa_ratio"] = round(c["ttfa_whole_s"] / c["ttfa_async_s"], 2)
            row["compute"] = c
            results.append(row)
    return {"results": results, "answers": answers}


async def main() -> None:
    args = parse_args()
    model = args.model or str(prepare("assistant"))
    t0 = time.perf_counter()
    out = await run(model, args.concurrency, args.rounds, args.max_tokens, args.samples)
    answers = out.pop("answers")
    chat_ratios = [r["ttfa_ratio"] for r in out["results"] if r["workload"] == "chat"]
    line = {
        "bench": "assistant", "cpus": os.cpu_count(), "rounds": args.rounds, "max_tokens": args.max_tokens,
        "prompt": PROMPT, "answer_sentences": len(answers["compute"]),
        "answers_match": all(a == answers["compute"] for a in answers.values()),
        "speech_sentences": len(split_sentences(SPEECH_TEXT, final=True)[0]),
        **out,
        "target": {"chat_ttfa_ratio": TARGET_RATIO},
        "met": all(r >= TARGET_RATIO for r in chat_ratios),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    asyncio.run(main())
