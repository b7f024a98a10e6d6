"""The LLM_GENERATION stage engine: chunked, batched codec decoding (code2wav, vocoders).

Codes arrive whole (`add`) or chunk by chunk (`feed`, async chunk). Each step
the engine picks, per request, the next window of codes worth decoding:

    [first needed code - left_context, last new code + right_context)

decodes all windows of the same length in one batched call, and emits only
the samples it has not sent before (an audio delta). Left context makes chunk
boundaries seamless; right context (lookahead) is for decoders that are not
causal: samples that depend on codes not yet seen are held back until they
arrive or the input ends. Progress is counted in samples, so a decoder whose
output for n codes is a little shorter than n * samples_per_code (causal
transposed convolutions trim their tail) still joins up exactly.

Everything model-specific (loading, how codes are read from a payload, the
decode itself, per-request conditioning) sits in a `GenerationAdapter` named by
`engine_extras["adapter"]`. `engine_extras` may override `chunk_size`,
`first_chunk_size`, `left_context`, `right_context` and `max_batch_codes` (in codes).

Batches are capped at `max_batch_codes` window codes in all: past a size that
fits the CPU caches a vocoder's activations make a batched decode slower than
the same windows decoded a few at a time (measured for Qwen2.5-Omni's
BigVGAN: 8 windows of 320 codes took 14x one window, not 8x).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine


class GenerationAdapter(abc.ABC):
    """Model-specific half of GenerationEngine. One instance per engine."""

    sample_rate: int = 24000
    samples_per_code: int = 1
    chunk_size: int = 25
    """New codes decoded per step once a request is streaming."""
    first_chunk_size: int = 10
    """New codes in a request's first decode (smaller: first audio sooner)."""
    left_context: int = 25
    right_context: int = 0
    max_batch_codes: int | None = None
    """Most window codes (summed over the batch) one `decode` call gets; None: no limit."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def load(self) -> None:
        """Load weights from ctx.model_path (decode in float32 where the model needs it)."""

    def start(self, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        """Per-request conditioning kept for the request's life (speaker, seed, ...)."""
        return None

    @abc.abstractmethod
    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """Codes in one input payload, time on axis 0; None when it carries none."""

    @abc.abstractmethod
    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        """Decode equal-length code windows (starting at absolute code `starts`) to 1-D waveforms."""

    def batch_key(self, data: Any) -> Any:
        """Requests whose keys differ are never decoded in one batch."""
        return None


@dataclass
class _Req:
    data: Any
    codes: list[torch.Tensor] = field(default_factory=list)
    total: int = 0
    emitted: int = 0
    """Samples sent so far."""
    decoded_codes: int = 0
    """Codes whose audio has been (at least partly) decoded."""
    input_done: bool = False


class GenerationEngine(StageEngine):
    """Batched, streaming codec decoder over a model adapter (see module docstring)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        if ctx.device == "cpu":
            torch.set_num_threads(1)
        self.adapter: GenerationAdapter = self.make_adapter()
        self.adapter.load()
        extras = ctx.engine_extras
        a = self.adapter
        self.chunk_size = int(extras.get("chunk_size", a.chunk_size))
        self.first_chunk_size = int(extras.get("first_chunk_size", a.first_chunk_size))
        self.left_context = int(extras.get("left_context", a.left_context))
        self.right_context = int(extras.get("right_context", a.right_context))
        cap = extras.get("max_batch_codes", a.max_batch_codes)
        self.max_batch_codes = int(cap) if cap else None
        self.reqs: dict[str, _Req] = {}

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        req = _Req(
            self.adapter.start(inputs, self.merged_sampling(params)), input_done=not streaming
        )
        self._append(req, inputs)
        self.reqs[request_id] = req

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        req = self.reqs.get(request_id)
        if req is None:
            return
        self._append(req, inputs)
        req.input_done = req.input_done or last

    def _append(self, req: _Req, inputs: dict[str, Any]) -> None:
        codes = self.adapter.codes_of(inputs)
        if codes is not None and codes.shape[0]:
            req.codes.append(torch.as_tensor(codes).clone())
            req.total += codes.shape[0]

    def abort(self, request_id: str) -> None:
        self.reqs.pop(request_id, None)

    def has_work(self) -> bool:
        return any(self._window(r) is not None for r in self.reqs.values())

    def _window(self, req: _Req) -> tuple[int, int, int, bool] | None:
        """(start, new_end, end, final) of the next decode, or None if nothing is due."""
        if req.input_done:
            if req.total == 0:
                return (0, 0, 0, True)
            new_end, final = req.total, True  # also flushes held-back samples
        else:
            want = self.chunk_size if req.emitted else self.first_chunk_size
            ready = req.total - self.right_context
            if ready - req.decoded_codes < want:
                return None
            new_end, final = req.decoded_codes + want, False
        first = req.emitted // self.adapter.samples_per_code
        start = max(0, first - self.left_context)
        end = req.total if final else new_end + self.right_context
        return start, new_end, end, final

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        groups: dict[Any, list[tuple[str, _Req, tuple[int, int, int, bool]]]] = {}
        finished_empty: list[EngineOutput] = []
        for rid, req in self.reqs.items():
            win = self._window(req)
            if win is None:
                continue
            if win[2] - win[0] <= 0:  # input ended with nothing left to decode
                finished_empty.append(self._finish(rid, np.zeros(0, np.float32)))
                continue
            key = (win[2] - win[0], self.adapter.batch_key(req.data))
            groups.setdefault(key, []).append((rid, req, win))
        outputs = finished_empty
        for (length, _), members in groups.items():
            per_batch = len(members)
            if self.max_batch_codes:
                per_batch = max(1, self.max_batch_codes // max(1, length))
            for i in range(0, len(members), per_batch):
                outputs.extend(self._decode_group(members[i : i + per_batch]))
        for out in outputs:
            if out.finished:
                self.reqs.pop(out.request_id, None)
        return outputs

    def _decode_group(
        self, members: list[tuple[str, _Req, tuple[int, int, int, bool]]]
    ) -> list[EngineOutput]:
        windows, starts = [], []
        for _, req, (start, _, end, _) in members:
            codes = torch.cat(req.codes) if len(req.codes) > 1 else req.codes[0]
            req.codes = [codes]
            windows.append(codes[start:end])
            starts.append(start)
        wavs = self.adapter.decode(windows, starts, [req.data for _, req, _ in members])
        spc = self.adapter.samples_per_code
        outputs = []
        for (rid, req, (start, new_end, _end, final)), wav in zip(members, wavs, strict=True):
            wav = wav.reshape(-1).float().cpu()
            stop = wav.shape[0] if final else min(wav.shape[0], (new_end - start) * spc)
            delta = wav[req.emitted - start * spc : stop].numpy().astype(np.float32, copy=False)
            req.emitted += delta.shape[0]
            req.decoded_codes = new_end
            if final:
                outputs.append(self._finish(rid, delta))
            else:
                outputs.append(EngineOutput(rid, self._payload(delta)))
        return outputs

    def _payload(self, audio: np.ndarray) -> dict[str, Any]:
        return {"audio": audio, "sample_rate": self.adapter.sample_rate}

    def _finish(self, rid: str, audio: np.ndarray) -> EngineOutput:
        return EngineOutput(rid, self._payload(audio), finished=True)

    def close(self) -> None:
        self.reqs.clear()
