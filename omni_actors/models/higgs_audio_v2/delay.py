"""Higgs-Audio-V2's delay pattern: which codes a step may draw, and which audio frame each step completes.

The LM draws one code per codebook each step, codebook k delayed by k steps, as
transformers' `HiggsAudioV2DelayPatternLogitsProcessor` and the processor's
`revert_delay_pattern` define it (prompt ending in `<|audio_out_bos|>`):

- bos ramp: at step t, codebook k is forced to the stream bos code while t <= k (step 0 is
  all bos). Past its ramp a codebook never draws bos (it is no audio: transformers would
  only clip it away).
- frames: frame f takes codebook k from step f + 1 + k, so it is complete at step f + N
  (N codebooks) and leaves then; the first frame leaves at step N.
- the end: once any codebook draws the stream eos (step s), codebook k is forced to eos
  from step s + 1 + k on; the first step that is all eos ends the request and is no frame.
  Codes past the codec's range in a frame (an eos that came early in a low codebook of the
  last frames) are clipped to the last code, as the processor's decode does.

`DelayState` is one request's place in that grid (host side, a few ints a step);
`forced_codes` gives a batch's forced codes from each row's step and first eos on the
device (inside the frame sampler's graph), `step_masks` the keep mask they make.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

FREE = -1


@dataclass
class DelayState:
    groups: int
    bos: int
    eos: int
    step: int = 0
    """Steps drawn so far."""
    eos_at: int | None = None
    """The step at which some codebook first drew eos."""
    recent: deque = field(default_factory=deque)
    """The last `groups` steps' codes."""

    def push(self, codes: np.ndarray) -> tuple[np.ndarray | None, bool]:
        """Record one step's [groups] codes: (the frame it completes or None, whether the request ended)."""
        codes = np.asarray(codes, dtype=np.int64).reshape(self.groups)
        t = self.step
        self.step += 1
        if (codes == self.eos).all():
            return None, True
        if self.eos_at is None and (codes == self.eos).any():
            self.eos_at = t
        self.recent.append(codes)
        if len(self.recent) > self.groups:
            self.recent.popleft()
        if t < self.groups:
            return None, False
        frame = np.array([self.recent[k][k] for k in range(self.groups)], dtype=np.int64)
        return np.minimum(frame, self.bos - 1), False


def forced_codes(steps: torch.Tensor, eos_at: torch.Tensor, groups: int, bos: int, eos: int) -> torch.Tensor:
    """[rows, groups] int64: the code each codebook must draw at a row's next step, FREE where it
    may choose. steps: int64 [rows] steps drawn so far; eos_at: int64 [rows] the step of the first
    eos drawn, -1 where none was."""
    k = torch.arange(groups, device=steps.device)[None]
    step, first = steps[:, None], eos_at[:, None]
    ending = (first >= 0) & (step - first > k)
    out = torch.where(ending, torch.full_like(step, eos), torch.full_like(step, FREE))
    return torch.where(step <= k, torch.full_like(step, bos), out)


def step_masks(forced: torch.Tensor, vocab: int, bos: int) -> torch.Tensor:
    """[rows, groups, vocab] bool, True where a code may be drawn: the forced code alone, or any
    code but bos where the codebook is FREE."""
    ids = torch.arange(vocab, device=forced.device)
    return torch.where(forced[..., None] == FREE, ids != bos, ids == forced[..., None])
