"""Repetition-aware sampling (RAS) of Higgs-Audio-V2: a code drawn too often lately is drawn again, plainly.

As transformers' Higgs generation does when the generation config sets `ras_win_len` and
`ras_win_max_num_repeat` (Boson AI's examples use 7 and 2): after a step's codes are drawn,
codebook k's code is compared with codebook k in the last `ras_win_len` audio steps (the
prompt's clip block included; stream bos/eos never count); if it repeats there at least
`ras_win_max_num_repeat` times it is replaced by a draw from the softmax of the step's raw
logits (no delay mask, temperature or top-k/top-p). Draws use the request's generator.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch


def ras_settings(generation_config: Any) -> tuple[int, int] | None:
    """(window, max repeats) from a generation config, or None when RAS is off."""
    win = getattr(generation_config, "ras_win_len", None)
    most = getattr(generation_config, "ras_win_max_num_repeat", None)
    if win is None or most is None or int(win) <= 0:
        return None
    return int(win), int(most)


def resample_repeats(
    codes: np.ndarray, raw: torch.Tensor, windows: list[deque], most: int, bos: int, eos: int,
    generators: list[torch.Generator | None],
) -> np.ndarray:  # fmt: skip
    """codes [n, groups] with repeated codes redrawn from raw [n, groups, vocab] logits (row i: windows[i])."""
    out = codes.copy()
    for i, window in enumerate(windows):
        if not window:
            continue
        past = np.stack(window)  # [w, groups]
        counted = (past == codes[i]) & (past != bos) & (past != eos)
        for k in np.flatnonzero(counted.sum(0) >= most):
            probs = torch.softmax(raw[i, k].float(), dim=-1)
            gen = generators[i]
            if gen is not None and gen.device.type != probs.device.type:
                probs = probs.cpu()
            out[i, k] = int(torch.multinomial(probs, 1, generator=gen))
    return out
