"""Repetition-aware sampling (RAS) of Higgs-Audio-V2: a code drawn too often lately is drawn again, plainly.

As transformers' Higgs generation does when the generation config sets `ras_win_len` and
`ras_win_max_num_repeat` (Boson AI's examples use 7 and 2): after a step's codes are drawn,
codebook k's code is compared with codebook k in the last `ras_win_len` audio steps (the
prompt's clip block included; stream bos/eos never count); if it repeats there at least
`ras_win_max_num_repeat` times it is replaced by a draw from the softmax of the step's raw
logits (no delay mask, temperature or top-k/top-p). On the device, for every row at once
(inside the frame sampler's graph): the redraw is computed for every code and kept where
the code repeats; its noise is the request's own (counter_noise.py).
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_sampling import gumbel_of

EMPTY = -1
"""A window position no step has filled yet (equal to no code)."""


def ras_settings(generation_config: Any) -> tuple[int, int] | None:
    """(window, max repeats) from a generation config, or None when RAS is off."""
    win = getattr(generation_config, "ras_win_len", None)
    most = getattr(generation_config, "ras_win_max_num_repeat", None)
    if win is None or most is None or int(win) <= 0:
        return None
    return int(win), int(most)


def redraw_repeats(
    codes: torch.Tensor, raw: torch.Tensor, window: torch.Tensor, most: int, bos: int, eos: int,
    uniform: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """codes [rows, groups] with each code repeated `most` times or more in its codebook of `window`
    [rows, w, groups] (EMPTY where unfilled) redrawn from raw [rows, groups, vocab] logits, by
    Gumbel-max over `uniform` [rows, groups, vocab]."""
    counted = (window == codes[:, None]) & (window != bos) & (window != eos)
    repeated = counted.sum(1) >= most
    redrawn = torch.argmax(raw.float() + gumbel_of(uniform), dim=-1)
    return torch.where(repeated, redrawn, codes)
