"""Codec adapter for GenerationEngine: VibeVoice's acoustic decoder (latents at 7.5 Hz -> 24 kHz audio).

The decoder is causal (causal convolutions and transposed convolutions) and
streams: each request keeps its own convolution cache, and each window decodes only
its new latents after the previous window's (no left context to re-decode), which
gives the audio the whole utterance decoded at once gives. The weights are the
`model.audio_tower.*` part of the VibeVoice folder, in float32. Windows of one batch
are decoded one request at a time (their caches are per request).

Inputs: {"latents": float32 [n, latent]} (decoder-space latents from the LM stage).
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.qwen2_5_omni.loading import load_codec
from omni_actors.workers.engines.generation_adapter import GenerationAdapter


class _Stream:
    """One request's decoder cache and how many latents it has decoded."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.done = 0


class AcousticCodecAdapter(GenerationAdapter):
    sample_rate = 24000
    samples_per_code = 3200
    first_chunk_size = 1
    """One latent (133 ms of audio) in the first window."""
    chunk_size = 2
    left_context = 0
    right_context = 0
    max_chunk_size = 16

    def load(self) -> None:
        from transformers import VibeVoiceAcousticTokenizerModel

        self.model, config = load_codec(self.ctx, VibeVoiceAcousticTokenizerModel, "audio_config", "model.audio_tower")
        self.latent = config.hidden_size
        self.sample_rate = 24000
        self.samples_per_code = config.hop_length

    def start(self, inputs: dict[str, Any], params: dict[str, Any]) -> _Stream:
        return _Stream()

    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return self.frames_of(inputs, "latents", self.latent, torch.float32)

    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        out = []
        for window, start, stream in zip(windows, starts, data, strict=True):
            if start != stream.done:
                raise RuntimeError(
                    f"acoustic decoder: window at latent {start}, stream at {stream.done}"
                )
            audio = self.model.decode(
                window[None].to(self.ctx.device), padding_cache=stream.cache, use_cache=True
            )
            stream.cache, stream.done = audio.padding_cache, start + window.shape[0]
            out.append(audio.audio.reshape(-1).float())
        return out
