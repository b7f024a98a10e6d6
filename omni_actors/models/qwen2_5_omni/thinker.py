"""Thinker adapter for HfAREngine: Qwen-Omni thinkers on transformers, with hidden states out.

vLLM 0.32 cannot import its Qwen-Omni thinkers on this machine (its Qwen2-VL
module imports transformers' torchvision image processor, and torchvision does
not install beside CPU torch), so the thinker runs here on transformers. That
also gives the talker what it needs straight from the thinker's forward: the
input embedding and a chosen layer's hidden state of every prompt position and
of every generated token.

Inputs: {"messages": [...]} (chat template, generation prompt added),
{"prompt": str} or {"prompt_token_ids": [...]}, plus optional "audio" (float32
mono 16 kHz waveform, or a list of them) and "image" (uint8 HxWx3, or a list).
Audio/image placeholders come from message content parts {"type": "audio"} /
{"type": "image"}; when a request has media but no placeholders, they are put
at the start of the last user message.

Outputs, per step: {"text": delta, "token_ids": [id]} plus, for the talker,
"embeds" and "hidden" ([1, hidden] float32) of the token this step fed in
(the previous one; the last sampled token is never fed, as in `generate`).
The first output also carries "prompt_token_ids", "prompt_embeds" and
"prompt_hidden" ([prompt length, hidden]) and, with media,
"audio_feature_lengths" and "image_grid_thw".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.audio import resample
from omni_actors.models.qwen2_5_omni.loading import check_checkpoint, load_config, load_part
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.hf_ar import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    TextStream,
    prompt_ids,
)
from omni_actors.workers.engines.hf_ar_sampling import small_tensor

AUDIO_RATE = 16000
REQUIRED = ("config.json", "tokenizer_config.json", "preprocessor_config.json")


class Qwen2_5OmniThinkerAdapter(ARAdapter):
    """Qwen2.5-Omni thinker; the talker gets the last layer's hidden states."""

    position_axes = 3
    batch_prefill = True  # text-only prompts; prompts with media carry extra inputs
    embeds_last_token = True  # decode_embeds: the input embedding of the last token
    part = "thinker"
    talker_layer = -1
    audio_part = {"type": "audio"}
    image_part = {"type": "image"}

    def part_class(self) -> Any:
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        return Qwen2_5OmniThinkerForConditionalGeneration

    def audio_tokens(self, lengths: torch.Tensor) -> torch.Tensor:
        return self.model.audio_tower._get_feat_extract_output_lengths(lengths)[1]

    # ---- loading -----------------------------------------------------------

    def load(self) -> torch.nn.Module:
        with timed(self.ctx, "imports"):
            from transformers import AutoTokenizer, WhisperFeatureExtractor

            part_class = self.part_class()
        path = check_checkpoint(self.ctx.model_path, REQUIRED)
        self.full_config = config = load_config(path, self.ctx)
        self.config = config.thinker_config
        self.model = load_part(part_class, path, self.config, self.part, self.ctx)
        self.model.lm_head = _LastPositionHead(self.model.lm_head)
        with timed(self.ctx, "processors"):
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.features = WhisperFeatureExtractor.from_pretrained(path)
        self.path = path
        self._images: Any = None
        eos = self.model.generation_config.eos_token_id
        ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos = set(ids) | {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        return self.model

    def image_processor(self) -> Any:
        if self._images is None:
            # The torchvision-free image processor (the default one needs torchvision).
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )

            self._images = Qwen2VLImageProcessorPil.from_pretrained(self.path)
        return self._images

    # ---- requests ----------------------------------------------------------

    def warmup_inputs(self) -> dict[str, Any]:
        """A one-word text prompt: what engine_extras.warm_graphs runs at start to capture every
        decode bucket before the first request."""
        return {"prompt": "Hello"}

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        rate = int(inputs.get("sample_rate") or AUDIO_RATE)  # the API passes audio at the client's rate
        audios = [resample(np.asarray(a, np.float32).reshape(-1), rate, AUDIO_RATE)
                  for a in _as_list(inputs.get("audio"))]
        images = _as_list(inputs.get("image"))
        if "messages" in inputs and (audios or images):
            inputs = {**inputs, "messages": self._with_media(inputs["messages"], audios, images)}
        ids = prompt_ids(self.tokenizer, inputs)
        extra: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        if audios:
            feats = self.features(
                [np.asarray(a, dtype=np.float32) for a in audios], sampling_rate=AUDIO_RATE,
                return_attention_mask=True, padding="longest", return_tensors="pt",
            )  # fmt: skip
            mask = feats["attention_mask"]
            extra["input_features"] = feats["input_features"]
            extra["feature_attention_mask"] = mask
            meta["audio_feature_lengths"] = mask.sum(-1)
            counts = self.audio_tokens(mask.sum(-1)).tolist()
            ids = _expand(ids, self.config.audio_token_id, counts, "audio")
        if images:
            proc = self.image_processor()
            pix = proc(images=[np.asarray(i) for i in images], return_tensors="pt")
            grid = pix["image_grid_thw"]
            extra["pixel_values"] = pix["pixel_values"]
            extra["image_grid_thw"] = grid
            meta["image_grid_thw"] = grid
            counts = (grid.prod(-1) // proc.merge_size**2).tolist()
            ids = _expand(ids, self.config.image_token_id, counts, "image")
        seq.data = {"ids": ids, "extra": extra, "meta": meta, "text": TextStream(self.tokenizer)}

    def _with_media(self, messages: list[dict], audios: list, images: list) -> list[dict]:
        def has(kind: str) -> bool:
            return any(
                isinstance(m.get("content"), list)
                and any(p.get("type") == kind for p in m["content"])
                for m in messages
            )

        if has("audio") or has("image"):
            return messages
        out = [dict(m) for m in messages]
        last = max(i for i, m in enumerate(out) if m.get("role") == "user")
        content = out[last].get("content", "")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        media = [self.audio_part] * len(audios) + [self.image_part] * len(images)
        out[last]["content"] = [*media, *parts]
        return out

    # ---- forward -----------------------------------------------------------

    def prefill(self, seq: ARSeq) -> StepInputs:
        ids = torch.tensor([seq.data["ids"]], device=self.ctx.device)
        meta, extra = seq.data["meta"], seq.data["extra"]
        positions, deltas = self.model.get_rope_index(
            ids, _on(meta.get("image_grid_thw"), self.ctx.device), None, torch.ones_like(ids), False,
            _on(meta.get("audio_feature_lengths"), self.ctx.device), None,
        )  # fmt: skip
        embeds = self.model.get_input_embeddings()(ids[0])
        if extra:  # media: the model merges their features at the placeholders of input_ids
            extra = {"input_ids": ids, **{k: v.to(self.ctx.device) for k, v in extra.items()}}
        next_pos = ids.shape[1] + int(deltas.reshape(-1)[0])
        return StepInputs(embeds, positions[:, 0], next_pos, extra)

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        ids = small_tensor([[s.tokens[-1]] for s in seqs], self.ctx.device)  # no host wait for the GPU
        return self.model.get_input_embeddings()(ids)

    def fused_model(self) -> Any:
        """Qwen2's layer stack and LM head; the talker's inputs (input embedding, last normed
        hidden state) come back with the logits. The multimodal rotary is the plain one at
        decode (the three position axes are equal past the prompt)."""
        if self.talker_layer != -1:
            return None
        from omni_actors.workers.engines.hf_ar_fused import FusedModel

        m = self.model
        return FusedModel(self.config.text_config, m.model, m.get_input_embeddings(), m.lm_head.head,
                          kind="qwen2", hidden=True)  # fmt: skip

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        args = {**extra} if "input_ids" in extra else {"inputs_embeds": embeds}
        out = self.model(
            **args, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, output_hidden_states=True,
        )  # fmt: skip
        states = out.hidden_states
        return ForwardOut(out.logits[:, -1], (states[0], states[self.talker_layer]))

    def on_tokens(self, seqs, tokens, out, prefill):
        embeds, hidden = out.hidden
        results = []
        for row, (seq, tok) in enumerate(zip(seqs, tokens, strict=True)):
            payload: dict[str, Any] = {"text": seq.data["text"].push(tok), "token_ids": [tok]}
            if prefill:
                pad = out.pads[row] if out.pads else 0  # left padding of a batched prefill
                payload["prompt_token_ids"] = list(seq.data["ids"])
                payload["prompt_embeds"] = _np(embeds[row, pad:])
                payload["prompt_hidden"] = _np(hidden[row, pad:])
                for key, value in seq.data["meta"].items():
                    payload[key] = value.cpu().numpy()
            else:
                payload["embeds"] = _np(embeds[row, -1:])
                payload["hidden"] = _np(hidden[row, -1:])
            results.append((payload, False))
        return results

    def text_tokenizer(self) -> tuple[Any, list[int], int]:
        return self.tokenizer, sorted(self.eos), int(self.model.get_input_embeddings().weight.shape[0])

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return set() if seq.params.get("ignore_eos") else self.eos


class _LastPositionHead(torch.nn.Module):
    """The LM head applied to the last position only.

    The engine samples from the last position's logits, but the thinker classes
    have no `logits_to_keep`: a prefill would project every prompt position onto
    the ~152k-token vocabulary (most of a prefill's time on small models).
    """

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden[:, -1:])


def _np(x: torch.Tensor) -> np.ndarray:
    """A host copy: on CPU `.float().cpu()` of a float32 tensor is the tensor itself, and a static
    step's outputs are buffers the next step rewrites."""
    return np.array(x.detach().float().cpu())


def _as_list(x: Any) -> list:
    if x is None:
        return []
    if isinstance(x, list | tuple):
        return list(x)
    return [x]


def _expand(ids: list[int], token: int, counts: list[int], kind: str) -> list[int]:
    """Repeat the i-th `token` placeholder counts[i] times."""
    places = [i for i, t in enumerate(ids) if t == token]
    if len(places) != len(counts):
        raise ValueError(
            f"prompt has {len(places)} {kind} placeholders for {len(counts)} {kind} inputs"
        )
    out: list[int] = []
    prev = 0
    for place, n in zip(places, counts, strict=True):
        out.extend(ids[prev:place])
        out.extend([token] * int(n))
        prev = place + 1
    out.extend(ids[prev:])
    return out


def _on(x: torch.Tensor | None, device: Any) -> torch.Tensor | None:
    return None if x is None else x.to(device)
