"""Codec adapter for GenerationEngine: Dia's DAC decoder (9 codebooks at ~86 Hz -> 44.1 kHz audio).

DAC's decoder is not causal (centred convolutions), so a window re-decodes
`left_context` frames before its new ones and holds back the audio of its last
`right_context` frames until the frames after them arrive (or the input ends). A frame's
audio depends on the codes of up to 9 frames after it (measured on the 44 kHz DAC's
layout, strides 2-4-8-8 and a 1536-wide decoder, random weights: decoded with 9 frames
after, a frame's audio equals one whole decode to float rounding; with 8 it is off by
~4e-4 of the peak at every window's end), so right_context is 9 and streamed
audio is the whole decode's; left_context (16) covers the 9 frames before. The weights
are the DAC folder Dia's processor names (loading.py), decoded in float32.

Warm-up (engine_extras["warmup"], default on CUDA): one first-sized window decoded at
load, logged as "dia.codec_warmed_up".

Inputs: {"codes": int [n, 9]} (undelayed frames from the decoder stage).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from omni_actors import logs
from omni_actors.models.dia.loading import load_dac
from omni_actors.workers.engines.generation_adapter import ChunkPolicy, FrameCodecAdapter
from omni_actors.workers.engines.hf_ar_adapter import check_checkpoint

log = logs.get(__name__)


class DacCodecAdapter(FrameCodecAdapter):
    sample_rate = 44100
    samples_per_code = 512
    first_chunk_size = 4
    """4 frames = 46 ms of audio in the first window, decoded once 4 + right_context = 13
    frames are in (it was 8 + 8 = 16). The second window (chunk_size more frames) must come
    before the first one's audio has played: 8 frames at the decoder's slowest measured
    step (5.4 ms at 16 requests, H200) take 43 ms; windows then double (chunk_growth), each
    shorter to wait for than the audio already sent."""
    chunk_size = 8
    left_context = 16
    right_context = 9
    max_chunk_size = 128

    def load(self) -> None:
        path = check_checkpoint(self.ctx.model_path, ("config.json",))
        self.model = load_dac(path, self.ctx.device)
        cfg = self.model.config
        self.groups = cfg.n_codebooks
        self.sample_rate = int(cfg.sampling_rate)
        self.samples_per_code = int(np.prod(cfg.downsampling_ratios))
        extras = self.ctx.engine_extras
        if extras.get("warmup", self.ctx.device == "cuda"):
            # one first window now (CUDA kernels, cuDNN plans), not in a first request's audio
            started = time.monotonic()
            n = ChunkPolicy.of(self, extras).first_window
            self.decode([torch.zeros(n, self.groups, dtype=torch.long)], [0], [None])
            log.info(
                "dia.codec_warmed_up", frames=n, ms=round((time.monotonic() - started) * 1000, 1)
            )

    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        codes = self.device_codes(windows)
        with torch.inference_mode():
            audio = self.model.decode(audio_codes=codes).audio_values
        return list(audio.reshape(len(windows), -1).float())
