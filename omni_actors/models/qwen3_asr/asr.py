"""Qwen3-ASR adapter for HfAREngine: the audio encoder in the prompt, the Qwen3 decoder writes the transcript.

Prompt: the processor's transcription request (`apply_transcription_request`):
an optional system turn with the request's `prompt` (context words), the user turn
with the audio placeholders, and the assistant turn, prefilled with
"language <Name><asr_text>" when the request names a `language`. The audio
encoder's output replaces the placeholders' embeddings, so every prompt is plain
embeddings and prompts share one batched prefill. Without a language the model
writes "language <Name><asr_text>" itself ("language None" for audio without speech):
nothing before `<asr_text>` is sent as text; the name is the output's "language"
(verbose_json reports it; before 2026-12-05 it was dropped and the report said "").

Inputs: {"audio": float32 mono, "sample_rate": int}. Params: "language" (ISO code
or name; the API gives Whisper's code, "tl" where Qwen3-ASR says "fil"), "prompt", sampling (greedy by default), "max_tokens" (default: the
checkpoint's generation_config max_new_tokens).
Outputs per step: {"text": transcript delta}, and {"language": "<Name>"} with the
step that completes the model's own "language <Name><asr_text>".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.workers.engines.hf_ar_adapter import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    check_checkpoint,
)

RATE = 16000
MARK = "<asr_text>"
TAG = "language "
"""The model's output starts "language <Name>" + MARK (Name "None": no speech heard)."""
DEFAULT_MAX_TOKENS = 448
"""Transcript tokens a request may write when generation_config sets no max_new_tokens."""
CODES = {"tl": "fil"}
"""The API's language codes (Whisper's, as OpenAI's) that Qwen3-ASR's processor knows by another: Filipino,
which Whisper calls tagalog ("tl") and Qwen3-ASR "fil"."""


class Qwen3AsrAdapter(ARAdapter):
    batch_prefill = True

    def load(self) -> torch.nn.Module:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        dtype = self.load_dtype()
        try:
            self.processor = AutoProcessor.from_pretrained(path)
            model = Qwen3ASRForConditionalGeneration.from_pretrained(path, dtype=dtype)
        except Exception as err:
            raise ValueError(f"{path}: cannot load the Qwen3-ASR checkpoint ({err})") from err
        self.model = model.to(self.ctx.device).eval()
        self.tokenizer = self.processor.tokenizer
        eos = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list | tuple) else [eos])
        self.defaults = {"temperature": 0.0,
                         "max_tokens": self.model.generation_config.max_new_tokens or DEFAULT_MAX_TOKENS}
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        return {**self.defaults, **ctx.default_sampling_params, **params, **ctx.sampling_constraints}

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        import soxr

        audio = np.asarray(inputs.get("audio"), dtype=np.float32).reshape(-1)
        if not audio.size:
            raise ValueError("qwen3_asr: inputs need non-empty 'audio'")
        rate = int(inputs.get("sample_rate") or RATE)
        if rate != RATE:
            audio = soxr.resample(audio, rate, RATE).astype(np.float32)
        language = seq.params.get("language") or None
        if isinstance(language, str):
            language = CODES.get(language.strip().lower(), language)
        try:
            batch = self.processor.apply_transcription_request(
                audio=audio, language=language, prompt=seq.params.get("prompt") or None)
        except ValueError as err:  # an unknown language name or code
            raise ValueError(f"language: {err} (qwen3_asr)") from None
        seq.data = {"batch": batch, "ids": [], "sent": 0, "open": language is not None}

    def prefill(self, seq: ARSeq) -> StepInputs:
        batch = seq.data.pop("batch")
        dev = self.ctx.device
        ids = batch["input_ids"].to(dev)
        inner = self.model.model
        embeds = inner.get_input_embeddings()(ids)
        feats = batch["input_features"].to(dev, self.model.dtype)
        audio = inner.get_audio_features(feats, batch["input_features_mask"].to(dev), return_dict=True).pooler_output
        mask = inner.get_placeholder_mask(ids, inputs_embeds=embeds, audio_features=audio)
        embeds = embeds.masked_scatter(mask, audio.to(embeds.dtype))
        return StepInputs(embeds[0])

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        ids = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.ctx.device)
        return self.model.model.get_input_embeddings()(ids)

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model.language_model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        return ForwardOut(self.model.lm_head(out.last_hidden_state[:, -1]))

    def on_tokens(self, seqs, tokens, out, prefill):
        return [(self._delta(s, t), False) for s, t in zip(seqs, tokens, strict=True)]

    def _delta(self, seq: ARSeq, token: int) -> dict[str, str]:
        """The payload of `token`: the transcript's new text, and the language once its tag is complete."""
        d = seq.data
        if token in self.eos:
            return {"text": ""}
        d["ids"].append(token)
        text = self.tokenizer.decode(d["ids"], skip_special_tokens=False)
        payload: dict[str, str] = {}
        if not d["open"]:
            at = text.find(MARK)
            if at < 0:
                return {"text": ""}
            d["open"], d["sent"] = True, at + len(MARK)
            if language := detected_language(text[:at]):
                payload["language"] = language
        if text.endswith("\ufffd"):
            return {**payload, "text": ""}  # an incomplete UTF-8 sequence: wait for its next byte
        delta, d["sent"] = text[d["sent"] :], len(text)
        return {**payload, "text": delta}

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return self.eos


def detected_language(head: str) -> str | None:
    """The language name in what the model wrote before MARK ("language English" -> "English"), read
    from its first non-empty line as Qwen3-ASR's own parser reads it; None for "None" or nothing."""
    line = next((ln.strip() for ln in head.splitlines() if ln.strip()), "")
    if line.lower().startswith(TAG):
        line = line[len(TAG) :].strip()
    return None if line.lower() in ("", "none") else line
