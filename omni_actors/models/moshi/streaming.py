"""Per-slot streaming state for batched frame steps: ring KV caches, conv padding, transposed-conv tails.

A duplex engine steps every session of a worker as one batch of fixed size (one
row per slot, free slots included), so each row's math is the same whatever the
other rows hold: a session's output does not depend on who else is live.
Sessions start at different times, so every row has its own position:

- `RingKV` is a transformers `Cache` stand-in for one transformer: per slot a
  ring of `window + extra` keys/values per layer, written at the row's own
  absolute positions, plus the additive mask (a key is seen by a query at
  absolute position a when a - window < its position <= a) and the position ids
  (RoPE at absolute positions, so the ring's order does not matter).
- `SlotPaddingCache` keeps what transformers' `MimiConv1dPaddingCache` keeps, for a
  fixed batch whose rows can be reset one at a time ("replicate" layers start from
  the row's first sample, as the non-streaming convolution pads).

Every buffer here is allocated once and written in place, and no method reads a
tensor's value on the host: a frame step over them can be captured as a CUDA graph
(frame.py) and replayed over the same memory.
- `TransposedTail` streams a causal transposed convolution by overlap-add.
"""

from __future__ import annotations

import torch


class RingKV:
    """Keys and values of one transformer for `slots` rows, each at its own position."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int, window: int, extra: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.window = window
        self.capacity = window + extra
        shape = (slots, kv_heads, self.capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.held = torch.full((slots, self.capacity), -1, dtype=torch.long, device=device)
        """Absolute position of the token in each ring cell; -1: empty."""
        self.length = torch.zeros(slots, dtype=torch.long, device=device)
        self._index: torch.Tensor | None = None
        self.dtype = dtype

    def reset(self, slot: int) -> None:
        self.length[slot] = 0
        self.held[slot] = -1
        for t in (*self.k, *self.v):
            t[slot].zero_()

    def begin(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Claim ring cells for `tokens` new tokens per row; (position ids [S,T], additive mask [S,1,T,C])."""
        if tokens > self.capacity - self.window:
            raise ValueError(f"a step of {tokens} tokens needs more than {self.capacity - self.window} spare cells")
        steps = torch.arange(tokens, device=self.length.device)
        positions = self.length[:, None] + steps[None, :]  # [S, T]
        cells = positions % self.capacity
        self.held.scatter_(1, cells, positions)
        self._index = cells
        held = self.held[:, None, :]  # [S, 1, C]
        q = positions[:, :, None]  # [S, T, 1]
        seen = (held >= 0) & (held <= q) & (held > q - self.window)
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device)
        mask.masked_fill_(~seen, torch.finfo(self.dtype).min)
        return positions, mask[:, None]

    def finish(self, tokens: int) -> None:
        self.length += tokens
        self._index = None

    # the part of transformers' Cache interface the attention layers call
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        assert self._index is not None, "RingKV.begin() before the layers run"
        idx = self._index[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
        self.k[layer_idx].scatter_(2, idx, key.to(self.dtype))
        self.v[layer_idx].scatter_(2, idx, value.to(self.dtype))
        return self.k[layer_idx], self.v[layer_idx]


class SlotPaddingCache:
    """Left context of a list of causal convolutions for a fixed batch of rows, each resettable on its own.

    What transformers' `MimiConv1dPaddingCache` keeps, in buffers written in place (a CUDA graph reads
    and writes the same memory every replay) and without host syncs: a fresh row's "replicate" context
    is its first sample, chosen per row with `torch.where`.
    """

    def __init__(self, convs: list, slots: int, dtype: torch.dtype, device: torch.device | str) -> None:
        pads = [int(c.padding_total) for c in convs]  # a buffer tensor in transformers: plain ints are faster
        self.replicate = [c.pad_mode == "replicate" for c in convs]
        for c in convs:
            if c.pad_mode not in ("replicate", "constant"):
                raise NotImplementedError(f"padding mode {c.pad_mode} not supported")
        self.padding_cache = [torch.zeros(slots, c.in_channels, pad, dtype=dtype, device=device)
                              for c, pad in zip(convs, pads, strict=True)]
        self.fresh = torch.ones(slots, dtype=torch.bool, device=device)

    def reset(self, slot: int) -> None:
        for t in self.padding_cache:
            t[slot].zero_()
        self.fresh[slot] = True

    def pad(self, x: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """`x` [S, C, T] with its left context before it; keeps the last samples for the next frame."""
        cache = self.padding_cache[layer_idx]
        left = cache
        if self.replicate[layer_idx]:
            left = torch.where(self.fresh[:, None, None], x[:, :, :1].expand_as(cache), cache)
        padded = torch.cat([left, x], dim=2)
        if cache.shape[-1]:
            cache.copy_(padded[:, :, -cache.shape[-1]:])
        return padded

    def finish(self) -> None:
        self.fresh.zero_()


class TransposedTail:
    """Streams a causal (trim_right_ratio 1) transposed convolution: per frame T*stride samples out."""

    def __init__(self, layer, slots: int, dtype: torch.dtype, device: torch.device | str) -> None:
        conv = layer.conv
        if layer.padding_left != 0:
            raise ValueError("streaming needs a causal transposed convolution with trim_right_ratio 1.0")
        self.conv = conv
        self.stride = conv.stride[0]
        self.overlap = conv.kernel_size[0] - self.stride
        self.tail = torch.zeros(slots, conv.out_channels, self.overlap, dtype=dtype, device=device)

    def reset(self, slot: int) -> None:
        self.tail[slot].zero_()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        n = x.shape[-1] * self.stride
        if self.overlap:
            y = torch.cat([y[..., :self.overlap] + self.tail, y[..., self.overlap:]], dim=-1)
            rest = y[..., n:]
            if self.conv.bias is not None:  # the next frame adds the bias to these samples again
                rest = rest - self.conv.bias[None, :, None]
            self.tail.copy_(rest)
        return y[..., :n]


class StepKV:
    """A transformers `Cache` stand-in for a short fixed sequence run one token at a time (Moshi's depth
    decoder: one position per codebook, every frame from position 0): static buffers [S, kv_heads,
    positions, head_dim] per layer, position `pos` (a Python int, set before each pass) written in place.
    A pass sees positions up to its own (the last `window` of them), as transformers' DynamicCache
    (sliding-window layers) gives it; nothing later, so no mask is needed and no buffer is reallocated."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int, positions: int, window: int | None,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (slots, kv_heads, positions, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.window = window
        self.pos = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.pos

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        p = self.pos
        k, v = self.k[layer_idx], self.v[layer_idx]
        k[:, :, p : p + 1].copy_(key)
        v[:, :, p : p + 1].copy_(value)
        lo = max(0, p + 1 - self.window) if self.window else 0
        return k[:, :, lo : p + 1], v[:, :, lo : p + 1]
