"""Codec adapter for GenerationEngine: CSM's Mimi decoder (codes at 12.5 Hz -> 24 kHz audio).

Mimi's decoder is causal (causal convolutions, a causal sliding-window
transformer), so left context alone joins windows up: a window re-decodes
`left_context` frames before its new ones. Windows are the engine's (small
first, then growing). The weights are the `codec_model.*` part of the CSM
folder, loaded alone in float32. On CUDA a decode is a graph replay (codec_graphs.py): eager,
its ~2,500 host dispatches took ~40 ms a window on an H200, first windows included.

Inputs: {"codes": int [n, num_codebooks]} (backbone frames).
"""

from __future__ import annotations

from omni_actors.models.mimi import conv_shapes_on_host
from omni_actors.models.qwen2_5_omni.loading import load_codec
from omni_actors.workers.engines.generation_adapter import FrameCodecAdapter


class MimiCodecAdapter(FrameCodecAdapter):
    sample_rate = 24000
    chunk_size = 2
    first_chunk_size = 1
    """One frame (80 ms of audio) first, then windows doubling from 2 to max_chunk_size. With the
    decode graphed (a replay: ~4 ms), CSM-1B-sized on an H200 (2026-12-02): first audio 40 ms at 1
    request against 62 with 3 then 10; at 10 requests a second p50 / p95 55 / 283 ms against
    100 / 428; at 16 the same p50. Eager (the CPU), `eager_windows`."""
    eager_windows = {"first_chunk_size": 3, "chunk_size": 10}
    """Eager, each extra window is a whole decode (~35 ms of host dispatch on an H200): one frame
    first cost 3x the first audio at 16 streams."""
    left_context = 25
    right_context = 0
    max_chunk_size = 50

    def load(self) -> None:
        from transformers import MimiModel

        self.model, config = load_codec(self.ctx, MimiModel, "codec_config", "codec_model")
        conv_shapes_on_host(self.model)
        self.groups = config.num_quantizers
        self.sample_rate = int(config.sampling_rate)
        self.samples_per_code = round(config.sampling_rate / config.frame_rate)
        self.graphs = self.causal_graphs(
            lambda c: self.model.decode(c).audio_values.reshape(c.shape[0], -1)
        )
