"""The LLM_GENERATION stage engine: chunked, batched codec decoding (code2wav, vocoders).

Codes arrive whole (`add`) or chunk by chunk (`feed`, async chunk). Each step
the engine picks, per request, the next window of codes worth decoding:

    [first needed code - left_context, last new code + right_context)

and emits only the samples it has not sent before (an audio delta). A request
may start with context codes (`context_of`: a reference clip the model
continues) that are decoded as left context and never sent. Left
context makes chunk boundaries seamless; right context (lookahead) is for
decoders that are not causal: samples that depend on codes not yet seen are
held back until they arrive or the input ends. Progress is counted in samples,
so a decoder whose output for n codes is a little shorter than
n * samples_per_code (causal transposed convolutions trim their tail) still
joins up exactly.

Chunk policy (a streaming request; every size in codes):
- the first window decodes `first_chunk_size` new codes (small: first audio soon);
  with `first_right_context` below `right_context` (a decoder that is not causal), it
  waits for only that many codes after them and is always cut there, whatever has
  arrived (a seeded request's audio stays independent of timing): first audio comes
  sooner, its last samples near (not equal to) a whole decode's; the samples it decoded
  past them are faded, over one code's samples, into the next window's exact ones;
- the k-th later window wants chunk_size * chunk_growth^(k-1) new codes, capped
  at `max_chunk_size`, and waits until they (plus the lookahead) have arrived;
- a window also takes every further code that is ready, in whole multiples of
  chunk_size, up to `max_chunk_size`: when the codes come faster than they are
  decoded (a fast talker, or many requests sharing the engine) windows grow by
  themselves, so the re-decoded left and right context is paid once per larger
  window;
- once the input has ended the rest is decoded in one window (a streaming
  request's rest in windows of at most 1.5 x max_chunk_size); an adapter that
  decodes some lengths cheapest (`window_lengths`: CUDA graphs captured at load)
  has that last window widened to one of them with more left context, and a
  window before the last widened with more right context where enough codes have
  arrived (a second window, after a short first one, has less left context than
  the rest), so an odd length does not cost a new graph capture.
A request added whole (not streaming) is decoded in one window. Sizes that are
multiples of chunk_size keep windows aligned to a decoder's blocks (Qwen2.5-Omni's
DiT attends in blocks of 12 codes).

Scheduling: one step decodes one batch, so each batch's audio leaves as soon as
it is made and codes that arrive meanwhile join the next windows. The batch is
chosen earliest-deadline-first: a request that has no audio yet is due since it
arrived; a streaming request is due when the audio sent so far, played in real
time from its first chunk, runs out. The most urgent request's window length
(and `batch_key`) picks the batch; it takes the most urgent requests with
windows of that length, at most `max_batch_codes` window codes in all (past a
size that fits the CPU caches a batched decode is slower than the same windows
a few at a time). A request cannot be starved: new arrivals are due no earlier
than their arrival.

First-chunk priority (`engine_extras["first_chunk_priority"]`, default on): a
window of a request that has sent no audio yet (its first window, small) goes
before every later window, whatever the deadlines say, so a new request's first
audio never waits behind other requests' bulk. A step that has first windows
decodes only first windows (they fill `max_batch_codes` first); the bulk goes
the next step, so a first window waits for at most the one decode already
running. Bulk is not starved: after MAX_FIRST_ONLY_STEPS first-only steps in a
row while bulk waited, one step goes by deadline alone. Priority changes the
order of decodes, not what is decoded: a delayed later window may take more
ready codes, and chunked decoding joins up the same whatever the boundaries
(see above). Off, the order is pure earliest-deadline-first.

Everything model-specific (loading, how codes are read from a payload, the
decode itself, per-request conditioning) sits in a `GenerationAdapter` named by
`engine_extras["adapter"]`. `engine_extras` may override `chunk_size`,
`first_chunk_size`, `left_context`, `right_context`, `first_right_context`, `chunk_growth`,
`max_chunk_size` and `max_batch_codes`; the adapter's class attributes are the
defaults. `first_chunk_priority` (bool) is the engine's own.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_actors.workers.engine import (
    TORCH_PRELOAD,
    EngineContext,
    EngineOutput,
    StageEngine,
    first_chunk_priority,
)
from omni_actors.workers.engines.generation_adapter import (
    FINAL_WINDOW_SLACK,
    ChunkPolicy,
    GenerationAdapter,
)
from omni_actors.workers.engines.torch_setup import one_cpu_thread

MAX_FIRST_ONLY_STEPS = 8
"""First-only steps in a row (bulk windows waiting) before one step is chosen by deadline alone."""


@dataclass
class _Req:
    data: Any
    order: int
    arrived: float
    codes: list[torch.Tensor] = field(default_factory=list)
    total: int = 0
    emitted: int = 0
    """Samples sent so far."""
    decoded_codes: int = 0
    """Codes whose audio has been (at least partly) decoded."""
    chunks: int = 0
    """Streaming windows decoded so far (not counting the last)."""
    first_audio: float | None = None
    input_done: bool = False
    streaming: bool = False
    tail: np.ndarray | None = None
    """A short first window's samples past what it sent (close to the next window's first
    ones), faded into them (`_fade`)."""


_Window = tuple[int, int, int, bool]
"""(start, new_end, end, final) of one decode, in codes."""
_Due = tuple[float, int, str, _Req, _Window]
"""(deadline, arrival order, request id, request, window) of a window that may be decoded now."""


class GenerationEngine(StageEngine):
    """Batched, streaming codec decoder over a model adapter (see module docstring)."""

    ZYGOTE_PRELOAD = TORCH_PRELOAD

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        one_cpu_thread(ctx)
        self.adapter: GenerationAdapter = self.make_adapter()
        self.adapter.load()
        extras = ctx.engine_extras
        self.policy = ChunkPolicy.of(self.adapter, extras)
        cap = extras.get("max_batch_codes", self.adapter.max_batch_codes)
        self.max_batch_codes = int(cap) if cap else None
        self.first_priority = first_chunk_priority(extras)
        self._first_only_run = 0
        """First-only steps in a row that left bulk windows waiting."""
        self.reqs: dict[str, _Req] = {}
        self._order = itertools.count()

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        req = _Req(
            self.adapter.start(inputs, self.merged_sampling(params)),
            order=next(self._order), arrived=time.monotonic(),
            input_done=not streaming, streaming=streaming,
        )  # fmt: skip
        self._append(req, inputs)
        self.reqs[request_id] = req

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        req = self.reqs.get(request_id)
        if req is None:
            return
        self._append(req, inputs)
        req.input_done = req.input_done or last

    def _append(self, req: _Req, inputs: dict[str, Any]) -> None:
        context = self.adapter.context_of(inputs)
        if context is not None and context.shape[0]:
            if req.total:
                raise ValueError("context codes came after the request's first codes")
            req.codes.append(torch.as_tensor(context).clone())
            req.total = req.decoded_codes = context.shape[0]
            req.emitted = req.total * self.adapter.samples_per_code  # as if sent: never audio of its own
        codes = self.adapter.codes_of(inputs)
        if codes is not None and codes.shape[0]:
            req.codes.append(torch.as_tensor(codes).clone())
            req.total += codes.shape[0]

    def abort(self, request_id: str) -> None:
        self.reqs.pop(request_id, None)

    def has_work(self) -> bool:
        return any(self._window(r) is not None for r in self.reqs.values())

    def first_output_next(self) -> bool:
        """A request without audio has a window due (with first-chunk priority, the next step
        decodes first windows only)."""
        return any(r.first_audio is None and self._window(r) is not None for r in self.reqs.values())

    def _window(self, req: _Req) -> _Window | None:
        """The next decode of `req`, or None if nothing is due."""
        pol = self.policy
        if pol.short_first and req.streaming and req.chunks == 0:
            # cut at first_window codes whenever it is decoded, so the audio does not depend on timing
            new_end = req.decoded_codes + pol.first_chunk_size
            end = new_end + pol.first_right_context
            if end < req.total or (end == req.total and not req.input_done):
                return max(0, req.decoded_codes - pol.left_context), new_end, end, False
            if not req.input_done:
                return None
        if req.input_done:
            if req.total == 0:
                return (0, 0, 0, True)
            new_end = req.total  # also flushes held-back samples
            rest = req.total - req.decoded_codes
            if req.streaming and rest > FINAL_WINDOW_SLACK * pol.cap:
                new_end = req.decoded_codes + pol.cap
        else:
            ready = req.total - pol.right_context
            new = pol.new_codes(req.chunks, ready - req.decoded_codes)
            if not new:
                return None
            new_end = req.decoded_codes + new
        final = new_end == req.total and req.input_done
        first = req.emitted // self.adapter.samples_per_code
        start = max(0, first - pol.left_context)
        end = req.total if final else min(req.total, new_end + pol.right_context)
        if final:
            start = self._widen(start, end)
        else:
            end = self._reach(start, end, req.total)
        return start, new_end, end, final

    def _preferred(self, width: int) -> int | None:
        """The shortest of the adapter's window lengths that holds `width` codes (None: none does)."""
        return next((n for n in self.adapter.window_lengths() if n >= width), None)

    def _widen(self, start: int, end: int) -> int:
        """`start`, moved back so [start, end) is one of the adapter's window lengths, if it can be."""
        n = self._preferred(end - start)
        return end - n if n is not None and end >= n else start

    def _reach(self, start: int, end: int, total: int) -> int:
        """`end` of a window that keeps audio only up to its new codes, moved on (more right
        context, from codes already here) so [start, end) is one of the adapter's window lengths,
        if it can be: a second window has less left context than the standard ones."""
        n = self._preferred(end - start)
        return start + n if n is not None and start + n <= total else end

    def _deadline(self, req: _Req) -> float:
        """When the request's listener runs out of audio (its arrival if it has none yet)."""
        if req.first_audio is None:
            return req.arrived
        return req.first_audio + req.emitted / self.adapter.sample_rate

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        due: list[_Due] = []
        for rid, req in self.reqs.items():
            win = self._window(req)
            if win is None:
                continue
            if win[2] - win[0] <= 0:  # input ended with nothing left to decode
                outputs.append(self._finish(rid, np.zeros(0, np.float32)))
                continue
            due.append((self._deadline(req), req.order, rid, req, win))
        if due:
            outputs.extend(self._decode_group(self._batch(self._by_priority(due))))
        for out in outputs:
            if out.finished:
                self.reqs.pop(out.request_id, None)
        return outputs

    def _by_priority(self, due: list[_Due]) -> list[_Due]:
        """`due` most urgent first: first windows, then by deadline (module docstring)."""
        due.sort(key=lambda d: (d[0], d[1]))
        if not self.first_priority:
            return due
        first = [d for d in due if d[3].first_audio is None]
        if not first or len(first) == len(due):
            self._first_only_run = 0
            return due
        if self._first_only_run >= MAX_FIRST_ONLY_STEPS:  # bulk has waited long enough
            self._first_only_run = 0
            return due
        self._first_only_run += 1
        return first  # this step decodes first windows only; the bulk goes next step

    def _batch(self, due: list[_Due]) -> list[tuple[str, _Req, _Window]]:
        """The most urgent window and the next most urgent ones of the same length and key."""

        def key(d: _Due) -> tuple[int, Any]:
            return d[4][2] - d[4][0], self.adapter.batch_key(d[3].data)

        head = key(due[0])
        length = head[0]
        limit = len(due)
        if self.max_batch_codes:
            limit = max(1, self.max_batch_codes // max(1, length))
        members = [d for d in due if key(d) == head][:limit]
        return [(rid, req, win) for _, _, rid, req, win in members]

    def _decode_group(self, members: list[tuple[str, _Req, _Window]]) -> list[EngineOutput]:
        spc = self.adapter.samples_per_code
        windows, starts, keep = [], [], []
        for _, req, (start, new_end, end, final) in members:
            codes = torch.cat(req.codes) if len(req.codes) > 1 else req.codes[0]
            req.codes = [codes]
            windows.append(codes[start:end])
            starts.append(start)
            keep.append((req.emitted // spc - start, None if final else new_end - start))
        data = [req.data for _, req, _ in members]
        wavs = self.adapter.decode_part(windows, starts, data, keep)
        now = time.monotonic()
        outputs = []
        for (rid, req, (start, new_end, _end, final)), (wav, offset) in zip(
            members, wavs, strict=True
        ):
            wav = wav.reshape(-1).float().cpu()
            base = start * spc + offset  # absolute sample of wav[0]
            if req.emitted < base:
                raise RuntimeError(f"adapter skipped audio still to be sent ({rid})")
            stop = wav.shape[0] if final else min(wav.shape[0], new_end * spc - base)
            delta = wav[req.emitted - base : stop].numpy().astype(np.float32, copy=False)
            if req.tail is not None:
                delta = self._fade(req, delta)
            elif not final and req.chunks == 0 and self.policy.short_first:
                req.tail = wav[stop : stop + spc].numpy().astype(np.float32)
            req.emitted += delta.shape[0]
            req.decoded_codes = new_end
            if delta.shape[0] and req.first_audio is None:
                req.first_audio = now
            if final:
                outputs.append(self._finish(rid, delta))
            else:
                req.chunks += 1
                outputs.append(EngineOutput(rid, self._payload(delta)))
        return outputs

    @staticmethod
    def _fade(req: _Req, delta: np.ndarray) -> np.ndarray:
        """`delta` (the audio after a short first window's) faded in from that window's tail over
        the tail's length (one code's samples): no step where its approximate end meets the exact rest."""
        tail, req.tail = req.tail, None
        n = min(len(tail), len(delta))
        ramp = np.arange(1, n + 1, dtype=np.float32) / (n + 1)
        delta = delta.copy()
        delta[:n] = tail[:n] * (1 - ramp) + delta[:n] * ramp
        return delta

    def _payload(self, audio: np.ndarray) -> dict[str, Any]:
        return {"audio": audio, "sample_rate": self.adapter.sample_rate}

    def _finish(self, rid: str, audio: np.ndarray) -> EngineOutput:
        return EngineOutput(rid, self._payload(audio), finished=True)

    def close(self) -> None:
        self.reqs.clear()
