"""Stage engine "asr": Whisper (CTranslate2, through faster-whisper), audio in, transcript out.

Inputs: {"audio": float32 or int16 samples, "sample_rate": int (16000 if absent)}.
Streaming requests (live microphone) send more audio through `feed`; the
transcript is made once the input ended. Audio not at 16 kHz is resampled.
Output, once per request: {"text": transcript, "language": "en"}.

Requests up to 30 s long are batched: one step encodes and decodes up to
`max_batch` of them together, without timestamps. Longer ones go through
faster-whisper's own long-form `transcribe`, one per step.

engine_extras: `compute_type` ("int8" on cpu, "float16" on cuda), `beam_size` (1),
`language` ("en"), `threads` (1), `max_batch` (max_num_seqs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.audio import resample
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

WHISPER_RATE = 16000
WINDOW_SAMPLES = 30 * WHISPER_RATE
"""Whisper's window: audio up to this long is transcribed in one batched pass."""
INT16_SCALE = 32768.0


def as_float_audio(value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.int16:
        return arr.astype(np.float32).reshape(-1) / INT16_SCALE
    return np.array(arr, dtype=np.float32).reshape(-1)  # copies: may be a shared-memory view


@dataclass
class _Request:
    rate: int
    chunks: list[np.ndarray] = field(default_factory=list)
    input_done: bool = False

    def audio(self) -> np.ndarray:
        joined = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
        return resample(joined, self.rate, WHISPER_RATE)


class WhisperAsrEngine(StageEngine):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        if ctx.model_path is None:
            raise ValueError("asr stage needs a model path (the prepared asr/ folder)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        extras = ctx.engine_extras
        cuda = ctx.device == "cuda"
        self.model = WhisperModel(
            str(ctx.model_path),
            device="cuda" if cuda else "cpu",
            compute_type=extras.get("compute_type", "float16" if cuda else "int8"),
            cpu_threads=int(extras.get("threads", 1)),
            num_workers=1,
        )
        self.language = extras.get("language", "en")
        self.beam_size = int(extras.get("beam_size", 1))
        self.max_batch = int(extras.get("max_batch", ctx.max_num_seqs))
        self.tokenizer = Tokenizer(
            self.model.hf_tokenizer, self.model.model.is_multilingual, task="transcribe", language=self.language
        )
        self.prompt = self.model.get_prompt(self.tokenizer, previous_tokens=[], without_timestamps=True)
        self.suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))
        self.requests: dict[str, _Request] = {}

    # -- requests --
    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        language = params.get("language")
        if language and language != self.language:  # the caller's to fix: a 400
            raise ValueError(f"this model transcribes {self.language!r} only; language {language!r} was asked")
        self.requests[request_id] = _Request(rate=int(inputs.get("sample_rate", WHISPER_RATE)))
        self._take(request_id, inputs, last=not streaming)

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        if request_id in self.requests:
            self._take(request_id, inputs, last)

    def _take(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        req = self.requests[request_id]
        if inputs.get("audio") is not None:
            rate = int(inputs.get("sample_rate", req.rate))
            if rate != req.rate:
                raise ValueError(f"sample_rate changed within a request: {req.rate} -> {rate}")
            req.chunks.append(as_float_audio(inputs["audio"]))
        req.input_done = req.input_done or last

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_work(self) -> bool:
        return any(r.input_done for r in self.requests.values())

    # -- work --
    def step(self) -> list[EngineOutput]:
        ready = [rid for rid, r in self.requests.items() if r.input_done]
        audios = {rid: self.requests.pop(rid).audio() for rid in ready[: self.max_batch]}
        short = {rid: a for rid, a in audios.items() if a.size <= WINDOW_SAMPLES}
        long = [(rid, a) for rid, a in audios.items() if a.size > WINDOW_SAMPLES]
        texts = self._transcribe_batch(short) if short else {}
        for rid, audio in long[:1]:
            texts[rid] = self._transcribe_long(audio)
        for rid, audio in long[1:]:  # one long-form request per step: put the rest back
            self.requests[rid] = _Request(rate=WHISPER_RATE, chunks=[audio], input_done=True)
        return [
            EngineOutput(rid, {"text": text, "language": self.language}, finished=True)
            for rid, text in texts.items()
        ]

    def _transcribe_batch(self, audios: dict[str, np.ndarray]) -> dict[str, str]:
        from faster_whisper.audio import pad_or_trim

        features = np.stack([pad_or_trim(self.model.feature_extractor(a)) for a in audios.values()])
        encoded = self.model.encode(features)
        results = self.model.model.generate(
            encoded,
            [list(self.prompt) for _ in audios],
            beam_size=self.beam_size,
            max_length=self.model.max_length,
            suppress_blank=True,
            suppress_tokens=self.suppress,
        )
        return {
            rid: self.tokenizer.decode(result.sequences_ids[0]).strip()
            for rid, result in zip(audios, results, strict=True)
        }

    def _transcribe_long(self, audio: np.ndarray) -> str:
        segments, _ = self.model.transcribe(
            audio, language=self.language, beam_size=self.beam_size, condition_on_previous_text=False
        )
        return " ".join(s.text.strip() for s in segments).strip()
