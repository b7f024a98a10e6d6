"""Counter-based uniform noise: a request's draws as a pure function of (its key, its step).

A seeded request drawn from its own `torch.Generator` costs one `torch.rand` call a
request a step (a kernel launch and host work each: at 16 streams the noise alone
was ~0.5 ms of a Higgs-Audio-V2 step), and such a call cannot sit in a CUDA graph
replayed for whatever rows a step holds. Here every row's noise comes from integer
hashes of (the row's 32-bit key, its step counter, the element's index), computed for
all rows by the same few element-wise kernels: a row's values depend on nothing else,
so a seeded request draws the same alone or batched, on any batch size or graph, and
an unseeded one takes a random key once.

The hash is "lowbias32" (C. Wellons' integer hash: xor-shifts and two multiplies mod
2^32), kept in int64 with multipliers under 2^31 so no product overflows; two rounds
per element. The top 24 bits make a float32 strictly inside (0, 1).
"""

from __future__ import annotations

import secrets

import torch

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x68E31DA5
"""lowbias32's first multiplier and an odd one under 2^31 in place of its second (no int64 overflow)."""
_GOLDEN = 0x1E3779B9
"""Spreads a salt (which draw of a step: codebooks, a redraw) over the key."""


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2^32), element-wise."""
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def _mix_int(x: int) -> int:
    """`mix32` of one host int."""
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def noise_key(seed: int | None) -> int:
    """A request's 32-bit key: from its seed (any int: all its bits count), or random when it has none."""
    if seed is None:
        return secrets.randbits(32)
    x, key = int(seed) & ((1 << 64) - 1), 0
    for part in (x & MASK32, x >> 32):
        key = _mix_int(key ^ part)
    return key


def counter_uniform(keys: torch.Tensor, counters: torch.Tensor, index: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """[rows, *index.shape] float32 uniforms in (0, 1): element (i, j) a function of (keys[i],
    counters[i], index[j], salt) alone.

    keys: int64 [rows] in [0, 2^32); counters: int64 [rows] (>= 0; a request's step); index: int64
    element numbers in [0, 2^32) (the draw's place in the row: a caller that needs part of a row
    passes that part's numbers, and gets the values the whole row would have there); salt: which
    draw of the step (a step that draws twice gives each its own)."""
    base = mix32(keys ^ ((salt * _GOLDEN) & MASK32))
    base = mix32(base ^ (counters & MASK32)).view(-1, *([1] * index.dim()))
    bits = mix32(mix32(base ^ index[None]) ^ (base >> 7))
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
