"""Stage engine "tts": Piper's acoustic model, text sentences in, latent frames out.

Text is turned into phonemes by the `espeak-ng` program (run as a separate
process, as Piper does through its library), phonemes into Piper ids with the
voice's map, and ids into the latent `[192, frames]` by the ONNX graph cut at
`/Mul_7_output_0`. One step synthesises the next pending sentence of up to
`max_batch` requests in one batched run; each request gets one output per
sentence: {"latent": float32 [192, frames], "text": sentence}.

Inputs: {"text": str}. Streaming requests get more text through `feed`, in whole
sentences or clauses (the pipeline's `llm_to_tts_chunk` buffers LLM deltas).
Params: `speed` (OpenAI speech speed, 0.25-4; divides Piper's length scale).
engine_extras: `espeak_binary` ("espeak-ng"), `espeak_voice` (the voice's),
`noise_scale` (0.0), `noise_w` (0.0), `length_scale` (the voice's), `threads` (1),
`max_batch` (max_num_seqs). Noise scales at 0 make synthesis deterministic.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.models.assistant.piper_engine import empty_latent, load_voice, onnx_session
from omni_actors.models.assistant.processors import split_sentences
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

ESPEAK_TIMEOUT_S = 10.0
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# Piper phonemises clause by clause and keeps the clause's punctuation, which
# shapes prosody; the espeak-ng program drops it, so clauses are cut here.
_CLAUSE = re.compile(r"([^,.;:!?]+)([,.;:!?]*)")


class Phonemizer:
    """Text -> Piper phoneme ids through the `espeak-ng` program."""

    def __init__(self, voice: dict[str, Any], binary: str, espeak_voice: str | None) -> None:
        path = shutil.which(binary)
        if path is None:
            raise RuntimeError(f"{binary!r} not found: install espeak-ng (apt-get install espeak-ng)")
        self.binary = path
        self.voice = espeak_voice or voice.get("espeak", {}).get("voice", "en-us")
        self.id_map: dict[str, list[int]] = voice["phoneme_id_map"]
        # espeak-ng opens its audio output (PulseAudio) even when only asked for phonemes; with no
        # XDG_RUNTIME_DIR that leaves a /tmp/pulse-* folder behind. It gets one of ours, removed
        # with the engine (or at the worker's exit).
        self._runtime = tempfile.TemporaryDirectory(prefix="omni-espeak-")
        self.env = {**os.environ, "XDG_RUNTIME_DIR": self._runtime.name}

    def close(self) -> None:
        self._runtime.cleanup()

    def phonemes(self, text: str) -> str:
        parts = []
        for match in _CLAUSE.finditer(text):
            clause, punct = match.group(1).strip(), match.group(2)[:1]
            if not clause:
                continue
            proc = subprocess.run(
                [self.binary, "-q", "-v", self.voice, "--ipa"],
                input=clause,
                capture_output=True,
                text=True,
                timeout=ESPEAK_TIMEOUT_S,
                check=True,
                env=self.env,
            )
            parts.append(" ".join(proc.stdout.split()) + punct)
        return unicodedata.normalize("NFD", " ".join(parts))

    def ids(self, text: str) -> list[int]:
        """Piper's layout: BOS, then each phoneme followed by PAD, then EOS."""
        pad = self.id_map["_"]
        out = [*self.id_map["^"], *pad]
        for ch in self.phonemes(text):
            if ch in self.id_map:
                out += [*self.id_map[ch], *pad]
        out += self.id_map["$"]
        return out


@dataclass
class _Request:
    length_scale: float
    pending: deque[str] = field(default_factory=deque)
    input_done: bool = False


class PiperAcousticEngine(StageEngine):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        if ctx.model_path is None:
            raise ValueError("tts stage needs a model path (the prepared tts/ folder)")
        extras = ctx.engine_extras
        voice = load_voice(ctx.model_path)
        inference = voice.get("inference", {})
        self.noise_scale = float(extras.get("noise_scale", 0.0))
        self.noise_w = float(extras.get("noise_w", 0.0))
        self.length_scale = float(extras.get("length_scale", inference.get("length_scale", 1.0)))
        self.max_batch = int(extras.get("max_batch", ctx.max_num_seqs))
        self.phonemizer = Phonemizer(voice, extras.get("espeak_binary", "espeak-ng"), extras.get("espeak_voice"))
        self.session = onnx_session(ctx.model_path, ctx.device, int(extras.get("threads", 1)))
        self.requests: dict[str, _Request] = {}

    # -- requests --
    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        speed = float(self.merged_sampling(params).get("speed", 1.0))
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        self.requests[request_id] = _Request(length_scale=self.length_scale / speed)
        # A streaming request's text comes only through `feed`; `inputs` at add is then
        # the client's request (which may hold unrelated keys).
        if not streaming:
            self._take(request_id, inputs.get("text", ""), last=True)

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        if request_id in self.requests:
            self._take(request_id, inputs.get("text", ""), last)

    def _take(self, request_id: str, text: str, last: bool) -> None:
        # Each input is whole sentences (llm_to_tts_chunk buffers the LLM's deltas);
        # split it so one step speaks one sentence and the first one leaves early.
        req = self.requests[request_id]
        sentences, _ = split_sentences(text, final=True)
        req.pending.extend(sentences)
        req.input_done = req.input_done or last

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_work(self) -> bool:
        return any(r.pending or r.input_done for r in self.requests.values())

    # -- work --
    def step(self) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        batch: list[tuple[str, str, list[int]]] = []
        for rid, req in list(self.requests.items()):
            if req.pending and len(batch) < self.max_batch:
                sentence = req.pending.popleft()
                try:
                    batch.append((rid, sentence, self.phonemizer.ids(sentence)))
                except (OSError, subprocess.SubprocessError) as err:
                    self.requests.pop(rid)
                    outputs.append(EngineOutput(rid, {}, finished=True, error=f"espeak-ng: {err}"))
            elif not req.pending and req.input_done:
                # Nothing (left) to say: end the request with an empty latent.
                self.requests.pop(rid)
                outputs.append(EngineOutput(rid, {"latent": empty_latent(), "text": ""}, finished=True))
        if batch:
            latents = self._synthesize([ids for _, _, ids in batch], [self.requests[rid].length_scale for rid, _, _ in batch])
            for (rid, sentence, _), latent in zip(batch, latents, strict=True):
                req = self.requests[rid]
                done = req.input_done and not req.pending
                if done:
                    self.requests.pop(rid)
                outputs.append(EngineOutput(rid, {"latent": latent, "text": sentence}, finished=done))
        return outputs

    def _synthesize(self, id_lists: list[list[int]], length_scales: list[float]) -> list[np.ndarray]:
        # Piper's graph takes one scales vector per run: group requests by speed.
        out: list[np.ndarray | None] = [None] * len(id_lists)
        for scale in sorted(set(length_scales)):
            idx = [i for i, s in enumerate(length_scales) if s == scale]
            lengths = np.array([len(id_lists[i]) for i in idx], dtype=np.int64)
            ids = np.zeros((len(idx), int(lengths.max())), dtype=np.int64)
            for row, i in enumerate(idx):
                ids[row, : lengths[row]] = id_lists[i]
            scales = np.array([self.noise_scale, scale, self.noise_w], dtype=np.float32)
            (latent,) = self.session.run(None, {"input": ids, "input_lengths": lengths, "scales": scales})
            for row, i in enumerate(idx):
                out[i] = _trim_padding(latent[row])
        return [x for x in out if x is not None]

    def close(self) -> None:
        self.phonemizer.close()


def _trim_padding(latent: np.ndarray) -> np.ndarray:
    """Drop the frames past this item's length: the graph masks them to exact zeros."""
    nonzero = np.flatnonzero(np.any(latent != 0.0, axis=0))
    frames = int(nonzero[-1]) + 1 if nonzero.size else 0
    return np.ascontiguousarray(latent[:, :frames], dtype=np.float32)
