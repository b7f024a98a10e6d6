"""The Moshi duplex adapter: one 80 ms frame of every slot in, one frame of audio and text out.

Per frame, for all slots as one batch: Mimi-encode the user's frame, one
temporal step and the depth decoder (DuplexLM), Mimi-decode the model's frame
(MoshiFrame: one CUDA graph per frame on CUDA unless engine_extras["cuda_graphs"]
is false, as HfAREngine's). Loads a Hugging Face Moshi folder (`MoshiForConditionalGeneration`, its Mimi
inside as `audio_encoder`, and the tokenizer) with transformers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors import logs
from omni_actors.models.moshi.detokenize import SlotText
from omni_actors.models.moshi.frame import MoshiFrame
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.duplex import DuplexAdapter, SlotOutput
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted

log = logs.get(__name__)

class MoshiDuplexAdapter(DuplexAdapter):
    def __init__(self, ctx: EngineContext) -> None:
        from transformers import AutoTokenizer, MoshiForConditionalGeneration

        if ctx.model_path is None:
            raise ValueError("the moshi stage needs a model folder")
        dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}.get(ctx.dtype, torch.float32)
        device = "cuda" if ctx.device == "cuda" else "cpu"
        model = MoshiForConditionalGeneration.from_pretrained(ctx.model_path, dtype=dtype).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(ctx.model_path)
        self.slots = ctx.max_num_seqs
        cfg = model.config
        self._model, self._graphs = model, cuda_graphs_wanted(ctx)
        self.frame = MoshiFrame(model, self.slots, self._graphs)
        self.lm = self.frame.lm
        self.sample_rate = cfg.audio_encoder_config.sampling_rate
        self.frame_samples = self.frame.frame_samples
        self.device = device
        self._skip = set(self.tokenizer.all_special_ids)
        self._text = [SlotText(self.tokenizer) for _ in range(self.slots)]

    def start(self, slot: int, params: dict[str, Any]) -> None:
        self.frame.start(slot, int(params["seed"]), params.get("text_temperature"), params.get("temperature"))
        self._text[slot].reset()

    def stop(self, slot: int) -> None:
        self.frame.stop(slot)

    def retune(self, slot: int, temperature: float) -> bool:
        self.lm.audio_temp[slot] = temperature  # (in place: a captured frame graph reads the same buffer)
        return True

    def resize(self, slots: int) -> bool:
        self.frame = self.lm = None  # (the old slots' state and graph go before the new are made)
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.slots = slots
        self.frame = MoshiFrame(self._model, slots, self._graphs)
        self.lm = self.frame.lm
        self._text = [SlotText(self.tokenizer) for _ in range(slots)]
        return True

    @torch.no_grad()
    def step(self, frames: np.ndarray) -> list[SlotOutput]:
        text, out = self.frame.step(torch.from_numpy(frames))
        audio_out = out.cpu().numpy()
        tokens = text.tolist()
        return [SlotOutput(audio_out[s], self._piece(s, tokens[s])) for s in range(self.slots)]

    def _piece(self, slot: int, token: int) -> str:
        if token in self._skip or not bool(self.lm.live[slot]):
            return ""
        return self._text[slot].push(token)
