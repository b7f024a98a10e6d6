"""A huge duplex `input_audio_buffer.append`: the event loop's cost of decoding it, keeping the last
MAX_FEED_S of audio (WireStream.decode with `keep`: only the tail's base64 groups decoded, the rest checked in
one pass) against decoding the whole string and keeping the tail (the same-run baseline, as before 2026-12-05).

    .venv/bin/python scripts/bench_duplex_append.py [--mib 15]

Prints one JSON line: best-of-7 milliseconds per format (pcm16, G.711 u-law), plain and line-wrapped base64.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_actors.api.realtime.audio import _WHITESPACE, WireStream, decode_bytes, wire_rate
from omni_actors.api.realtime.duplex import MAX_FEED_S


def whole_then_tail(held: bytes, b64: str, fmt: str, keep: int) -> np.ndarray:
    raw = held + base64.b64decode(b64.translate(_WHITESPACE), validate=True)
    width = 2 if fmt == "pcm16" else 1
    whole = len(raw) - len(raw) % width
    return decode_bytes(raw[max(0, whole - keep * width):whole], fmt)


def best_ms(fn, n: int = 7) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=15.0)
    args = ap.parse_args()
    raw = np.random.default_rng(5).integers(0, 256, int(args.mib * 2**20) * 3 // 4 + 1, dtype=np.uint8).tobytes()
    out: dict[str, dict[str, float]] = {}
    for fmt in ("pcm16", "g711_ulaw"):
        keep = int(MAX_FEED_S * wire_rate(fmt))
        for wrapped in (False, True):
            text = (base64.encodebytes if wrapped else base64.b64encode)(raw).decode()

            def tail_only(fmt: str = fmt, text: str = text, keep: int = keep) -> np.ndarray:
                return WireStream(fmt).decode(text, keep=keep)

            assert np.array_equal(tail_only(), whole_then_tail(b"", text, fmt, keep))
            out[fmt + ("_wrapped" if wrapped else "")] = {
                "whole_ms": best_ms(lambda fmt=fmt, text=text, keep=keep: whole_then_tail(b"", text, fmt, keep)),
                "tail_ms": best_ms(tail_only)}
    print(json.dumps({"bench": "duplex_append", "mib": args.mib, "keep_s": MAX_FEED_S, "decode": out}))


if __name__ == "__main__":
    main()
