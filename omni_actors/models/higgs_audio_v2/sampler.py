"""Higgs-Audio-V2's step sampler: every codebook of every row drawn on the device in one call.

A step's logits are [rows, groups * vocab]. The sampler applies the delay pattern's masks
(delay.py, from each row's step and first eos), draws all codebooks with each request's
temperature, top-k and top-p (greedy rows take the masked argmax), redraws repeats where
the generation config asks for RAS (ras.py), and embeds the drawn frame (the sum of its
codebooks' audio embeddings: the next step's input). The noise is counter-based
(counter_noise.py: a function of the request's key and step), so a seeded request draws
the same codes alone or batched, and the whole step is a fixed sequence of kernels: on
CUDA one graph per (rows bucket, ranked width) is replayed (hf_ar_graphs.DecodeGraphs over
static buffers), where drawing the codebooks through `hf_ar_sampling.pick` took ~90
kernel launches and two generator calls a seeded request a step, outside any graph.

Per row the host sends six numbers (step, first eos, top-k, key, temperature, top-p) in
one pinned copy, plus the RAS window when that is on; it brings back the codes. The ranked
width is the largest top-k of the step's sampled rows rounded up to a power of two (the
whole vocabulary, sorted, when a row has no top-k): a row's draw does not depend on it (its
noise is indexed by rank, and ranks past its top-k are masked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from omni_actors.models.higgs_audio_v2.delay import forced_codes, step_masks
from omni_actors.models.higgs_audio_v2.ras import EMPTY, redraw_repeats
from omni_actors.workers.engines.counter_noise import counter_uniform
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs
from omni_actors.workers.engines.hf_ar_sampling import gumbel_of
from omni_actors.workers.engines.hf_ar_slots import bucket_for, buckets

INTS, FLOATS = 4, 2
"""Per-row host values: (steps drawn, step of the first eos or -1, top-k or 0, noise key); (temperature, top-p)."""
DRAW, REDRAW = 0, 1
"""Counter-noise salts: the step's draw, and RAS's redraw."""


class FrameSampler:
    """Draws a step's codes for up to `max_rows` rows (see the module docstring)."""

    def __init__(
        self, *, groups: int, vocab: int, bos: int, eos: int, ras: tuple[int, int] | None,
        embed: Callable[[torch.Tensor], torch.Tensor], device: torch.device, graphs: bool, max_rows: int,
    ) -> None:  # fmt: skip
        self.groups, self.vocab, self.bos, self.eos, self.ras = groups, vocab, bos, eos, ras
        self.embed = embed
        self.device = device
        self.max_rows = max(1, max_rows)
        self.sizes = buckets(self.max_rows, 1)
        """Rows buckets, as the engine's slots bucket a decode batch (a graph each, per ranked width)."""
        rows, pin = self.max_rows, device.type == "cuda"
        self.logits = torch.zeros(rows, groups * vocab, device=device)
        self.ints = torch.zeros(rows, INTS, dtype=torch.int64, device=device)
        self.floats = torch.zeros(rows, FLOATS, device=device)
        self.window = None if ras is None else torch.full((rows, ras[0], groups), EMPTY, device=device)
        # staging for the host's values: pinned on CUDA, so the copies do not wait for the queued step.
        # Refilled only after the last draw's codes came back (the adapter's sync), so never mid-copy.
        self._ints = torch.zeros(rows, INTS, dtype=torch.int64, pin_memory=pin)
        self._floats = torch.zeros(rows, FLOATS, pin_memory=pin)
        self._window = None if ras is None else torch.full((rows, ras[0], groups), EMPTY, pin_memory=pin)
        self.graphs = DecodeGraphs(self._step, graphs, eager_first=False)
        vocab_index = torch.arange(groups * vocab, device=device).view(groups, vocab)
        self._index = vocab_index
        """Counter-noise element numbers: codebook k's rank r is k * vocab + r."""

    def width(self, sampled: list[tuple[float, int, float]]) -> int:
        """The ranked width for sampled rows' (temperature, top-k, top-p)."""
        if not sampled:
            return 1
        ks = [k if 0 < k < self.vocab else self.vocab for _, k, _ in sampled]
        return bucket_for(max(ks), buckets(self.vocab, 1))

    def draw(
        self, logits: torch.Tensor, ints: np.ndarray | None, floats: np.ndarray | None,
        windows: np.ndarray | None, width: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:  # fmt: skip
        """(codes [rows, groups] int64, frames [rows, hidden], the ranked width) on the device, for
        logits [rows, groups * vocab] and the rows' ints [rows, INTS], floats [rows, FLOATS] and RAS
        windows [rows, w, groups] (EMPTY-padded; None when RAS is off). ints and floats None: the
        rows' state is on the device already (`advance` after the last draw of the same rows,
        whose `width` is given)."""
        n = logits.shape[0]
        if n > self.max_rows:
            raise ValueError(f"higgs sampler: {n} rows, sized for {self.max_rows}")
        if ints is not None and floats is not None:
            if width is None:
                width = self.width([(float(t), int(r[2]), float(p)) for r, (t, p) in zip(ints, floats, strict=True) if t > 0])
            self._ints[:n].numpy()[:] = ints
            self._floats[:n].numpy()[:] = floats
            self.ints[:n].copy_(self._ints[:n], non_blocking=True)
            self.floats[:n].copy_(self._floats[:n], non_blocking=True)
            if self.window is not None and self._window is not None and windows is not None:
                self._window[:n].numpy()[:] = windows
                self.window[:n].copy_(self._window[:n], non_blocking=True)
        assert width is not None
        self.logits[:n].copy_(logits)
        codes, frames = self.graphs.run(bucket_for(n, self.sizes), width)
        return codes[:n].clone(), frames[:n].clone(), width

    def advance(self, codes: torch.Tensor) -> None:
        """On the device, each row's state after drawing `codes` [rows, groups] (the rows of the
        last draw, in order): one step further, its first eos noted, the RAS window moved on."""
        n = codes.shape[0]
        steps, first = self.ints[:n, 0], self.ints[:n, 1]
        starts = (first < 0) & (codes == self.eos).any(-1)
        self.ints[:n, 1] = torch.where(starts, steps, first)
        self.ints[:n, 0] += 1
        if self.window is not None:
            self.window[:n] = torch.cat([self.window[:n, 1:], codes[:, None]], dim=1)

    def warm(self, width: int) -> None:
        """Capture (on CUDA) every rows bucket's graph at `width`: at load, not under a request."""
        for rows in self.sizes:
            self.graphs.run(rows, width)

    def _step(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draw over the static buffers' first `rows` rows, ranking `width` codes a codebook."""
        groups, vocab = self.groups, self.vocab
        raw = self.logits[:rows].view(rows, groups, vocab)
        steps, first_eos, top_k, keys = self.ints[:rows].unbind(1)
        temperature, top_p = self.floats[:rows].unbind(1)
        forced = forced_codes(steps, first_eos, groups, self.bos, self.eos)
        masked = raw.masked_fill(~step_masks(forced, vocab, self.bos), float("-inf"))
        greedy = masked.argmax(-1)
        sampled = temperature > 0
        scaled = masked / torch.where(sampled, temperature, 1.0)[:, None, None]
        if width < vocab:
            ranked, order = torch.topk(scaled, width, dim=-1)
        else:
            ranked, order = torch.sort(scaled, dim=-1, descending=True)
        ranks = torch.arange(width, device=raw.device)
        limit = torch.where(top_k > 0, top_k, vocab)[:, None, None]
        ranked = ranked.masked_fill(ranks >= limit, float("-inf"))
        probs = torch.softmax(ranked, dim=-1)
        ranked = ranked.masked_fill(probs.cumsum(-1) - probs > top_p[:, None, None], float("-inf"))
        noise = counter_uniform(keys, steps, self._index[:, :width], DRAW)
        picked = torch.argmax(ranked + gumbel_of(noise), dim=-1)
        codes = torch.where(sampled[:, None], order.gather(-1, picked[..., None])[..., 0], greedy)
        if self.ras is not None:
            assert self.window is not None
            again = counter_uniform(keys, steps, self._index, REDRAW)
            codes = redraw_repeats(codes, raw, self.window[:rows], self.ras[1], self.bos, self.eos, again)
        return codes, self.embed(codes)


def row_values(state: Any, params: dict[str, Any], key: int) -> tuple[list[int], list[float]]:
    """One row's (ints, floats) for `FrameSampler.draw`: its DelayState `state`, sampling params and noise key."""
    first = -1 if state.eos_at is None else state.eos_at
    temperature = float(params.get("temperature", 0.0) or 0.0)
    ints = [state.step, first, int(params.get("top_k") or 0), key]
    return ints, [temperature, float(params.get("top_p") or 1.0)]
