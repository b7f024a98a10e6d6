"""One Dia request: its prompt, its KV (or its static slot), and the delay pattern that turns decoder positions into audio frames.

Dia's decoder reads and writes `channels` DAC codebooks per position, channel c
delayed by `delay[c]` positions: position s, channel c holds audio frame s - delay[c].
Frame 0 is all `bos`; a reference clip to clone is frames 1..P (its DAC codes), so the
decoder's prompt is positions 0..P of that delayed grid, and positions past P whose
channel still points into the prompt (s - delay[c] <= P) are fixed, not drawn. Frame j
of new audio is complete once position j + max(delay) is drawn: it is emitted then.

The end: when channel 0 draws `eos` at position e (or the request reaches its frame
budget, which forces it), channel c is forced to `eos` at e + delay[c] and to `pad`
after (what transformers feeds a finished channel); frames e.. are not audio, and the
request is done once frame e - 1 is out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Tokens:
    bos: int
    eos: int
    pad: int
    delay: tuple[int, ...]

    @property
    def max_delay(self) -> int:
        return max(self.delay)


@dataclass
class DiaRequest:
    request_id: str
    params: dict[str, Any]
    text_ids: list[int]
    prompt_codes: np.ndarray
    """[P, channels] DAC codes of the reference clip (P = 0 without one)."""
    max_frames: int
    generator: torch.Generator | None = None
    # KV, set by the first forward: per layer (keys, values) [2, heads, length, dim] (cond, uncond rows)
    self_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    encoded: torch.Tensor | None = None
    """[2, text length, hidden] encoder output (its shape sizes the cross-attention mask)."""
    slot: int | None = None
    """With the static cache: the slot holding this request's KV (static_decode.py); the three above are then None."""
    text_len: int = 0
    """Text positions the cross-attention reads (static cache)."""
    positions: list[np.ndarray] = field(default_factory=list)
    """Row per decoder position (prompt positions included): the delayed grid so far."""
    end: int | None = None
    """Position where channel 0 said end (or was made to)."""

    @property
    def prefilled(self) -> bool:
        return self.self_kv is not None or self.slot is not None

    @property
    def known(self) -> int:
        """Frames fixed before drawing: bos plus the reference clip's."""
        return 1 + len(self.prompt_codes)

    def frame(self, j: int, tok: Tokens) -> np.ndarray:
        """Undelayed frame j of the prompt (0: all bos)."""
        if j <= 0:
            return np.full(len(tok.delay), tok.bos, dtype=np.int64)
        return self.prompt_codes[j - 1]

    def prompt(self, tok: Tokens) -> np.ndarray:
        """[known, channels] decoder input ids of the prompt positions 0..P."""
        rows = [
            np.array([self.frame(s - d, tok)[c] for c, d in enumerate(tok.delay)], dtype=np.int64)
            for s in range(self.known)
        ]
        self.positions = list(rows)
        return np.stack(rows)

    def last(self) -> np.ndarray:
        return self.positions[-1]

    def take(self, drawn: np.ndarray, tok: Tokens) -> tuple[np.ndarray | None, bool]:
        """Record the ids drawn for the next position; return (a completed audio frame or None, done)."""
        s = len(self.positions)
        row = drawn.astype(np.int64).copy()
        for c, d in enumerate(tok.delay):
            if s - d < self.known:  # still inside the prompt: fixed
                row[c] = self.frame(s - d, tok)[c]
        if self.end is None and (row[0] == tok.eos or s - self.known >= self.max_frames):
            self.end = s
        if self.end is not None:
            for c, d in enumerate(tok.delay):
                if s - self.end == d:
                    row[c] = tok.eos
                elif s - self.end > d:
                    row[c] = tok.pad
        self.positions.append(row)
        j = s - tok.max_delay
        frame = None
        if j >= self.known and (self.end is None or j < self.end):
            frame = np.array(
                [self.positions[j + d][c] for c, d in enumerate(tok.delay)], dtype=np.int64
            )
        done = self.end is not None and j >= self.end - 1
        return frame, done
