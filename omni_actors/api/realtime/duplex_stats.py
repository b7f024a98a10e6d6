"""Counters of full-duplex sessions, per app: live sessions, frame compute time, late frames; /metrics export.

    omni_duplex_sessions_live                 duplex sessions connected now
    omni_duplex_sessions_rejected_total       sessions refused at the session limit
    omni_duplex_session_limit                 the limit (batch slots of the duplex stage)
    omni_duplex_frames_total                  frames stepped for sessions (muted ones too)
    omni_duplex_late_frames_total             frames skipped because a step overran its deadline
    omni_duplex_dropped_input_seconds_total   user audio dropped (skipped with late frames, or past the buffer)
    omni_duplex_unsent_frames_total           frames not sent: the client read more than ~2 s behind
    omni_duplex_frame_seconds                 summary: engine step compute time per frame
    omni_duplex_start_lag_seconds             summary: how far past its tick a frame's step started
    omni_duplex_input_to_output_seconds       summary: user frames, last sample in to the engine's output

The three summaries follow Prometheus convention (base units): `{quantile="0.5"}` and `{quantile="0.99"}`
over the last RECENT_FRAMES frames (NaN before the first), with `_sum` and `_count` over every frame since
start (so `rate(_sum) / rate(_count)` is the mean). `statistics()` keeps the percentiles in milliseconds, as
the duplex benchmark reports them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

RECENT_FRAMES = 4096
"""How many recent frames' timings the percentiles are over."""


@dataclass(frozen=True)
class DuplexStatistics:
    sessions_live: int
    sessions_total: int
    sessions_rejected: int
    session_limit: int
    frames: int
    late_frames: int
    dropped_input_s: float
    unsent_frames: int
    frame_ms_p50: float
    frame_ms_p99: float
    start_lag_ms_p50: float
    start_lag_ms_p99: float
    input_to_output_ms_p50: float
    input_to_output_ms_p99: float
    frame_s_sum: float = 0.0
    start_lag_s_sum: float = 0.0
    input_to_output_s_sum: float = 0.0
    input_to_output_count: int = 0
    """Frames timed from user audio in to output (`frames` counts the other two summaries)."""


def _pct(values: deque[float], q: float) -> float:
    return float(np.percentile(np.fromiter(values, float), q)) if values else 0.0


@dataclass
class DuplexStats:
    sessions_live: int = 0
    sessions_total: int = 0
    sessions_rejected: int = 0
    session_limit: int = 0
    frames: int = 0
    late_frames: int = 0
    dropped_input_s: float = 0.0
    unsent_frames: int = 0
    frame_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FRAMES))
    start_lag_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FRAMES))
    input_to_output_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FRAMES))
    frame_s_sum: float = 0.0
    start_lag_s_sum: float = 0.0
    input_to_output_s_sum: float = 0.0
    input_to_output_count: int = 0

    def frame(self, frame_ms: float, start_lag_ms: float, late: int, input_to_output_ms: float | None,
              dropped_input_s: float = 0.0) -> None:
        """One frame delivered to a session, and the session's input audio dropped since its last frame."""
        self.frames += 1
        self.dropped_input_s += dropped_input_s
        self.late_frames += late
        self.frame_ms.append(frame_ms)
        self.start_lag_ms.append(start_lag_ms)
        self.frame_s_sum += frame_ms / 1000
        self.start_lag_s_sum += start_lag_ms / 1000
        if input_to_output_ms is not None:
            self.input_to_output_ms.append(input_to_output_ms)
            self.input_to_output_s_sum += input_to_output_ms / 1000
            self.input_to_output_count += 1

    def statistics(self) -> DuplexStatistics:
        return DuplexStatistics(
            self.sessions_live, self.sessions_total, self.sessions_rejected, self.session_limit, self.frames,
            self.late_frames, self.dropped_input_s, self.unsent_frames, _pct(self.frame_ms, 50), _pct(self.frame_ms, 99),
            _pct(self.start_lag_ms, 50), _pct(self.start_lag_ms, 99),
            _pct(self.input_to_output_ms, 50), _pct(self.input_to_output_ms, 99),
            self.frame_s_sum, self.start_lag_s_sum, self.input_to_output_s_sum, self.input_to_output_count,
        )


def _summary(name: str, doc: str, p50_ms: float, p99_ms: float, count: int, sum_s: float) -> SummaryMetricFamily:
    """A summary in seconds: recent p50 / p99 (given in ms) and the all-time count and sum. Before any
    observation its quantiles are NaN, as Prometheus clients write an empty summary's: not a 0 s p99."""
    family = SummaryMetricFamily(name, doc, count_value=count, sum_value=sum_s)
    family.add_sample(name, {"quantile": "0.5"}, p50_ms / 1000 if count else math.nan)
    family.add_sample(name, {"quantile": "0.99"}, p99_ms / 1000 if count else math.nan)
    return family


class DuplexCollector:
    """Prometheus collector reading DuplexStats at scrape time; `limit`, when given, is the session limit
    now (read at each scrape: the route sets it only when a client connects, so it read 0 until then)."""

    def __init__(self, stats: DuplexStats, limit: Callable[[], int] | None = None) -> None:
        self.stats = stats
        self.limit = limit

    def collect(self):
        if self.limit is not None:
            self.stats.session_limit = self.limit()
        s = self.stats.statistics()
        live = GaugeMetricFamily("omni_duplex_sessions_live", "Duplex sessions connected now")
        live.add_metric([], s.sessions_live)
        limit = GaugeMetricFamily("omni_duplex_session_limit", "Most concurrent duplex sessions")
        limit.add_metric([], s.session_limit)
        rejected = CounterMetricFamily("omni_duplex_sessions_rejected", "Duplex sessions refused at the limit")
        rejected.add_metric([], s.sessions_rejected)
        frames = CounterMetricFamily("omni_duplex_frames", "Frames stepped for duplex sessions, muted ones included")
        frames.add_metric([], s.frames)
        late = CounterMetricFamily("omni_duplex_late_frames", "Frames skipped: a step overran its deadline")
        late.add_metric([], s.late_frames)
        dropped = CounterMetricFamily("omni_duplex_dropped_input_seconds",
                                      "User audio dropped: with skipped frames or past the input buffer")
        dropped.add_metric([], s.dropped_input_s)
        unsent = CounterMetricFamily("omni_duplex_unsent_frames", "Frames not sent: the client read too slowly")
        unsent.add_metric([], s.unsent_frames)
        frame = _summary("omni_duplex_frame_seconds", "Engine step compute time per duplex frame",
                         s.frame_ms_p50, s.frame_ms_p99, s.frames, s.frame_s_sum)
        lag = _summary("omni_duplex_start_lag_seconds", "How far past its tick a duplex frame's step started",
                       s.start_lag_ms_p50, s.start_lag_ms_p99, s.frames, s.start_lag_s_sum)
        io = _summary("omni_duplex_input_to_output_seconds", "User frames: last sample in to the engine's output",
                      s.input_to_output_ms_p50, s.input_to_output_ms_p99, s.input_to_output_count,
                      s.input_to_output_s_sum)
        return [live, limit, rejected, frames, late, dropped, unsent, frame, lag, io]
