"""Drive a speech engine in process through a schedule of requests joining and aborting."""

from __future__ import annotations

from typing import Any

import numpy as np


def drive(
    engine: Any, schedule: dict[int, list[tuple]], abort: dict[int, str], voice: str, key: str
) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
    """Step `engine` until idle, adding schedule[step]'s (rid, text, params, extra inputs) and
    aborting abort[step] at their steps; -> (each request's `key` payloads stacked, finish reasons)."""
    got: dict[str, list[np.ndarray]] = {}
    reasons: dict[str, str | None] = {}
    step = 0
    while step <= max(schedule) or engine.has_work():
        for rid, text, params, extra in schedule.get(step, []):
            got[rid] = []
            engine.add(rid, {"text": text, "voice": voice, **extra}, params)
        if step in abort:
            engine.abort(abort[step])
            reasons[abort[step]] = "aborted"
        for out in engine.step():
            assert out.error is None
            if key in out.payload:
                got[out.request_id].append(out.payload[key][0])
            if out.finished:
                reasons[out.request_id] = out.payload.get("finish_reason")
        step += 1
    assert not engine.requests
    return {rid: np.array(x) for rid, x in got.items()}, reasons
