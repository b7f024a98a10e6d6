"""Counters of the realtime endpoint, per app: sessions, responses by status, pipeline first-audio times.

`statistics()` returns an immutable snapshot (for /metrics and benchmarks).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from omni_actors.api.realtime.duplex_stats import DuplexStatistics, DuplexStats

RECENT_RESPONSES = 4096
"""How many responses' pipeline first-audio times are kept (oldest dropped first)."""


@dataclass(frozen=True)
class RealtimeStatistics:
    sessions_open: int
    sessions_total: int
    sessions_rejected: int
    responses: dict[str, int]
    """Finished responses by status (completed, cancelled, incomplete, failed)."""
    pipeline_first_audio_ms: dict[str, float]
    """Recent responses: submit to the first audio chunk out of the orchestrator, by response id."""
    duplex: DuplexStatistics
    """Full-duplex sessions (duplex models only)."""


@dataclass
class RealtimeStats:
    sessions_open: int = 0
    sessions_total: int = 0
    sessions_rejected: int = 0
    responses: Counter[str] = field(default_factory=Counter)
    first_audio: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT_RESPONSES))
    duplex: DuplexStats = field(default_factory=DuplexStats)
    """Full-duplex sessions (duplex models only)."""

    def response_done(self, response_id: str, status: str, first_audio_ms: float | None) -> None:
        self.responses[status] += 1
        if first_audio_ms is not None:
            self.first_audio.append((response_id, first_audio_ms))

    def statistics(self) -> RealtimeStatistics:
        return RealtimeStatistics(self.sessions_open, self.sessions_total, self.sessions_rejected,
                                  dict(self.responses), dict(self.first_audio), self.duplex.statistics())
