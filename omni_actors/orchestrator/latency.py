"""Per-stage first-output latency: how long each stage of a request took to say something.

The orchestrator stamps when it starts a request on a stage (the AddRequest it sends) and when that
stage's first output with data comes back; the difference is the stage's own share of a request's
time to first output (its queue, its engine's first step, the two bus hops), and the first output
since submit places it on the request's timeline. A streamed pipeline's first audio is the sum of
these shares along its path, so this is where a slow first chunk is found (`/metrics`:
`omni_stage_first_output_seconds`; `scripts/bench_omni_pipeline.py` and `bench_tts.py` print the p50s).
"""

from __future__ import annotations

import bisect
from collections import deque

BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds of the exported histogram's buckets (the last bucket, +Inf, is implied)."""

RECENT = 4096
"""Samples kept per stage for percentiles (the histogram counts every one)."""


class StageLatency:
    """One stage's first-output samples: cumulative histogram of stage start -> first output, and
    the recent (since submit, since stage start) pairs."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.total_s = 0.0
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT)

    def record(self, since_submit: float, since_start: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, since_start)] += 1
        self.total_s += since_start
        self.recent.append((since_submit, since_start))

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (upper bound, count) pairs as Prometheus histograms want them."""
        return cumulative(BUCKETS_S, self.counts)


def cumulative(bounds: tuple[float, ...], counts: list[int] | tuple[int, ...]) -> list[tuple[str, int]]:
    """Per-bucket counts (one per bound, then one past the last) as Prometheus' cumulative
    (upper bound, count) pairs, +Inf last."""
    out, acc = [], 0
    for bound, n in zip((*map(str, bounds), "+Inf"), counts, strict=False):
        acc += n
        out.append((bound, acc))
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of values, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary_ms(lat: StageLatency) -> dict[str, float | int | None]:
    """p50 and p95 of a stage's recent samples in ms: since submit and since the stage started."""
    subs = [s for s, _ in lat.recent]
    own = [o for _, o in lat.recent]

    def ms(values: list[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else round(p * 1e3, 1)

    return {
        "n": len(own),
        "since_submit_p50_ms": ms(subs, 50), "since_submit_p95_ms": ms(subs, 95),
        "own_p50_ms": ms(own, 50), "own_p95_ms": ms(own, 95),
        "own_max_ms": None if not own else round(max(own) * 1e3, 1),
    }  # fmt: skip
