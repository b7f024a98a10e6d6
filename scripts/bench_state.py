"""Stored-state APIs against the same calls without the state: chat `store`, conversations, batches, client secrets.

`omni-run --deploy` serves the bundled synthetic pipeline (omni_actors/deploy/synthetic.yaml, what
`omni-run --model synthetic` serves) with an API key and a temporary OMNI_DATA_DIR (its SQLite
store on the same disk as the system's temp folder); the unmodified `openai` SDK (aiohttp for the
realtime WebSocket) drives it from this process. Each pair runs in alternating rounds (the order
flipped every round) so background load on a shared machine lands on both alike:

    chat            a completion with store=true vs store=false, non-streamed and streamed (one at a time)
    stored_list     retrieve / list / list with a metadata filter (1 % of rows, and none) at 100, 1,000
                    and 10,000 rows (those past --api-rows are copies written to the database), over plain
                    HTTP, vs GET /v1/models (the same auth and HTTP path, no store)
    responses       a /v1/responses turn continuing a conversation (`conversation`, a fresh one of N items
                    per turn) vs the same history as `previous_response_id` (one stored response of N items)
    batch           N chat lines as a batch, create to `completed` seen (polled as a client does), vs the
                    same N requests sent directly, LINES_IN_FLIGHT (the runner's 4) at a time
    realtime        WebSocket connect to session.created with an `ek_` client secret vs the API key

    .venv/bin/python scripts/bench_state.py             # ~2 minutes on the 2-core box
    .venv/bin/python scripts/bench_state.py --quick     # fewer rows, samples and batch lines

Prints one JSON line: per pair each side's p50/p99 (ms) or requests/s and the variant / baseline ratio
(`p50_added_ms`: the variant's p50 minus the baseline's). The SDK's own time per call (several ms here)
is in both sides of a pair; the `stored_list` reads skip it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_serve import ServerProcess, free_port

from omni_actors.api.batches_runner import LINES_IN_FLIGHT
from omni_actors.store import Store

KEY = "bench-state-key"
MODEL = "synthetic"
PROMPT = "the quick brown fox jumps over the lazy dog"
BATCH_WAIT_S = 300.0
"""Longest one batch may take to end."""
BATCH_POLL_S = 0.02
"""Between polls of a running batch (its wall time is known to this much)."""
SESSION_CREATED_TIMEOUT_S = 10.0
SEED_CONCURRENCY = 8
BUCKETS = 100
"""Seeded completions carry metadata {"bucket": i % BUCKETS}: filtering on one bucket matches 1 %."""
CONV_CHUNK = 20
"""Items one conversations call adds at most (conversations.MAX_ITEMS_ADDED)."""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="~1 minute: fewer rows, samples and lines")
    ap.add_argument("--rows", default="", help="stored completions listed at (default 100,1000,10000; quick "
                    "50,300,3000)")
    ap.add_argument("--api-rows", type=int, default=0, help="of those, made through the API (default 1000; quick "
                    "300); the rest are copies of them written to the database")
    ap.add_argument("--items", default="20,100", help="conversation sizes for the /v1/responses pair")
    ap.add_argument("--batch-lines", type=int, default=0, help="lines per batch (default 200; quick 60)")
    ap.add_argument("--rounds", type=int, default=0, help="alternating rounds per pair (default 4; quick 2)")
    ap.add_argument("--samples", type=int, default=0, help="requests per side and round (default 25; quick 10)")
    ap.add_argument("--tokens", type=int, default=4, help="max_tokens of each chat / response")
    args = ap.parse_args()
    q = args.quick
    args.rows = [int(x) for x in (args.rows or ("50,300,3000" if q else "100,1000,10000")).split(",")]
    args.api_rows = args.api_rows or (300 if q else 1000)
    args.items = [int(x) for x in args.items.split(",")]
    args.batch_lines = args.batch_lines or (60 if q else 200)
    args.rounds = args.rounds or (2 if q else 4)
    args.samples = args.samples or (10 if q else 25)
    return args


def deploy_raw(port: int) -> dict[str, Any]:
    """The bundled synthetic deploy (what `omni-run --model synthetic` serves), with an API key."""
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "omni_actors/deploy/synthetic.yaml").read_text())
    raw["server"] = {**raw.get("server", {}), "host": "127.0.0.1", "port": port, "api_keys": [KEY]}
    return raw


# ---- timing -----------------------------------------------------------------------------


async def alternate(ways: dict[str, Callable[[], Awaitable[Any]]], rounds: int, per_round: int) -> dict[str, list[float]]:
    """Each way `per_round` times in a row, one at a time, in `rounds` rounds (order flipped each round).
    A way that returns a float has timed itself (seconds); else its whole call is timed."""
    times: dict[str, list[float]] = {w: [] for w in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for _ in range(per_round):
                t0 = time.perf_counter()
                took = await ways[name]()
                times[name].append(took if isinstance(took, float) else time.perf_counter() - t0)
    return times


def ms(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 2)


def pair(times: dict[str, list[float]], variant: str, baseline: str) -> dict[str, Any]:
    """Both sides' p50/p99 and the variant's p50 over the baseline's."""
    out: dict[str, Any] = {w: {"n": len(t), "p50_ms": ms(t, 50), "p99_ms": ms(t, 99)} for w, t in times.items()}
    out[f"p50_{variant}_over_{baseline}"] = round(out[variant]["p50_ms"] / out[baseline]["p50_ms"], 3)
    out["p50_added_ms"] = round(out[variant]["p50_ms"] - out[baseline]["p50_ms"], 2)
    return out


async def gather_n(n: int, concurrency: int, one: Callable[[int], Awaitable[Any]]) -> float:
    """Run one(0..n-1), `concurrency` at a time; the wall time."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await one(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


# ---- 1. stored chat completions ------------------------------------------------------------


def ask(text: str = PROMPT) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def chat_pairs(client, args: argparse.Namespace) -> dict[str, Any]:
    async def plain(store: bool) -> None:
        await client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=args.tokens, store=store,
                                             metadata={"bench": "latency"} if store else None)

    async def streamed(store: bool) -> None:
        stream = await client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=args.tokens,
                                                      store=store, stream=True,
                                                      metadata={"bench": "latency"} if store else None)
        async for _ in stream:
            pass

    out = {}
    for name, call in (("non_streamed", plain), ("streamed", streamed)):
        await alternate({"store": lambda c=call: c(True), "no_store": lambda c=call: c(False)}, 1, 3)  # warm-up
        out[name] = pair(await alternate({"store": lambda c=call: c(True), "no_store": lambda c=call: c(False)},
                                         args.rounds, args.samples), "store", "no_store")
    return out


async def seed(client, start: int, stop: int) -> list[str]:
    """Stored completions start..stop-1 (metadata bucket i % BUCKETS); their ids."""
    ids: list[str] = []

    async def one(i: int) -> None:
        made = await client.chat.completions.create(model=MODEL, messages=ask(f"row {start + i}"), max_tokens=1,
                                                    store=True, metadata={"bucket": str((start + i) % BUCKETS)})
        ids.append(made.id)

    await gather_n(stop - start, SEED_CONCURRENCY, one)
    return ids


def copy_rows(state_dir: Path, source: list[str], count: int) -> None:
    """`count` more stored completions, copies of `source` (their metadata too) under new ids, written
    straight to the server's database (WAL: the server reads them at once): a table this size through
    the API would take minutes."""
    store = Store(state_dir)
    try:
        store.transaction([(
            "INSERT INTO chat_completions (id, created, model, metadata, body, messages) "
            "SELECT c.id || '-' || k.value, c.created, c.model, c.metadata, json_set(c.body, '$.id', c.id || '-' || "
            "k.value), c.messages FROM chat_completions AS c, json_each(?) AS k "
            "WHERE c.id IN (SELECT value FROM json_each(?)) LIMIT ?",
            (json.dumps(list(range(-(-count // len(source))))), json.dumps(source), count))])
    finally:
        store.close()


async def list_pairs(url: str, client, args: argparse.Namespace) -> dict[str, Any]:
    out, ids, have = {}, [], 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http:
        for rows in args.rows:
            t0 = time.perf_counter()
            if have < args.api_rows:
                ids += await seed(client, have, min(rows, args.api_rows))
                have = min(rows, args.api_rows)
            if rows > have:
                await asyncio.to_thread(copy_rows, args.state_dir, ids, rows - have)
                have = rows
            seed_s = time.perf_counter() - t0
            out[str(rows)] = {"seeded_s": round(seed_s, 2), "copied_rows": max(0, rows - args.api_rows),
                              **await lists_at(http, url, list(ids), args)}
    return out


async def lists_at(http: aiohttp.ClientSession, url: str, ids: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Reads of the stored completions (`ids`: those made through the API) against GET /v1/models, over
    plain HTTP: the SDK's parsing of a 20-completion page (~15 ms here) would hide the server's part."""
    rng = random.Random(0)

    async def get(path: str, want: int | None = None) -> None:
        async with http.get(url + path) as resp:
            got = await resp.json()
            assert resp.status == 200, got
        assert want is None or len(got["data"]) == want, (path, len(got["data"]))

    ways = {
        "models_baseline": lambda: get("/v1/models"),
        "retrieve": lambda: get(f"/v1/chat/completions/{rng.choice(ids)}"),
        "list": lambda: get("/v1/chat/completions?limit=20", 20),
        "list_desc": lambda: get("/v1/chat/completions?limit=20&order=desc", 20),
        "list_filter_1pct": lambda: get("/v1/chat/completions?limit=20&metadata[bucket]=7"),
        "list_filter_none": lambda: get("/v1/chat/completions?limit=20&metadata[bucket]=none", 0),
    }
    await alternate(ways, 1, 2)  # warm-up
    times = await alternate(ways, args.rounds, args.samples)
    base = times["models_baseline"]
    row: dict[str, Any] = {"models_baseline": {"n": len(base), "p50_ms": ms(base, 50), "p99_ms": ms(base, 99)}}
    for way in ways:
        if way != "models_baseline":
            got = pair({way: times[way], "models_baseline": base}, way, "models_baseline")
            row[way] = {**got[way], "p50_over_models": got[f"p50_{way}_over_models_baseline"]}
    return row


# ---- 2. /v1/responses: `conversation` vs `previous_response_id` ----------------------------------


def history(n: int) -> list[dict[str, str]]:
    """n messages, user and assistant in turn (the last an assistant's)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i // 2} {PROMPT}"} for i in range(n)]


async def conversation_of(client, items: list[dict[str, str]]) -> str:
    conv = await client.conversations.create(items=items[:CONV_CHUNK])
    for i in range(CONV_CHUNK, len(items), CONV_CHUNK):
        await client.conversations.items.create(conv.id, items=items[i:i + CONV_CHUNK])
    return conv.id


async def responses_pairs(client, args: argparse.Namespace) -> dict[str, Any]:
    return {str(n): await responses_at(client, n, args) for n in args.items}


async def responses_at(client, n: int, args: argparse.Namespace) -> dict[str, Any]:
    items = history(n)
    base = await client.responses.create(model=MODEL, input=items[:-1], max_output_tokens=1)  # n items stored
    # A fresh conversation of n items for each turn (each turn adds its 2 items to the one it runs in).
    convs = [await conversation_of(client, items) for _ in range(args.rounds * args.samples + 1)]
    check = [i async for i in client.conversations.items.list(convs[0], limit=100)]
    assert len(check) == n, (n, len(check))

    async def in_conversation() -> None:
        got = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=args.tokens,
                                            conversation=convs.pop())
        assert got.status == "completed", got.status

    async def chained() -> None:
        got = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=args.tokens,
                                            previous_response_id=base.id)
        assert got.status == "completed", got.status

    ways = {"conversation": in_conversation, "previous_response_id": chained}
    await alternate(ways, 1, 1)  # warm-up
    return pair(await alternate(ways, args.rounds, args.samples), "conversation", "previous_response_id")


# ---- 3. batches --------------------------------------------------------------------------------


def body(i: int, args: argparse.Namespace) -> dict[str, Any]:
    return {"model": MODEL, "messages": ask(f"line {i} {PROMPT}"), "max_tokens": args.tokens}


async def one_batch(client, r: int, args: argparse.Namespace) -> tuple[float, float]:
    """(upload s, create-to-completed s) of one batch of args.batch_lines chat lines."""
    lines = [{"custom_id": f"r{r}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i, args)}
             for i in range(args.batch_lines)]
    raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
    t0 = time.perf_counter()
    fid = (await client.files.create(file=("in.jsonl", raw, "application/jsonl"), purpose="batch")).id
    t1 = time.perf_counter()
    batch = await client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.perf_counter() - t1 < BATCH_WAIT_S, batch
        await asyncio.sleep(BATCH_POLL_S)
        batch = await client.batches.retrieve(batch.id)
    wall = time.perf_counter() - t1
    counts = batch.request_counts
    assert batch.status == "completed" and counts.completed == args.batch_lines, (batch.status, counts)
    return t1 - t0, wall


async def batch_pair(client, args: argparse.Namespace) -> dict[str, Any]:
    async def direct(i: int) -> None:
        await client.chat.completions.create(**body(i, args))

    await gather_n(LINES_IN_FLIGHT, LINES_IN_FLIGHT, direct)  # warm-up
    walls: dict[str, list[float]] = {"batch": [], "direct": []}
    uploads: list[float] = []
    rounds = max(1, args.rounds // 2)
    for r in range(rounds):
        for way in ("batch", "direct") if r % 2 == 0 else ("direct", "batch"):
            if way == "batch":
                up, wall = await one_batch(client, r, args)
                uploads.append(up)
            else:
                wall = await gather_n(args.batch_lines, LINES_IN_FLIGHT, direct)
            walls[way].append(wall)
    rps = {w: round(args.batch_lines * len(t) / sum(t), 2) for w, t in walls.items()}
    return {"lines": args.batch_lines, "concurrency": LINES_IN_FLIGHT, "rounds": rounds,
            "batch": {"wall_s": [round(x, 3) for x in walls["batch"]], "requests_per_s": rps["batch"],
                      "upload_s": round(float(np.median(uploads)), 3)},
            "direct": {"wall_s": [round(x, 3) for x in walls["direct"]], "requests_per_s": rps["direct"]},
            "rps_batch_over_direct": round(rps["batch"] / rps["direct"], 3)}


# ---- 4. realtime client secrets ---------------------------------------------------------------


async def realtime_pair(url: str, client, args: argparse.Namespace) -> dict[str, Any]:
    secret = await client.realtime.client_secrets.create(session={"type": "realtime"})  # (the SDK imports its
    mints = []  # realtime types on first use: hundreds of ms, all of them here)
    for _ in range(args.samples):
        t0 = time.perf_counter()
        secret = await client.realtime.client_secrets.create(session={"type": "realtime"})
        mints.append(time.perf_counter() - t0)
    ws_url = url + "/v1/realtime?model=" + MODEL
    async with aiohttp.ClientSession() as http:

        async def opened(token: str) -> float:
            """Connect to session.created (the close after it is not timed)."""
            t0 = time.perf_counter()
            async with http.ws_connect(ws_url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0) as ws:
                async with asyncio.timeout(SESSION_CREATED_TIMEOUT_S):
                    first = await ws.receive_json()
                took = time.perf_counter() - t0
                assert first["type"] == "session.created", first
            return took

        ways = {"client_secret": lambda: opened(secret.value), "api_key": lambda: opened(KEY)}
        await alternate(ways, 1, 2)  # warm-up
        got = pair(await alternate(ways, args.rounds, args.samples), "client_secret", "api_key")
    return {"mint_p50_ms": ms(mints, 50), "mint_p99_ms": ms(mints, 99), **got}


# ---- the run ----------------------------------------------------------------------------------


async def main() -> None:
    import openai

    args = parse_args()
    t_start = time.perf_counter()
    out: dict[str, Any] = {"bench": "state", "rounds": args.rounds, "samples_per_round": args.samples,
                           "max_tokens": args.tokens}
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        os.environ["OMNI_DATA_DIR"] = tmp  # (the server inherits it: its store, files and batches live here)
        os.environ.pop("OMNI_STATE_DIR", None)  # (else the store would be there, not under tmp)
        args.state_dir = Path(tmp) / "state"
        port = free_port()
        deploy = Path(tmp) / "deploy.yaml"
        raw = deploy_raw(port)
        deploy.write_text(yaml.safe_dump(raw))
        out["step_ms"] = raw["stages"][0]["engine_extras"]["step_delay_ms"]
        url = f"http://127.0.0.1:{port}"
        async with ServerProcess(deploy, port):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
            try:
                out["stored_list"] = await list_pairs(url, client, args)
                out["chat"] = await chat_pairs(client, args)
                out["responses"] = await responses_pairs(client, args)
                out["batch"] = await batch_pair(client, args)
                out["realtime"] = await realtime_pair(url, client, args)
            finally:
                await client.close()
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
