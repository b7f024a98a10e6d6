"""Video handoff benchmark: what a served video costs after the pipeline returns, at a real frame size, on CPU.

The phases of the served path between diffusers' float frames and the orchestrator holding uint8 ones:
the engine's float -> uint8 conversion (`workers/engines/video.py` `_video_uint8`) against the one-line
form it replaced (`(clip(x, 0, 1) * 255).round().astype(uint8)`, the same-run baseline; both must give the
same bytes), the worker's encode into its shared-memory arena (a fresh segment, then a reused one), and the
orchestrator's decode (`copy=True`, as `orchestrator/receive.py` does). No model: the frames are random
float32 laid out as Wan's `output_type="np"` returns them ([B, F, H, W, C] over [B, C, F, H, W] memory).

    .venv/bin/python scripts/bench_video_handoff.py --size 1280x704 --frames 49   # Wan2.2-TI2V-5B at 720p

Prints one JSON line; each time is the median of --repeats runs, in ms ("*_all_ms" lists every run:
the first of a process pays fresh page faults, as a worker's does on each new video's arrays).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARENA_BUDGET_BYTES = 1 << 34
"""Room for one video of any size this bench is asked for."""


def _one_line_uint8(frames: np.ndarray) -> np.ndarray:
    """The engine's conversion before this bench, with the contiguous copy its outputs then made
    (`np.ascontiguousarray` in `_final_outputs`: `astype` keeps diffusers' channel-first memory)."""
    return np.ascontiguousarray((np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8))


def _times(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    runs, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        runs.append(1000 * (time.perf_counter() - start))
    return runs, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1280x704", help="WxH")
    ap.add_argument("--frames", type=int, default=49)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from omni_actors.bus.codec import PayloadCodec
    from omni_actors.bus.shm import Arena, SegmentCache
    from omni_actors.workers.engines.video import _video_uint8

    width, height = (int(v) for v in args.size.split("x"))
    channels_first = np.random.default_rng(0).random((1, 3, args.frames, height, width), dtype=np.float32)
    frames = channels_first.transpose(0, 2, 3, 4, 1)
    one_line, want = _times(lambda: _one_line_uint8(frames), args.repeats)
    engine, got = _times(lambda: _video_uint8(frames), args.repeats)
    assert np.array_equal(got, want), "the engine's conversion changed the frames"
    arena, cache = Arena("bench-video-handoff", budget_bytes=ARENA_BUDGET_BYTES), SegmentCache()
    worker, orch = PayloadCodec("w", arena, SegmentCache()), PayloadCodec("o", None, cache)
    encode, decode = [], []
    try:
        for _ in range(args.repeats):
            start = time.perf_counter()
            payload = worker.encode({"frames": got[0], "fps": 24.0})
            mid = time.perf_counter()
            received = orch.decode(payload, copy=True)
            end = time.perf_counter()
            assert np.array_equal(received["frames"], got[0])
            worker.free([ref.lease for ref in payload.arrays.values()])  # the orchestrator's Release
            encode.append(1000 * (mid - start))
            decode.append(1000 * (end - mid))
    finally:
        cache.close()
        arena.close()

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 1)

    def every(xs: list[float]) -> list[float]:
        return [round(x, 1) for x in xs]

    print(json.dumps({
        "bench": "video_handoff", "size": args.size, "frames": args.frames, "repeats": args.repeats,
        "float_mb": round(frames.nbytes / 1e6, 1), "uint8_mb": round(got.nbytes / 1e6, 1),
        "one_line_uint8_ms": med(one_line), "engine_uint8_ms": med(engine),
        "shm_encode_ms": med(encode), "orchestrator_decode_ms": med(decode),
        "one_line_uint8_all_ms": every(one_line), "engine_uint8_all_ms": every(engine),
        "shm_encode_all_ms": every(encode), "bit_identical": True,
    }))


if __name__ == "__main__":
    main()
