"""Log-probabilities benchmark: streamed /v1/completions with `logprobs` on omni-run vs `vllm serve`.

The same two servers as scripts/bench_completions.py (SmolLM2-135M, the assistant deploy's llm stage
settings on both, one OpenMP thread each, started side by side). At each concurrency level every
server runs two variants in alternation, ROUNDS times with the order swapped each round: `plain`
(no logprobs) and `logprobs` (`logprobs: 5`, the five likeliest alternatives per token). Baselines
in the same run: each server's own plain variant (what asking for logprobs costs it) and vLLM's
server with logprobs (what ours costs against it).

    .venv/bin/python scripts/bench_logprobs.py                  # c1 and c8, 64 tokens, 2 rounds

(Written 2026-12-05 with the logprobs routes; not yet run: that session ended first.)

Prints one JSON line: per level, server and variant, output tokens/s and TTFT / TPOT p50 (as
bench_completions), `logprob_entries_per_token` (1.0: every token came with its entry), and ratios:
`logprobs_over_plain` per server (tokens/s) and `ours_over_vllm` with logprobs (tokens/s; for TPOT,
vLLM's over ours: above 1 is ours better).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_completions import (
    PROMPTS,
    REQUEST_TIMEOUT_S,
    SERVED_NAME,
    Sample,
    servers,
    summarize,
    url_of,
)
from openai import AsyncOpenAI

from omni_actors.settings import settings

ROUNDS = 2
TOP = 5
"""Alternatives asked per token (the legacy route's most)."""


async def one(client: AsyncOpenAI, prompt: str, max_tokens: int, logprobs: bool, seen: list[int]) -> Sample:
    t0 = time.perf_counter()
    stream = await client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
        logprobs=TOP if logprobs else None, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "min_tokens": max_tokens})
    times, tokens, entries = [], 0, 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.choices and chunk.choices[0].logprobs is not None:
            entries += len(chunk.choices[0].logprobs.tokens or [])
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if not times or tokens != max_tokens:
        raise RuntimeError(f"{client.base_url}: {len(times)} text chunks, {tokens} tokens, {max_tokens} asked")
    seen.append(entries)
    return Sample(times[0] - t0, time.perf_counter() - t0, tokens, list(np.diff(times)))


async def level(client: AsyncOpenAI, c: int, n: int, max_tokens: int, logprobs: bool,
                samples: list[Sample], seen: list[int]) -> float:
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            samples.append(await one(client, PROMPTS[i % len(PROMPTS)], max_tokens, logprobs, seen))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    return time.perf_counter() - t0


async def bench(args: argparse.Namespace, clients: dict[str, AsyncOpenAI]) -> dict[str, Any]:
    for client in clients.values():  # warm-up
        await level(client, 2, 2, 8, True, [], [])
    out: dict[str, Any] = {}
    for c in args.levels:
        n = max(2, c)
        runs = [(name, v) for name in clients for v in ("plain", "logprobs")]
        samples: dict[tuple[str, str], list[Sample]] = {r: [] for r in runs}
        seen: dict[tuple[str, str], list[int]] = {r: [] for r in runs}
        walls = dict.fromkeys(runs, 0.0)
        for r in range(args.rounds):
            for run in runs if r % 2 == 0 else runs[::-1]:
                walls[run] += await level(clients[run[0]], c, n, args.max_tokens, run[1] == "logprobs",
                                          samples[run], seen[run])
        got: dict[str, Any] = {name: {} for name in clients}
        for run in runs:
            got[run[0]][run[1]] = {**summarize(samples[run], walls[run]), "logprob_entries_per_token": round(
                sum(seen[run]) / sum(s.tokens for s in samples[run]), 3)}
        tok = {run: got[run[0]][run[1]]["output_tok_s"] for run in runs}
        tpot = {run: got[run[0]][run[1]]["tpot_p50_ms"] for run in runs}
        got["logprobs_over_plain"] = {name: round(tok[(name, "logprobs")] / tok[(name, "plain")], 3)
                                      for name in clients}
        got["ours_over_vllm"] = {
            "output_tok_s": round(tok[("ours", "logprobs")] / tok[("vllm_serve", "logprobs")], 3),
            "tpot_p50": round(tpot[("vllm_serve", "logprobs")] / tpot[("ours", "logprobs")], 3)}
        out[str(c)] = got
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--model-dir", type=Path, default=settings().data_dir / "assistant" / "llm")
    args = ap.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"{args.model_dir}: no model folder; run `omni-run prepare assistant` (or pass --model-dir)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-logprobs-") as tmp:
        ours, theirs, stage = servers(args, Path(tmp))
        try:
            for failed in await asyncio.gather(ours.start(), theirs.start(), return_exceptions=True):
                if failed is not None:
                    raise failed
            clients = {s.name: AsyncOpenAI(base_url=url_of(s), api_key="unused", max_retries=0,
                                           timeout=REQUEST_TIMEOUT_S) for s in (ours, theirs)}
            try:
                results = await bench(args, clients)
            finally:
                for client in clients.values():
                    await client.close()
        finally:
            await asyncio.gather(ours.stop(), theirs.stop())
    print(json.dumps({"bench": "logprobs", "model": str(args.model_dir), "max_tokens": args.max_tokens,
                      "top_logprobs": TOP, "rounds": args.rounds, "engine": {**stage, "omp_threads": 1},
                      "results": results, "leftover_processes": ours.leftovers + theirs.leftovers,
                      "load_avg": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
