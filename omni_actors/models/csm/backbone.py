"""Backbone adapter for HfAREngine: CSM's Llama backbone samples codebook 0, its depth decoder the rest.

Prompt (as sesame's generator builds it): for a reference clip to clone, the
clip's text segment `<|begin_of_text|>[speaker]text<|end_of_text|>` (text
embeddings), its Mimi codes (each frame the sum of its codebooks' embeddings)
and an end-of-audio frame (all codebooks `codebook_eos_token_id`); then the
segment to speak. Each engine step the backbone's logits give codebook 0 of the
next frame; the depth decoder (a small decoder over 32 positions: the backbone
state, then codebook k at position k + 1) draws codebooks 1..31, batched over all
requests of the step (depth.py: fixed-shape passes, a CUDA graph on CUDA). The next backbone input is the frame's embedding. A frame
whose codebooks (but the last) are all the end code ends the request and is not
emitted.

Inputs: {"text": str, "voice": "0" | "1", optional "reference_audio" float32
[samples] at the codec rate and "reference_text": str}. Outputs per step:
{"codes": int64 [1, num_codebooks]}. Sampling: the checkpoint's
generation_config (temperature, top_k, max_new_tokens; depth_decoder_* for the
depth decoder) < deploy defaults < request params (seed, temperature, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.config.speech import text_and_voice
from omni_actors.models.csm import VOICES
from omni_actors.models.csm.depth import DepthRunner
from omni_actors.models.mimi import conv_shapes_on_host
from omni_actors.workers.engine import merge_params
from omni_actors.workers.engines.hf_ar_adapter import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    check_checkpoint,
)
from omni_actors.workers.engines.hf_ar_sampling import small_tensor

DEFAULT_MAX_FRAMES = 1024
"""Frames (12.5 a second) a request may generate when generation_config sets no max_new_tokens."""
SHARED_KEYS = ("seed", "temperature", "top_k", "top_p", "max_tokens")


class CsmBackboneAdapter(ARAdapter):
    batch_prefill = True
    """Prompts are plain embeddings (reference clips included): new requests share one prefill."""
    graph_prefill: dict[str, Any] | None = {}
    """The backbone's prompt forward takes a 4D mask and makes no host sync: prompts run bucketed,
    replayed as CUDA graphs (hf_ar_prefill.py)."""

    def load(self) -> torch.nn.Module:
        from transformers import AutoTokenizer, CsmForConditionalGeneration

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        dtype = self.load_dtype()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = CsmForConditionalGeneration.from_pretrained(path, dtype=dtype)
        except Exception as err:
            raise ValueError(f"{path}: cannot load the CSM checkpoint ({err})") from err
        self.model = model.to(self.ctx.device).eval()
        self.codec = self.model.codec_model.float()  # encodes reference clips
        conv_shapes_on_host(self.codec)
        cfg = self.model.config
        self.groups = cfg.num_codebooks
        self.eos_code = cfg.codebook_eos_token_id
        self.codes = cfg.codec_config.codebook_size
        self.sample_rate = cfg.codec_config.sampling_rate
        gen = self.model.generation_config
        self.defaults = {
            "temperature": gen.temperature if gen.do_sample else 0.0,
            "top_k": gen.top_k, "max_tokens": gen.max_new_tokens or DEFAULT_MAX_FRAMES,
        }  # fmt: skip
        depth = self.model.depth_decoder.generation_config
        self.depth_defaults = {
            "temperature": depth.temperature if depth.do_sample else 0.0, "top_k": depth.top_k,
        }  # fmt: skip
        self.depth = DepthRunner(self.model, self.ctx, self.codes)
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        # A request's params reach every stage; the backbone takes the sampling keys and seed.
        return merge_params(self.ctx, params, SHARED_KEYS, self.defaults)

    # ---- prompt ----------------------------------------------------------------

    def warmup_inputs(self) -> dict[str, Any]:
        return {"text": "Hello.", "voice": VOICES[0]}

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        text, voice = text_and_voice(inputs, "csm", VOICES)
        ref = inputs.get("reference_audio")
        seq.data = {
            "text": text, "voice": voice, "frame": None,
            "ref_audio": None if ref is None else np.array(ref, dtype=np.float32).reshape(-1),
            "ref_text": str(inputs.get("reference_text") or ""),
        }  # fmt: skip

    def _text(self, voice: str, text: str) -> torch.Tensor:
        ids = self.tokenizer(f"[{voice}]{text}", add_special_tokens=True).input_ids
        return self.model.embed_text_tokens(torch.tensor(ids, device=self.ctx.device))

    def _frames(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, groups] codes -> [n, hidden] backbone inputs (sum of codebook embeddings)."""
        return self.model.backbone_model.embed_tokens(codes[None].to(self.ctx.device))[0]

    def prefill(self, seq: ARSeq) -> StepInputs:
        d = seq.data
        parts = []
        if d["ref_audio"] is not None and d["ref_audio"].size:
            audio = torch.from_numpy(d["ref_audio"]).to(self.ctx.device)[None, None]
            codes = self.codec.encode(audio).audio_codes[0].T  # [frames, groups]
            eos = torch.full((1, self.groups), self.eos_code, dtype=torch.long)
            parts += [self._text(d["voice"], d["ref_text"]), self._frames(codes), self._frames(eos)]
        parts.append(self._text(d["voice"], d["text"]))
        return StepInputs(torch.cat(parts).to(self.model.dtype))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        return torch.stack([s.data["frame"] for s in seqs])[:, None]

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.backbone_model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        last = out.last_hidden_state[:, -1]
        return ForwardOut(self.model.lm_head(last).float(), last)

    def fused_model(self) -> Any:
        """The backbone is a Llama stack fed the adapter's frame embeddings, with `lm_head` for
        codebook 0; the fused step also returns its final normed hidden state, which the depth
        decoder reads (engine_extras fused_decode, with compile on CUDA)."""
        from omni_actors.workers.engines.hf_ar_fused import FusedModel

        m = self.model
        return FusedModel(m.config, m.backbone_model, None, m.lm_head, None, "llama", hidden=True)

    def process_logits(self, seqs: list[ARSeq], logits: torch.Tensor) -> torch.Tensor:
        return _codes_only(logits, self.codes)

    # ---- depth decoder -----------------------------------------------------------

    def on_tokens(self, seqs, tokens, out, prefill):
        return self.on_device_tokens(seqs, small_tensor(tokens, self.ctx.device), out, prefill)[1]

    def on_device_tokens(self, seqs, ids, out, prefill):
        """Codebook 0 stays on the device: the depth frame is queued behind the backbone's step and
        its sampling, and the host waits once, for the frame's codes."""
        params = [{**self.depth_defaults, **_depth_params(s.params)} for s in seqs]
        # the fused step gives (input embeddings, normed hidden [n, 1, H]); the model's forward the last row
        hidden = out.hidden[1][:, -1] if isinstance(out.hidden, tuple) else out.hidden
        codes = self.depth.run(hidden, ids, params, [s.generator for s in seqs])
        frames = self._frames(codes).to(self.model.dtype)
        host = codes.cpu().numpy().astype(np.int64)
        results = []
        for i, seq in enumerate(seqs):
            if (host[i, :-1] == self.eos_code).all():
                results.append(({}, True))
                continue
            seq.data["frame"] = frames[i]
            results.append(({"codes": host[i : i + 1]}, False))
        return host[:, 0].tolist(), results


def _depth_params(params: dict[str, Any]) -> dict[str, Any]:
    out = {k.removeprefix("depth_decoder_"): v for k, v in params.items() if k.startswith("depth_decoder_")}
    if "seed" in params:
        out["seed"] = params["seed"]
    return out


def _codes_only(logits: torch.Tensor, codes: int) -> torch.Tensor:
    """Ids past the codec's codebook (pad and spares) cannot be decoded: never sample them."""
    if logits.shape[-1] <= codes:
        return logits
    logits = logits.clone()
    logits[:, codes:] = float("-inf")
    return logits
