"""Code2wav adapter for GenerationEngine: Qwen3-Omni-MoE's causal codec decoder.

The decoder is causal (sliding-window transformer, causal convolutions), so
left context alone makes chunked decoding match a whole-utterance decode; its
output for n codes is a fixed number of samples short of n * 1920 (the
transposed convolutions trim their tail), which the engine's sample counting
absorbs. Decoding runs in float32, on CUDA as graph replays of padded windows (codec_graphs.py).

Inputs: {"codes": int [n, num_quantizers]} (talker frames).
"""

from __future__ import annotations

from omni_actors.models.qwen2_5_omni.loading import load_codec
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.generation_adapter import FrameCodecAdapter


class Qwen3OmniMoeCode2WavAdapter(FrameCodecAdapter):
    sample_rate = 24000
    chunk_size = 2
    first_chunk_size = 1
    """With graphed decodes (CUDA): first audio after one talker frame (80 ms of audio); later
    windows double from chunk_size (2, 4, 8, ... 100 new codes), each in before the audio sent so
    far runs out while a talker frame takes under 40 ms (first audio at full depth on an H200:
    330 ms against 368 with the eager windows below). The old windows (5, then 25, 50, 100) came
    four talker frames later, and at 25 ms a frame the second one after the first 400 ms had played."""
    eager_windows = {"first_chunk_size": 5, "chunk_size": 25}
    """Eager (the CPU): a tiny Qwen3-TTS made 30 % less audio a second at 4 streams with the
    doubling windows (2.4x the decode work), for first audio 13 ms sooner."""
    max_chunk_size = 100
    left_context = 25
    right_context = 0

    def load(self) -> None:
        with timed(self.ctx, "imports"):
            from transformers import Qwen3OmniMoeCode2Wav

        self.model, config = load_codec(self.ctx, Qwen3OmniMoeCode2Wav, "code2wav_config", "code2wav")
        self.groups = config.num_quantizers
        self.samples_per_code = int(self.model.total_upsample)
        self.graphs = self.causal_graphs(lambda c: self.model(c).reshape(c.shape[0], -1))
