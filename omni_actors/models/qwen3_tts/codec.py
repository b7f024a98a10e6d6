"""Codec adapter for GenerationEngine: Qwen3-TTS's 12 Hz codec decoder (codes -> 24 kHz audio).

The decoder is causal (causal convolutions, a sliding-window causal
transformer), so left context alone joins windows up: a window re-decodes
`left_context` frames before its new ones (25, as the original's chunked
decode). Its output for n frames is a fixed number of samples short of
n * 1920 (the transposed convolutions trim their tail), which the engine's
sample counting absorbs; the last window is padded with silence to whole frames
(n * 1920 samples, the length the original reports). Weights: `speech_tokenizer/` `decoder.*`, float32
(codec_model.py).

Inputs: {"codes": int [n, num_quantizers]} (talker frames); a cloned voice's
first payload also has "context_codes" (the reference clip's codes, which the
talker continued): the decoder runs over them as left context and their audio
is not sent, as the original decodes clip + new codes and cuts the clip's part off.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.qwen3_tts.codec_model import load_codec
from omni_actors.workers.engines.generation_adapter import FrameCodecAdapter
from omni_actors.workers.engines.hf_ar_adapter import check_checkpoint


class Qwen3TTSCodecAdapter(FrameCodecAdapter):
    sample_rate = 24000
    chunk_size = 2
    first_chunk_size = 1
    """Windows of 1, 2, 4, ... 100 new frames when graphed, 5 then 25, 50, 100 eager: as
    Qwen3-Omni's code2wav (the same 12.5 Hz codec; see there)."""
    eager_windows = {"first_chunk_size": 5, "chunk_size": 25}
    max_chunk_size = 100
    left_context = 25
    right_context = 0

    def load(self) -> None:
        path = check_checkpoint(
            self.ctx.model_path, ("config.json", "speech_tokenizer/config.json")
        )
        self.model, _, config = load_codec(path, self.ctx.device)
        self.groups = self.model.groups
        self.sample_rate = int(config.get("output_sample_rate", 24000))
        self.samples_per_code = self.model.total_upsample
        self.graphs = self.causal_graphs(lambda c: self.model(c).reshape(c.shape[0], -1))

    def context_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return self.frames_of(inputs, "context_codes", self.groups)

    @torch.inference_mode()
    def decode_part(self, windows, starts, data, keep):
        """Only a final window (kept to its end) is padded: a streamed one's short tail is decoded
        again by the next window, so padding it would send silence in the middle of the audio."""
        out = []
        wavs = self.decode(windows, starts, data)
        for window, wav, (_, hi) in zip(windows, wavs, keep, strict=True):
            full = window.shape[0] * self.samples_per_code if hi is None else 0
            out.append((torch.nn.functional.pad(wav, (0, max(0, full - wav.shape[-1]))), 0))
        return out
