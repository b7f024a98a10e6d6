"""Bucketed prompt forwards for HfAREngine, replayed as CUDA graphs (engine_extras["prefill_graphs"]).

A prompt's forward through transformers' layers is dozens of small launches a layer at
~20 us of host time each: on an H200 a 60-position Higgs-Audio-V2 (3B-sized) prompt was
~1,300 launches, 33 ms of host time for 5.5 ms of kernels, and every arrival's prefill
stalls every running stream. For an adapter whose prompt forward makes no host sync and
takes a prepared 4D mask (`ARAdapter.graph_prefill`: the one `extra` under which its
forward may be captured), a batch of prompts is left-padded to a (batch, length) bucket
(powers of two as the slots bucket a decode batch, `hf_ar_slots.buckets`; lengths from MIN_LENGTH) and run through static buffers: the causal mask
over each row's real positions and the rotary positions are made inside the forward from
each row's first real position, and the keys and values land in per-layer tensors
(`CapturedKV`, no cache bookkeeping) that the engine stores into the slots as for an eager
prefill. On CUDA each bucket is run eagerly once and then captured
(hf_ar_graphs.DecodeGraphs); later prompts of that bucket replay it. Buckets past
MAX_POSITIONS (batch x length) run the eager path: each captured bucket keeps its own
keys and values (28 layers of a 3B model: ~114 KB a position).

A padded query row (before a row's first real position) may attend to itself only, so no
row of the mask is empty (an empty row makes NaN, which would reach real positions
through the next layer's values); real positions see exactly their prompt.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_adapter import ARAdapter, ForwardOut
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs
from omni_actors.workers.engines.hf_ar_sampling import small_tensor
from omni_actors.workers.engines.hf_ar_slots import bucket_for, buckets

MIN_LENGTH = 16
"""The shortest length bucket."""
MAX_POSITIONS = 2048
"""Largest bucket (batch x length) run through the buffers; longer batches run eagerly."""
WARM_BUCKETS = ((1, 64), (1, 128), (2, 64), (4, 64), (8, 64), (16, 64))
"""Buckets captured at load (a plain TTS prompt is ~40-100 positions)."""


class CapturedKV:
    """The cache a bucketed prompt forward writes: each layer's keys and values as its attention
    made them (a prompt starts from nothing, so `update` only keeps them)."""

    def __init__(self) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Each layer's (keys, values)."""

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        assert layer_idx == len(self.layers), "prompt layers run in order"
        self.layers.append((keys, values))
        return keys, values


class PrefillBuckets:
    """Runs an adapter's prompt forward over bucketed static buffers (see the module docstring)."""

    def __init__(self, adapter: ARAdapter, device: torch.device, hidden: int, dtype: torch.dtype,
                 max_batch: int, graphs: bool) -> None:  # fmt: skip
        self.adapter, self.device, self.hidden, self.dtype = adapter, device, hidden, dtype
        self.batches = buckets(max(1, max_batch), 1)
        self.lengths = buckets(MAX_POSITIONS, MIN_LENGTH)
        self.extra = dict(adapter.graph_prefill or {})
        self.graphs = DecodeGraphs(self._forward, graphs)
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def bucket(self, batch: int, longest: int) -> tuple[int, int] | None:
        """The (batch, length) bucket for `batch` prompts of at most `longest` positions, or None."""
        if batch > self.batches[-1] or longest > self.lengths[-1]:
            return None
        shape = (bucket_for(batch, self.batches), bucket_for(longest, self.lengths))
        return shape if shape[0] * shape[1] <= MAX_POSITIONS else None

    def run(self, shape: tuple[int, int], rows: list[torch.Tensor]) -> tuple[ForwardOut, list[Any]]:
        """The forward of prompts `rows` ([n_i, hidden] embeddings) left-padded to `shape`:
        (its output, its rows first; each layer's keys and values [batch, heads, length, dim])."""
        embeds, starts = self.buffers(shape)
        embeds.zero_()
        length = shape[1]
        first = []
        for row, x in enumerate(rows):
            embeds[row, length - x.shape[0] :] = x.to(embeds.dtype)
            first.append(length - x.shape[0])
        first += [length - 1] * (shape[0] - len(rows))  # rows past the prompts: one position each
        starts.copy_(small_tensor(first, self.device, torch.long))
        return self.graphs.run(*shape)

    def buffers(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's static inputs: embeddings [batch, length, hidden], first real positions [batch]."""
        if shape not in self._buffers:
            embeds = torch.zeros(*shape, self.hidden, dtype=self.dtype, device=self.device)
            self._buffers[shape] = (embeds, torch.zeros(shape[0], dtype=torch.long, device=self.device))
        return self._buffers[shape]

    def warm(self) -> None:
        """Capture the common buckets now (on zeros: a prompt forward has no side effect)."""
        for shape in WARM_BUCKETS:
            if self.bucket(*shape) == shape:
                self.graphs.run(*shape)

    def _forward(self, batch: int, length: int) -> tuple[ForwardOut, list[Any]]:
        embeds, starts = self.buffers((batch, length))
        at = torch.arange(length, device=self.device)
        real = at[None] >= starts[:, None]  # [batch, length]
        positions = (at[None] - starts[:, None]).clamp(min=0)
        causal = at[None, :] <= at[:, None]  # [query, key]
        allowed = (causal[None] & real[:, None, :]) | torch.eye(length, dtype=torch.bool, device=self.device)[None]
        axes = self.adapter.position_axes
        cache = CapturedKV()
        out = self.adapter.forward(embeds, positions[None].expand(axes, batch, length), allowed[:, None], cache,
                                   self.extra)  # fmt: skip
        return out, cache.layers
