"""Stage engine "asr": Whisper (CTranslate2, through faster-whisper), audio in, transcript out.

Inputs: {"audio": float32 or int16 samples, "sample_rate": int (16000 if absent)}.
Streaming requests (live microphone) send more audio through `feed`; the
transcript is made once the input ended. Audio not at 16 kHz is resampled.
Output, once per request: {"text": transcript, "language": "en"}, and with
params["timestamps"] ("segment" or "word") also "segments" (start, end, text and
Whisper's statistics each) and, for "word", "words" ({"word", "start", "end"}).

Requests up to 30 s long without timestamps, `prompt` or `temperature` are batched:
one step encodes and decodes up to `max_batch` of them together, and a window
Whisper finds silent says "" (faster-whisper's no-speech rule). Longer, timed,
prompted or tempered ones go through faster-whisper's own long-form `transcribe`
(`initial_prompt`: its last 223 tokens, as OpenAI keeps a prompt's last 224), one per step.

engine_extras: `compute_type` ("int8" on cpu, "float16" on cuda), `beam_size` (1),
`language` ("en"), `threads` (1), `max_batch` (max_num_seqs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from omni_actors.audio import resample
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

WHISPER_RATE = 16000
WINDOW_SAMPLES = 30 * WHISPER_RATE
"""Whisper's window: audio up to this long is transcribed in one batched pass."""
INT16_SCALE = 32768.0
NO_SPEECH_PROB = 0.6
LOGPROB_THRESHOLD = -1.0
"""faster-whisper's defaults for a window that holds no speech: a batched decode more sure of silence than
NO_SPEECH_PROB, whose average token log-probability is below LOGPROB_THRESHOLD, says "" (not Whisper's " .")."""


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
    timestamps: str | None = None
    """None, "segment" or "word" (params["timestamps"])."""
    prompt: str | None = None
    temperature: float | None = None

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
        if language and language.strip().lower() != self.language:  # the caller's to fix: a 400 naming it
            raise ValueError(f"language: this model transcribes {self.language!r} only; {language!r} was asked")
        timestamps = params.get("timestamps")
        if timestamps not in (None, "segment", "word"):
            raise ValueError(f"timestamp_granularities: {timestamps!r} is not one of segment, word")
        rate = int(inputs.get("sample_rate", WHISPER_RATE))
        self.requests[request_id] = _Request(rate=rate, timestamps=timestamps, prompt=params.get("prompt"),
                                             temperature=params.get("temperature"))
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
        ready = [rid for rid, r in self.requests.items() if r.input_done][: self.max_batch]
        reqs = {rid: self.requests.pop(rid) for rid in ready}
        audios = {rid: req.audio() for rid, req in reqs.items()}
        short = {rid: a for rid, a in audios.items() if a.size <= WINDOW_SAMPLES and _batchable(reqs[rid])}
        whole = [rid for rid in audios if rid not in short]
        outs = {rid: {"text": text} for rid, text in (self._transcribe_batch(short) if short else {}).items()}
        for rid in whole[:1]:
            outs[rid] = self._transcribe_whole(audios[rid], reqs[rid])
        for rid in whole[1:]:  # one long-form request per step: put the rest back
            self.requests[rid] = replace(reqs[rid], rate=WHISPER_RATE, chunks=[audios[rid]])
        return [EngineOutput(rid, {**out, "language": self.language}, finished=True) for rid, out in outs.items()]

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
            return_scores=True,
            return_no_speech_prob=True,
        )
        return {rid: "" if _no_speech(result) else self.tokenizer.decode(result.sequences_ids[0]).strip()
                for rid, result in zip(audios, results, strict=True)}

    def _transcribe_whole(self, audio: np.ndarray, req: _Request) -> dict[str, Any]:
        """faster-whisper's long-form transcription (with the request's prompt and temperature): the text,
        and the segments (and words) when timed."""
        timestamps = req.timestamps
        words = timestamps == "word"
        temperature = {} if req.temperature is None else {"temperature": req.temperature}
        segments = list(self.model.transcribe(
            audio, language=self.language, beam_size=self.beam_size, condition_on_previous_text=False,
            word_timestamps=words, initial_prompt=req.prompt, **temperature,
        )[0])
        out: dict[str, Any] = {"text": " ".join(s.text.strip() for s in segments).strip()}
        if timestamps:
            out["segments"] = [
                {"start": s.start, "end": s.end, "text": s.text, "seek": s.seek, "tokens": list(s.tokens),
                 "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                 "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                for s in segments
            ]
        if words:
            out["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                            for s in segments for w in s.words or ()]
        return out


def _batchable(req: _Request) -> bool:
    """Untimed, unprompted, at the default temperature: the batched pass (the rest go long-form)."""
    return not req.timestamps and not req.prompt and req.temperature is None


def _no_speech(result: Any) -> bool:
    """faster-whisper's silence rule for one decoded window (its `scores` are length-normalised sums)."""
    tokens = len(result.sequences_ids[0])
    avg_logprob = result.scores[0] * tokens / (tokens + 1)
    return result.no_speech_prob > NO_SPEECH_PROB and avg_logprob < LOGPROB_THRESHOLD
