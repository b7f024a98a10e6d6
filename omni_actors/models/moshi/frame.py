"""One Moshi frame of every slot as one fixed-shape call: Mimi encode, temporal + depth step, Mimi decode.

The device work of a frame reads and writes only static buffers: the user's audio
(`audio_in`), each slot's noise (drawn on the host side by DuplexLM.prepare), and
the streaming state (RingKV caches, conv padding, transposed-conv tails, the
previous tokens), all written in place, with no host syncs and no branching on
tensor values. So on CUDA the whole frame is one CUDA graph (HfAREngine's
DecodeGraphs: the first frame runs eagerly, then the same call is captured, later
frames replay it; a failed capture logs why and stays eager); on CPU, or with
engine_extras["cuda_graphs"] false, the same call runs eagerly. Every frame has
the batch of all slots (free slots' rows included, as DuplexEngine steps them),
so there is one graph per worker.

Host side, around the call: copy the frames in, draw noise, and after it forget
the decoder state of slots at their first step (they decoded no real frame).
"""

from __future__ import annotations

import torch

from omni_actors.models.moshi.lm import DuplexLM
from omni_actors.models.moshi.mimi_stream import StreamingMimi
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs


class MoshiFrame:
    """Steps every slot of a Moshi model by one 80 ms frame; `graphs` replays a CUDA graph per frame."""

    def __init__(self, model, slots: int, graphs: bool, lm: DuplexLM | None = None) -> None:
        self.lm = lm or DuplexLM(model, slots)
        self.mimi = StreamingMimi(model.audio_encoder, slots, model.config.num_codebooks)
        self.slots = slots
        self.frame_samples = self.mimi.frame_samples
        self.audio_in = torch.zeros(slots, self.frame_samples, device=self.lm.device)
        self.graphs = DecodeGraphs(lambda _b, _l: self._forward(), graphs and self.lm.device.type == "cuda")

    @property
    def graphs_on(self) -> bool:
        """Whether frames replay a captured graph (False once a capture failed)."""
        return self.graphs.enabled

    def start(self, slot: int, seed: int, text_temperature: float | None = None,
              audio_temperature: float | None = None) -> None:
        self.mimi.reset(slot)
        self.lm.start(slot, seed, text_temperature, audio_temperature)

    def stop(self, slot: int) -> None:
        self.lm.stop(slot)
        self.mimi.reset(slot)

    @torch.no_grad()
    def step(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio [S, frame_samples] float -> (text tokens [S], model audio [S, frame_samples] float32), on the
        model's device; a slot's first frame of audio is silence. Both are overwritten by the next step."""
        self.audio_in.copy_(audio)
        first = self.lm.prepare()
        text, out = self.graphs.run(self.slots, 0)
        self.lm.finish()
        for s in torch.nonzero(first).flatten().tolist():
            self.mimi.reset_decoder(s)  # the slot's first step decoded no real frame: forget it
        return text, out

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        user = self.mimi.encode(self.audio_in)
        text, codes, ready = self.lm.forward(user)
        rows = ready[:, None]
        out = self.mimi.decode(torch.where(rows, codes, 0)).float()  # no "nothing yet" codes
        return text, torch.where(rows, out, 0.0)
