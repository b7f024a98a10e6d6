"""Token2Wav windows under CUDA graphs: the 36 DiT evaluations and BigVGAN of a window as one replay.

Eagerly, a window's decode is ~20k small kernels launched one by one from Python
(10 RK4 time points, 4 evaluations each, 22 DiT layers, then the vocoder's
anti-aliased activations): on a GPU the launches, not the arithmetic, are its
cost. Here a window of (batch, codes) is captured once into a CUDA graph
(hf_ar_graphs.DecodeGraphs: shared pool, eager fallback if a capture fails)
whose inputs are two static buffers: the starting noise and the conditioning
operand (`dit_conditioning`, computed eagerly per window: the speaker encoder is
not capturable and its cost is small). A replay refills them and returns the
mel and the waveform of the whole window; the caller keeps the samples it sends.

Shapes: batches are padded up to a power of two by repeating the first row (rows
are independent), so a graph serves several batch sizes. A new (batch, codes)
shape is captured and replayed at once: recording a capture costs about what an
eager decode costs (both are the Python side of ~20k launches), so even a
one-off length, such as the rest of an utterance, loses nothing by it. The
process's first shape runs eagerly before its capture (lazy CUDA/cuBLAS set-up).
The adapter captures the standard window lengths at load. Windows longer than
`max_codes`, and shapes past `max_graphs`, run eagerly.

The arithmetic is transformers' (RungeKutta4ODESolver's steps, BigVGAN's
forward) written without its host syncs (the solver's interpolation checks, the
vocoder's `.cpu()` and its per-call host tensor), so a replay is the same
computation as an eager decode of the window (tests: equal on CPU).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn

from omni_actors import logs
from omni_actors.models.qwen2_5_omni.fast_token2wav import DiTVelocity, dit_conditioning
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs

log = logs.get(__name__)

MAX_GRAPH_CODES = 192
"""Longest window (in codes) that gets a graph by default; the adapter passes its policy's longest
streaming window (left context + FINAL_WINDOW_SLACK x max_chunk_size + right context: 24 + 144 + 12)."""
MAX_GRAPHS = 128
"""Most captured shapes; later new shapes run eagerly."""


def integrate_rk4(function: Any, x0: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """RungeKutta4ODESolver(function, x0).integrate(times)[-1], without host syncs."""
    one_third, two_thirds = 1 / 3, 2 / 3
    x = x0
    for i in range(times.shape[0] - 1):
        t0, t1 = times[i], times[i + 1]
        dt = t1 - t0
        k1 = function(t0, x)
        k2 = function(t0 + dt * one_third, x + dt * k1 * one_third)
        k3 = function(t0 + dt * two_thirds, x + dt * (k2 - k1 * one_third))
        k4 = function(t1, x + dt * (k1 - k2 + k3))
        x = x + (k1 + 3 * (k2 + k3) + k4) * dt / 8
    return x


class Vocoder:
    """Qwen2_5OmniToken2WavBigVGANModel.forward for mel [batch, frames, mel_dim] -> [batch, samples],
    on the device (the model's own forward ends in `.cpu()` and makes a host tensor per call)."""

    def __init__(self, bigvgan: nn.Module) -> None:
        self.model = bigvgan
        param = next(bigvgan.parameters())
        level = torch.tensor(-115 / 20.0 * math.log(10), device=param.device, dtype=param.dtype)
        self.min_level = torch.exp(level)

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        m = self.model
        amplitude = torch.exp(mel.permute(0, 2, 1))
        decibel = 20 * torch.log10(torch.clamp(amplitude, min=self.min_level)) - 20
        h = m.conv_pre(m.normalize_spectrogram(decibel, 1, -115))
        per = m.num_residual_blocks
        for i in range(m.num_upsample_layers):
            h = m.ups[i][0](h)
            h = sum(m.resblocks[i * per + j](h) for j in range(per)) / per
        wav = m.conv_post(m.activation_post(h))
        return torch.clamp(wav, min=-1.0, max=1.0).reshape(wav.shape[0], -1)


def padded_batch(batch: int) -> int:
    return 1 << max(0, batch - 1).bit_length()


class _Slot:
    """One captured shape's static inputs and its velocity (rotary tables, masks)."""

    def __init__(
        self, dit: nn.Module, x0: torch.Tensor, static: torch.Tensor, scale: float
    ) -> None:
        self.x0 = x0.clone()
        self.velocity = DiTVelocity(dit, static.clone(), scale)


class WindowGraphs:
    """Decodes code windows [batch, codes] to (mel [batch, frames, mel_dim], wav [batch, samples])."""

    def __init__(
        self,
        dit: nn.Module,
        bigvgan: nn.Module,
        times: torch.Tensor,
        guidance_scale: float,
        enabled: bool,
        max_codes: int = MAX_GRAPH_CODES,
        max_graphs: int = MAX_GRAPHS,
        autocast: Any = contextlib.nullcontext,
    ) -> None:
        """`autocast()`: the context the DiT runs in (captured with it), e.g. bfloat16 autocast."""
        self.dit, self.times, self.scale = dit, times, guidance_scale
        self.autocast = autocast
        self.vocoder = Vocoder(bigvgan)
        self.max_codes, self.max_graphs = max_codes, max_graphs
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.graphs = DecodeGraphs(self._replayable, enabled, eager_first=False)

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    def _replayable(self, batch: int, codes: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.slots[(batch, codes)]
        return self._decode(slot.velocity, slot.x0)

    def _decode(self, velocity: DiTVelocity, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            mel = integrate_rk4(velocity, x0, self.times).float()
        return mel, self.vocoder(mel)

    def run(
        self,
        codes: torch.Tensor,
        cond: torch.Tensor,
        ref: torch.Tensor,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """codes [B, n], cond [B, frames, dim], ref [B, ref_frames, mel_dim], noise [B, frames, mel_dim]."""
        batch, length = codes.shape
        padded = padded_batch(batch)
        if padded != batch:
            codes, cond, ref, noise = (_pad_rows(t, padded) for t in (codes, cond, ref, noise))
        with self.autocast():
            static = dit_conditioning(self.dit, codes, cond, ref)
        key = (padded, length)
        slot = self.slots.get(key) if self.enabled else None
        if slot is None and self.enabled and self._wants_graph(key):
            slot = self.slots[key] = _Slot(self.dit, noise, static, self.scale)
        if slot is None:
            mel, wav = self._decode(DiTVelocity(self.dit, static, self.scale), noise)
        else:
            slot.x0.copy_(noise)
            slot.velocity.static.copy_(static)
            mel, wav = self.graphs.run(*key)
            if not self.enabled:  # the capture failed: nothing replays any more
                self.slots.clear()
            mel, wav = mel.clone(), wav.clone()  # the next replay overwrites the graph's outputs
        return mel[:batch], wav[:batch]

    def _wants_graph(self, key: tuple[int, int]) -> bool:
        return key[1] <= self.max_codes and len(self.slots) < self.max_graphs


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t[:1].expand(rows - t.shape[0], *t.shape[1:])])
