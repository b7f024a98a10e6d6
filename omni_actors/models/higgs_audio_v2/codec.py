"""Codec adapter for GenerationEngine: Higgs-Audio-V2's audio tokenizer decoder (8 codebooks at 25 Hz -> 24 kHz).

Decoding is the RVQ sum, a linear projection and a DAC decoder (transformers'
`HiggsAudioV2TokenizerModel.decode`); n frames give n * 960 samples. DAC's decoder is not
causal (centred convolutions), so a window re-decodes `left_context` frames before its new
ones and holds back the audio of its last `right_context` frames until the frames after them
arrive (or the input ends). Measured on the real layout (strides 8-5-4-2-3, random weights,
narrow widths: the receptive field does not depend on width), a frame's audio depends on the
codes of up to 9 frames after it and 10 before: decoded with 9 after it is within 2e-5 of
the peak of one whole decode (10 after: float rounding; 8 after: 1e-3; 6 after: 8e-3, so a
window's end would depend on how many frames had arrived when it was cut, and a seeded
request's audio on timing), so right_context is 9 and left_context 12
(`tests/models/test_higgs_audio_v2_codec.py`). A streamed request's first window waits for 3
frames after its 3 only (`first_right_context`, always cut there: the audio does not depend on
timing): first audio 6 LM steps sooner (served at 10 requests/s on an H200, p95 99 -> 76 ms),
its first 120 ms within ~5% of the peak of a whole decode's (random weights) and faded into the
exact rest over one frame; `first_right_context: 9` in engine_extras makes every sample exact. The weights are the audio tokenizer
folder the processor names (codec_loading.py), decoded in float32. On CUDA a decode is a graph
replay of its exact window length (`window_graphs`: a non-causal decoder is never padded in
time), the lengths the chunk policy makes captured at load; eager, one 12-frame window at
Higgs-Audio-V2's sizes spent ~44 ms dispatching kernels.

Inputs: {"codes": int [n, 8]} (undelayed frames from the LM stage).
"""

from __future__ import annotations

import json

import torch

from omni_actors.models.higgs_audio_v2.codec_loading import load_tokenizer
from omni_actors.workers.engines.generation_adapter import FrameCodecAdapter
from omni_actors.workers.engines.hf_ar_adapter import check_checkpoint


class HiggsCodecAdapter(FrameCodecAdapter):
    sample_rate = 24000
    samples_per_code = 960
    first_chunk_size = 3
    """3 frames = 120 ms of audio in the first window, decoded once 3 + first_right_context = 6 frames are in."""
    chunk_size = 8
    left_context = 12
    right_context = 9
    first_right_context = 3
    max_chunk_size = 100

    def load(self) -> None:
        path = check_checkpoint(self.ctx.model_path, ("config.json",))
        self.model = load_tokenizer(path, self.ctx.device)
        cfg = self.model.config
        self.groups = int(cfg.num_quantizers)
        lm = json.loads((path / "config.json").read_text()).get("num_codebooks")
        if lm is not None and int(lm) != self.groups:
            raise ValueError(
                f"{path}: the LM makes {lm} codebooks a frame but its audio tokenizer decodes "
                f"{self.groups} (target_bandwidths {list(cfg.target_bandwidths)} at {cfg.frame_rate} "
                "frames a second): they must match"
            )
        self.sample_rate = int(cfg.sample_rate)
        self.samples_per_code = int(cfg.hop_length)
        self.graphs = self.window_graphs(self._decode)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[batch, 8, length] codes on the device -> [batch, samples] float32."""
        with torch.inference_mode():
            return self.model.decode(codes, return_dict=False).reshape(codes.shape[0], -1).float()

