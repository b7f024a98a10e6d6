"""An image named by upload id (`/v1/files`) against the same image sent inline, per chat request.

`omni-run` serves the synthetic pipeline (a temporary data directory); the unmodified `openai`
SDK uploads one photo-sized PNG once, then sends `--requests` chat completions at each
concurrency with the image as a `file` part by `file_id`, and the same number with it inline as
a base64 data URL (the same-run baseline), alternating the two in rounds so background load
lands on both alike. Both decode the same bytes on the server; what differs is what crosses
the wire and is parsed as JSON per request.

    .venv/bin/python scripts/bench_files.py
    .venv/bin/python scripts/bench_files.py --side 2048 --concurrency 1,8 --requests 24

Prints one JSON line: upload time, request body bytes, and end-to-end p50/p90 for each way.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_serve import ServerProcess, free_port

ROUNDS = 3


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", type=int, default=1024, help="the PNG's width and height (noise: ~3 MB at 1024)")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=12, help="requests per way, level and round")
    return ap.parse_args()


def photo(side: int) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


async def level(client, concurrency: int, n: int, part: dict) -> list[float]:
    times: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            await client.chat.completions.create(model="synthetic", max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this"}, part]}])
            times.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


def _ms(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 2)


async def main() -> None:
    import openai

    args = parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    data = photo(args.side)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OMNI_DATA_DIR"] = tmp
        deploy = Path(tmp) / "deploy.yaml"
        stages = [{"stage_id": s, "max_num_seqs": 64, "max_queue": 512} for s in (0, 1, 2)]
        deploy.write_text(yaml.safe_dump({"pipeline": "synthetic", "async_chunk": True, "stages": stages,
                                          "server": {"host": "127.0.0.1", "port": 8000}}))
        port = free_port()
        async with ServerProcess(deploy, port):
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            t0 = time.perf_counter()
            upload = await client.files.create(file=("photo.png", data, "image/png"), purpose="vision")
            upload_s = time.perf_counter() - t0
            ways = {"file_id": {"type": "file", "file": {"file_id": upload.id}},
                    "inline": {"type": "file", "file": {"file_data": "data:image/png;base64,"
                                                        + base64.b64encode(data).decode()}}}
            await level(client, 1, 2, ways["file_id"])  # warm-up, both ways
            await level(client, 1, 2, ways["inline"])
            results = []
            for c in levels:
                times: dict[str, list[float]] = {w: [] for w in ways}
                for _ in range(ROUNDS):
                    for way, part in ways.items():
                        times[way] += await level(client, c, args.requests, part)
                row = {"concurrency": c, "requests_per_way": len(times["inline"])}
                for way, got in times.items():
                    row[way] = {"e2e_p50_ms": _ms(got, 50), "e2e_p90_ms": _ms(got, 90),
                                "requests_per_s": round(len(got) / sum(got) * c, 2)}
                row["p50_inline_over_file_id"] = round(statistics.median(times["inline"])
                                                       / statistics.median(times["file_id"]), 2)
                results.append(row)
            await client.files.delete(upload.id)
            await client.close()
    body = {way: len(json.dumps({"model": "synthetic", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, part]}]})) for way, part in ways.items()}
    print(json.dumps({"bench": "files", "image_side": args.side, "png_bytes": len(data),
                      "upload_s": round(upload_s, 3), "request_body_bytes": body, "rounds": ROUNDS,
                      "results": results}))


if __name__ == "__main__":
    asyncio.run(main())
