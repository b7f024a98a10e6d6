"""Voxtral Realtime adapter for HfAREngine: streaming speech recognition, one text token per 80 ms of audio.

The model reads its audio in step with its output: the decoder's input at position
p is the embedding of the token at p plus the audio encoder's embedding of the
p-th 80 ms of audio (a causal encoder, so each one needs only audio up to its own
end). The prompt is BOS and [STREAMING_PAD] tokens over the left padding (silence)
and the transcription delay (480 ms on the real model); each later position writes
the text heard `delay` tokens earlier, [STREAMING_PAD] when there is none. The
decoder's MLPs are conditioned on the delay (ada-RMS-norm on its time embedding).

Audio may arrive all at once (`/v1/audio/transcriptions`) or in pieces (a streaming
request fed by a realtime session, `feed`): either way the log-mel frames are
computed as soon as their 25 ms window is complete, and whole 80 ms tokens go
through the encoder with its conv padding cache and its own KV cache, so the
embeddings equal what one pass over the whole audio gives. A request is `ready`
when the embedding of its next position exists. When the input ends, the right
padding (the delay plus a margin, as mistral-common pads offline audio) flushes
the last words; the request ends when the audio does (or at EOS).

Inputs: {"audio": float32 mono, "sample_rate": int}; fed chunks the same.
Params: "language" is checked against the languages the model was trained on
(LANGUAGES) and otherwise not needed (the model finds the language itself, but writes
no name of it: verbose_json reports the request's language, else "");
"prompt" is refused (the model takes none). Greedy by default.
Outputs per step: {"text": transcript delta}.
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
    TextStream,
    check_checkpoint,
)

LANGUAGES = frozenset({"ar", "de", "en", "es", "fr", "hi", "it", "ja", "ko", "nl", "pt", "ru", "zh"})
"""ISO-639-1 codes of the 13 languages Voxtral Mini Realtime was trained on (its model card)."""

RATE = 16000
ENCODE_CHUNK_TOKENS = 375
"""Most positions (30 s of audio) one encoder forward takes: long audio given at once is encoded in
chunks through the encoder's caches, which bounds the attention mask's memory and gives the same
embeddings."""
MAX_TOKENS = 1 << 24
"""Token budget of a request: the audio bounds a transcript (one token per 80 ms), not a count."""


class _Audio:
    """One request's audio side: samples -> log-mel frames -> encoder embeddings, as they become complete."""

    def __init__(self, rate: int, lead: np.ndarray) -> None:
        self.rate = rate
        self.resampler: Any = None
        self.pending = lead  # padded samples not yet consumed by a frame (window overlap kept)
        self.frames = 0  # log-mel frames computed
        self.enc_cache: Any = None  # encoder KV cache (transformers DynamicCache, sliding window)
        self.pad_cache: Any = None  # encoder conv padding cache
        self.embeds: torch.Tensor | None = None  # [n, hidden] embeddings from position `base` on
        self.base = 0
        self.count = 0  # embeddings made so far (positions 0 .. count-1)
        self.total: int | None = None  # positions of the whole request, once the input ended


class VoxtralRealtimeAdapter(ARAdapter):
    batch_prefill = True

    def load(self) -> torch.nn.Module:
        from transformers import AutoProcessor, VoxtralRealtimeForConditionalGeneration

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tekken.json"))
        dtype = self.load_dtype()
        try:
            self.processor = AutoProcessor.from_pretrained(path)
            model = VoxtralRealtimeForConditionalGeneration.from_pretrained(path, dtype=dtype)
        except Exception as err:
            raise ValueError(f"{path}: cannot load the Voxtral Realtime checkpoint ({err})") from err
        self.model = model.to(self.ctx.device).eval()
        proc = self.processor
        self.tokenizer = proc.tokenizer
        self.fe = proc.feature_extractor
        if proc.mistral_common_audio_config.sampling_rate != RATE:
            raise ValueError(f"{path}: expected a {RATE} Hz model")
        inst = self.tokenizer.tokenizer.instruct_tokenizer
        encoder = inst.audio_encoder
        self.prompt = list(inst.start()) + list(encoder.encode_streaming_tokens())
        left, right = encoder.get_padding_audio()
        self.left_pad = np.asarray(left.audio_array, np.float32)
        self.right_pad = len(right.audio_array)
        self.per_token = proc.raw_audio_length_per_tok  # samples per position (1280: 80 ms)
        self.mel_per_token = proc.audio_length_per_tok  # log-mel frames per position (8)
        self.hop, self.window = self.fe.hop_length, self.fe.win_length
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.model.config.text_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list | tuple) else [eos])
        inner = self.model.model
        delay = torch.full((1,), proc.num_delay_tokens, device=self.ctx.device, dtype=self.model.dtype)
        with torch.inference_mode():
            self.t_cond = inner.time_embedding(delay)[None]
        self.embed = inner.get_input_embeddings()
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        return {"temperature": 0.0, "max_tokens": MAX_TOKENS, **ctx.default_sampling_params, **params,
                **ctx.sampling_constraints}

    # ---- audio in ----

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        if seq.params.get("prompt"):
            raise ValueError("prompt: voxtral_realtime takes no prompt; leave it out")
        language = seq.params.get("language")
        if language and str(language).lower() not in LANGUAGES:
            raise ValueError(f"language: voxtral_realtime transcribes {', '.join(sorted(LANGUAGES))} "
                             f"(and finds which itself); {language!r} is not one of them")
        audio = np.asarray(inputs.get("audio", np.zeros(0, np.float32)), dtype=np.float32).reshape(-1)
        if not seq.streaming and not audio.size:
            raise ValueError("voxtral_realtime: inputs need non-empty 'audio'")
        # the STFT's centring pad (a reflection of the left padding's silence) and the left padding
        lead = np.concatenate([np.zeros(self.window // 2, np.float32), self.left_pad])
        seq.data = {"audio": _Audio(int(inputs.get("sample_rate") or RATE), lead), "text": TextStream(self.tokenizer),
                    "samples": 0}
        self._push(seq, audio, last=not seq.streaming)

    def feed(self, seq: ARSeq, inputs: dict[str, Any], last: bool) -> None:
        audio = np.asarray(inputs.get("audio", np.zeros(0, np.float32)), dtype=np.float32).reshape(-1)
        self._push(seq, audio, last)

    def _push(self, seq: ARSeq, audio: np.ndarray, last: bool) -> None:
        a: _Audio = seq.data["audio"]
        if a.total is not None:
            return
        if a.rate != RATE and audio.size:
            import soxr

            if a.resampler is None:
                a.resampler = soxr.ResampleStream(a.rate, RATE, 1, dtype="float32")
            audio = a.resampler.resample_chunk(audio, last=last)
        seq.data["samples"] += len(audio)
        parts = [a.pending, audio]
        if last:
            # pad to whole positions, then the right padding, then the STFT's centring pad (silence)
            n = seq.data["samples"]
            tail = (-n) % self.per_token + self.right_pad
            parts.append(np.zeros(tail + self.window // 2, np.float32))
        a.pending = np.concatenate(parts)
        self._encode(a)
        if last:
            a.total = a.count

    @torch.inference_mode()
    def _encode(self, a: _Audio) -> None:
        """Encode every whole position whose log-mel frames are complete."""
        while True:
            frames = (len(a.pending) - self.window) // self.hop + 1 if len(a.pending) >= self.window else 0
            tokens = min(frames // self.mel_per_token, ENCODE_CHUNK_TOKENS)
            if tokens <= 0:
                return
            self._encode_tokens(a, tokens)

    def _encode_tokens(self, a: _Audio, tokens: int) -> None:
        n = tokens * self.mel_per_token
        # one extra hop of silence: the feature extractor drops its last STFT frame
        window = np.concatenate([a.pending[: (n - 1) * self.hop + self.window], np.zeros(self.hop, np.float32)])
        mel = self.fe._torch_extract_fbank_features(torch.from_numpy(window), center=False)
        a.pending = a.pending[n * self.hop :]
        a.frames += n
        dev = self.ctx.device
        out = self.model.model.get_audio_features(
            input_features=mel[None].to(dev, self.model.dtype), padding_cache=a.pad_cache,
            past_key_values=a.enc_cache, use_cache=True, return_dict=True,
        )  # fmt: skip
        a.enc_cache, a.pad_cache = out.past_key_values, out.padding_cache
        new = out.pooler_output[0]
        a.embeds = new if a.embeds is None else torch.cat([a.embeds, new])
        a.count += new.shape[0]

    def ready(self, seq: ARSeq) -> bool:
        a: _Audio = seq.data["audio"]
        need = seq.cached + 1 if seq.prefilled else len(self.prompt)
        return a.count >= need

    def _audio_rows(self, a: _Audio, start: int, length: int) -> torch.Tensor:
        assert a.embeds is not None
        rows = a.embeds[start - a.base : start - a.base + length]
        keep = start + length - a.base  # later steps never look back: drop what was used
        a.embeds, a.base = a.embeds[keep:], start + length
        return rows

    # ---- the decoder ----

    def prefill(self, seq: ARSeq) -> StepInputs:
        ids = torch.tensor(self.prompt, device=self.ctx.device)
        audio = self._audio_rows(seq.data["audio"], 0, len(self.prompt))
        return StepInputs(self.embed(ids) + audio.to(self.model.dtype))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        ids = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.ctx.device)
        audio = torch.stack([self._audio_rows(s.data["audio"], s.cached, 1) for s in seqs])
        return self.embed(ids) + audio.to(self.model.dtype)

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model.language_model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True, t_cond=self.t_cond,
        )  # fmt: skip
        return ForwardOut(self.model.lm_head(out.last_hidden_state[:, -1]))

    def on_tokens(self, seqs, tokens, out, prefill):
        results = []
        for seq, token in zip(seqs, tokens, strict=True):
            a: _Audio = seq.data["audio"]
            # like generate: the request's positions end with its audio (the last one is never fed)
            done = a.total is not None and len(self.prompt) + len(seq.tokens) + 1 >= a.total
            text = "" if token in self.eos else seq.data["text"].push(token, final=done)
            results.append(({"text": text}, done))
        return results

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return self.eos
