"""CUDA graphs for a codec decoder's windows: shapes padded up to buckets, each captured once.

A streamed codec decode (Mimi for CSM, Qwen3-Omni's code2wav, Qwen3-TTS's codec) is a few
hundred small kernels whatever the window: eager, its host dispatch alone (about 2,500 aten
calls a Mimi decode at CSM-1B's sizes) takes tens of milliseconds, and a request's first
audio waits on it. Here a decode of codes [batch, groups, length] is padded up to a
(batch, length) bucket, zero-code rows below and frames to the right, and replayed from the
graph captured for it at load (`warm`; hf_ar_graphs.DecodeGraphs; a failed capture turns
graphs off and decoding goes on eagerly).

Right padding is only sound for a causal decoder: no sample depends on a later frame, so the
padded decode's first samples are the unpadded decode's, and its output is cut to the length
the unpadded one has (the bucket's samples less the padding's). No bucket is captured past
`max_codes` (batch x length): its activations would hold the graph pool's memory for good. A
decode bigger than that goes to replays of the largest bucket that fits, rows at a time; a
window longer than every captured length runs eagerly.

A decoder that is not causal (Higgs-Audio-V2's DAC) passes `lengths` and `pad_length=False`:
only rows are padded (rows are decoded independently), and a window is replayed only at a
length captured for it exactly (the window lengths its chunk policy makes; the engine widens
other windows to them where it can, `GenerationAdapter.window_lengths`); any other length runs
eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs
from omni_actors.workers.engines.hf_ar_slots import buckets

LENGTHS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
"""Window lengths (frames) decodes are padded up to; a longer window runs eagerly."""
MAX_CODES = 1024
"""Largest batch x length bucket captured (Mimi at CSM-1B's sizes: ~0.5 GB of activations)."""


class CodecGraphs:
    """`run(codes)` = `decode(codes)` ([batch, groups, length] -> [batch, samples]), from graphs."""

    def __init__(
        self, decode: Callable[[torch.Tensor], torch.Tensor], groups: int, samples_per_code: int,
        device: torch.device | str, max_batch: int, enabled: bool, max_codes: int = MAX_CODES,
        lengths: tuple[int, ...] = LENGTHS, pad_length: bool = True,
    ) -> None:  # fmt: skip
        self.decode, self.groups, self.spc = decode, groups, samples_per_code
        self.lengths, self.pad_length = tuple(sorted(set(lengths))), pad_length
        self.device = torch.device(device)
        self.batches = buckets(max(1, max_batch), 1)
        self.max_codes = max_codes
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.graphs = DecodeGraphs(self._replayable, enabled, eager_first=False)

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    def bucket(self, batch: int, length: int) -> tuple[int, int] | None:
        """The (batch, length) a decode is padded to; None: it runs as it is."""
        b = next((s for s in self.batches if s >= batch), None)
        n = self._length(length)
        if b is None or n is None or b * n > self.max_codes:
            return None
        return b, n

    def rows_per_replay(self, batch: int, length: int) -> int | None:
        """How many rows of a decode too big for one bucket go to each replay: the largest batch
        bucket whose padded window still fits `max_codes`. None: the decode runs as it is (one
        bucket takes it, or its window is longer than every captured length)."""
        if self.bucket(batch, length) is not None:
            return None
        n = self._length(length)
        fits = [b for b in self.batches if n is not None and b * n <= self.max_codes]
        return max(fits) if fits else None

    def _length(self, length: int) -> int | None:
        """The captured length a window of `length` codes is replayed at; None: eager."""
        if not self.pad_length:
            return length if length in self.lengths else None
        return next((s for s in self.lengths if s >= length), None)

    def _replayable(self, batch: int, length: int) -> torch.Tensor:
        return self.decode(self.inputs[(batch, length)])

    @torch.inference_mode()
    def warm(self, first: int) -> None:
        """Capture every bucket now, a first window's (`first` frames) before the others: no
        request waits on a capture. (Captured on first use, 16 streams starting together on
        CSM-1B met about ten captures, and the codec's mean step was 72 ms against 5 ms warm.)"""
        n0 = self._length(first)
        for length in sorted(self.lengths, key=lambda n: n != n0):
            for batch in self.batches:
                if self.enabled and batch * length <= self.max_codes:
                    self.run(torch.zeros(batch, self.groups, length, dtype=torch.long, device=self.device))  # fmt: skip

    def run(self, codes: torch.Tensor) -> torch.Tensor:
        batch, _, length = codes.shape
        if not self.enabled:
            return self.decode(codes)
        rows = self.rows_per_replay(batch, length)
        if rows is not None:  # replays of captured buckets, not one eager decode (16 CSM streams'
            # 75-frame windows: 1,200 codes, past max_codes; eager that was ~100 ms of host dispatch)
            return torch.cat([self.run(codes[i : i + rows]).clone() for i in range(0, batch, rows)])
        shape = self.bucket(batch, length)
        if shape is None:
            return self.decode(codes)
        buf = self.inputs.get(shape)
        if buf is None:  # padding codes: anything (no kept sample of a causal decoder sees them,
            # and padded rows are other rows)
            buf = torch.zeros(shape[0], self.groups, shape[1], dtype=torch.long, device=self.device)
            self.inputs[shape] = buf
        buf[:batch, :, :length].copy_(codes)
        out = self.graphs.run(*shape)
        return out[:batch, : out.shape[-1] - (shape[1] - length) * self.spc]
