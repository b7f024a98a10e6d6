"""Guided decoding and the Responses API over HTTP: what each costs against a plain chat completion.

One `omni-run --model <tiny llama>` (the `llm` pipeline on vLLM) serves every workload; the
baseline is in the same run: plain chat completions on the same server, and rounds alternate
between the workloads so that background load on a shared machine lands on all alike.

    chat           /v1/chat/completions, greedy, max_tokens N                     (baseline)
    responses      /v1/responses, the same prompt and limit                        (route cost)
    chat_json      chat with response_format json_schema (a list of enum words)   (guided decoding cost)
    chat_forced    chat with a named tool_choice (a forced call, enum arguments)   (forced call cost)

Reported per workload and concurrency: requests/s, end-to-end p50/p99, output tokens per
request and milliseconds per output token (end to end / tokens), and the ratio of each to chat.

    .venv/bin/python scripts/bench_guided.py                       # concurrency 1 and 8
    .venv/bin/python scripts/bench_guided.py --concurrency 1 --requests 16

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import numpy as np

from scripts.bench_serve import free_port

ROUNDS = 3
PROMPT = "List some words."
WORDS = {"type": "object", "additionalProperties": False, "required": ["words"], "properties": {"words": {
    "type": "array", "minItems": 8, "maxItems": 8, "items": {"type": "string", "enum": ["red", "green", "blue"]}}}}
TOOL = {"type": "function", "function": {"name": "paint", "parameters": WORDS}}


def bodies(max_tokens: int) -> dict[str, tuple[str, dict[str, Any]]]:
    chat = {"model": "llm", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0.0,
            "max_tokens": max_tokens}
    return {
        "chat": ("/v1/chat/completions", chat),
        "responses": ("/v1/responses", {"model": "llm", "input": PROMPT, "temperature": 0.0,
                                        "max_output_tokens": max_tokens, "store": False}),
        "chat_json": ("/v1/chat/completions", {**chat, "max_tokens": 4 * max_tokens, "response_format": {
            "type": "json_schema", "json_schema": {"name": "words", "schema": WORDS}}}),
        "chat_forced": ("/v1/chat/completions", {**chat, "max_tokens": 4 * max_tokens, "tools": [TOOL],
                                                  "tool_choice": {"type": "function", "function": {"name": "paint"}}}),
    }


def tokens_of(body: dict[str, Any]) -> int:
    usage = body.get("usage") or {}
    return int(usage.get("completion_tokens", usage.get("output_tokens", 0)))


async def one(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, int]:
    t0 = time.perf_counter()
    async with http.post(url, json=body) as resp:
        answer = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {answer}")
    return time.perf_counter() - t0, tokens_of(answer)


async def level(http: aiohttp.ClientSession, base: str, work: dict[str, tuple[str, dict[str, Any]]],
                concurrency: int, n: int) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in work}
    walls: dict[str, float] = dict.fromkeys(work, 0.0)
    for _ in range(ROUNDS):
        for name, (path, body) in work.items():
            gate = asyncio.Semaphore(concurrency)

            async def bounded(path: str = path, body: dict[str, Any] = body,
                              gate: asyncio.Semaphore = gate) -> tuple[float, int]:
                async with gate:
                    return await one(http, base + path, body)

            t0 = time.perf_counter()
            samples[name] += await asyncio.gather(*(bounded() for _ in range(n)))
            walls[name] += time.perf_counter() - t0
    out = {}
    for name, got in samples.items():
        e2e = np.array([s for s, _ in got])
        tokens = np.array([t for _, t in got])
        out[name] = {"n": len(got), "rps": round(len(got) / walls[name], 2),
                     "e2e_p50_ms": round(float(np.median(e2e)) * 1000, 1),
                     "e2e_p99_ms": round(float(np.percentile(e2e, 99)) * 1000, 1),
                     "tokens_p50": float(np.median(tokens)),
                     "ms_per_token_p50": round(float(np.median(e2e / np.maximum(tokens, 1))) * 1000, 2)}
    for name in out:
        out[name]["ms_per_token_vs_chat"] = round(out[name]["ms_per_token_p50"] / out["chat"]["ms_per_token_p50"], 3)
        out[name]["e2e_vs_chat"] = round(out[name]["e2e_p50_ms"] / out["chat"]["e2e_p50_ms"], 3)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.models.tiny.llama import make_tiny_llama
    from scripts.bench_serve import ServerProcess

    with tempfile.TemporaryDirectory(prefix="bench-guided-") as tmp:
        model = make_tiny_llama(Path(tmp) / "tiny-llama", seed=0)
        port = free_port()
        server = ServerProcess(Path("unused"), port)
        server.cmd = [sys.executable, "-m", "omni_actors.cli", "--model", str(model), "--port", str(port),
                      "--served-model-name", "llm"]
        work = bodies(args.max_tokens)
        results: dict[str, Any] = {}
        async with server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{port}"
            for path, body in work.values():  # warm-up: grammars compiled, code paths taken
                await one(http, base + path, body)
            for c in args.concurrency:
                results[f"c{c}"] = await level(http, base, work, c, args.requests or max(8, 2 * c))
    return {"bench": "guided", "pipeline": "llm", "model": "tiny-llama", "max_tokens": args.max_tokens,
            "rounds": ROUNDS, "results": results}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=0, help="requests per round and workload (default max(8, 2c))")
    ap.add_argument("--max-tokens", type=int, default=32)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
