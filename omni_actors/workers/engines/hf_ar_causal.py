"""CausalLMAdapter: HfAREngine's adapter for any transformers `AutoModelForCausalLM` folder.

On CUDA the weights load straight onto the device (torch_setup.weights_device_map).
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engine import timed
from omni_actors.workers.engines.hf_ar_adapter import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    TextStream,
    check_checkpoint,
    prompt_ids,
)
from omni_actors.workers.engines.torch_setup import load_dtype, weights_device_map


class CausalLMAdapter(ARAdapter):
    """Prompt in, text and token ids out.

    Inputs: {"prompt_token_ids": [...]}, {"prompt": str} or {"messages": [...]}
    (chat template with the generation prompt). Outputs per step:
    {"text": delta, "token_ids": [id]}.
    """

    batch_prefill = True
    embeds_last_token = True

    def load(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        with timed(self.ctx, "processors"):
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        dtype = load_dtype(self.ctx)  # float32 on CPU, bfloat16 for "auto" elsewhere (as every engine)
        placement = weights_device_map(self.ctx)
        where = {} if placement is None else {"device_map": placement}
        with timed(self.ctx, "weights"):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **where).to(self.ctx.device)
        self.model = model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return self.model

    def warmup_inputs(self) -> dict[str, Any]:
        return {"prompt": "Hello"}

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        seq.data = {"ids": prompt_ids(self.tokenizer, inputs), "text": TextStream(self.tokenizer)}

    def prefill(self, seq: ARSeq) -> StepInputs:
        ids = torch.tensor(seq.data["ids"], device=self.ctx.device)
        return StepInputs(self.model.get_input_embeddings()(ids))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        ids = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.ctx.device)
        return self.model.get_input_embeddings()(ids)

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        return ForwardOut(self.model.lm_head(out.last_hidden_state[:, -1]))

    def fused_model(self) -> Any:
        from omni_actors.workers.engines.hf_ar_fused import FusedModel

        return FusedModel.causal_lm(self.model)

    def on_tokens(self, seqs, tokens, out, prefill):
        return [
            ({"text": s.data["text"].push(t), "token_ids": [t]}, False)
            for s, t in zip(seqs, tokens, strict=True)
        ]

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return set() if seq.params.get("ignore_eos") else self.eos
