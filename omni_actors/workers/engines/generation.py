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
  has that last window widened to one of them with more left context, so an
  utterance's odd length does not cost a new graph capture.
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
`first_chunk_size`, `left_context`, `right_context`, `chunk_growth`,
`max_chunk_size` and `max_batch_codes`; the adapter's class attributes are the
defaults. `first_chunk_priority` (bool) is the engine's own.
"""

from __future__ import annotations

import abc
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_actors.workers.engine import (
    EngineContext,
    EngineOutput,
    StageEngine,
    first_chunk_priority,
    timed,
)
from omni_actors.workers.engines.codec_graphs import CodecGraphs
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted
from omni_actors.workers.engines.torch_setup import one_cpu_thread

FINAL_WINDOW_SLACK = 1.5
"""A streaming request's rest (input ended) goes in one window up to this x max_chunk_size."""
MAX_FIRST_ONLY_STEPS = 8
"""First-only steps in a row (bulk windows waiting) before one step is chosen by deadline alone."""


class GenerationAdapter(abc.ABC):
    """Model-specific half of GenerationEngine. One instance per engine."""

    sample_rate: int = 24000
    samples_per_code: int = 1
    chunk_size: int = 25
    """New codes in a request's second decode; later ones grow from it (chunk_growth)."""
    first_chunk_size: int = 10
    """New codes in a request's first decode (smaller: first audio sooner)."""
    left_context: int = 25
    right_context: int = 0
    chunk_growth: float = 2.0
    """Each later window wants this many times the previous one's new codes (1: fixed size)."""
    max_chunk_size: int | None = None
    """Most new codes in one streaming window; None: 4 x chunk_size."""
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

    def context_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """Codes to put before a request's own (a reference clip's, when the model continues it): decoded
        as left context, their audio never sent. Only in a request's first payload; None without."""
        return None

    def frames_of(
        self, inputs: dict[str, Any], key: str, width: int, dtype: torch.dtype = torch.long
    ) -> torch.Tensor | None:
        """inputs[key] as [time, width] `dtype` (a `codes_of` for frames of `width` values); None without it."""
        if key not in inputs:
            return None
        return torch.as_tensor(np.asarray(inputs[key]), dtype=dtype).reshape(-1, width)

    @abc.abstractmethod
    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        """Decode equal-length code windows (starting at absolute code `starts`) to 1-D waveforms."""

    def decode_part(
        self,
        windows: list[torch.Tensor],
        starts: list[int],
        data: list[Any],
        keep: list[tuple[int, int | None]],
    ) -> list[tuple[torch.Tensor, int]]:
        """`decode`, when only the audio of window codes [lo, hi) (hi None: to the end) is kept.

        Returns each waveform with the window sample its first sample is (at most
        lo * samples_per_code). An adapter may skip work outside the kept codes (and its
        receptive field); the default decodes everything.
        """
        return [(wav, 0) for wav in self.decode(windows, starts, data)]

    def batch_key(self, data: Any) -> Any:
        """Requests whose keys differ are never decoded in one batch."""
        return None

    def window_lengths(self) -> tuple[int, ...]:
        """Window lengths (codes, ascending) this adapter decodes cheapest, say as captured CUDA
        graphs; empty (the default): no preference. A request's last window, shorter than one of
        them, is widened to the shortest that fits by taking more left context (earlier codes,
        whose audio is not sent again), when the request has that many codes."""
        return ()


class FrameCodecAdapter(GenerationAdapter):
    """A codec decoder whose payloads carry frames of `groups` codes under "codes" (set `groups`
    in `load`); `device_codes` stacks a batch's windows as the decoders take them."""

    groups: int
    eager_windows: dict[str, int] = {}
    """Window sizes (ChunkPolicy fields) over the class's when `causal_graphs` runs decodes
    eagerly (off CUDA, or graphs off): small windows pay only where a decode is a cheap replay;
    eager, each costs a whole decode's dispatch and compute. engine_extras override both."""

    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return self.frames_of(inputs, "codes", self.groups)

    def device_codes(self, windows: list[torch.Tensor]) -> torch.Tensor:
        """Equal-length [time, groups] windows -> [batch, groups, time] on the stage's device."""
        return torch.stack(windows).transpose(1, 2).to(self.ctx.device)

    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        """The windows through the `graphs` that `causal_graphs` made in `load` (an adapter that
        does not call it decodes by itself)."""
        return list(self.graphs.run(self.device_codes(windows)))

    def causal_graphs(self, decode: Callable[[torch.Tensor], torch.Tensor]) -> CodecGraphs:
        """`decode` ([batch, groups, length] codes on the device -> [batch, samples]) of a causal
        decoder, run from CUDA graphs of padded buckets (codec_graphs.py) under engine_extras
        cuda_graphs (default on CUDA); every bucket is captured now, a first window's first. Call in `load`,
        after `groups` and samples_per_code are set."""
        graphs = CodecGraphs(
            decode, self.groups, self.samples_per_code, self.ctx.device, self.ctx.max_num_seqs,
            cuda_graphs_wanted(self.ctx),
        )  # fmt: skip
        if graphs.enabled:
            policy = ChunkPolicy.of(self, self.ctx.engine_extras)
            with timed(self.ctx, "cuda_graphs"):
                graphs.warm(policy.first_chunk_size + policy.right_context)
        if not graphs.enabled:  # (also when a capture failed while warming)
            for name, value in self.eager_windows.items():
                setattr(self, name, value)
        return graphs


@dataclass(frozen=True)
class ChunkPolicy:
    """Window sizes in codes (see the module docstring), validated."""

    chunk_size: int
    first_chunk_size: int
    left_context: int
    right_context: int
    chunk_growth: float
    max_chunk_size: int

    @classmethod
    def of(cls, adapter: GenerationAdapter, extras: dict[str, Any]) -> ChunkPolicy:
        def get(name: str) -> Any:
            return extras.get(name, getattr(adapter, name))

        chunk = int(get("chunk_size"))
        cap = get("max_chunk_size")
        policy = cls(
            chunk_size=chunk, first_chunk_size=int(get("first_chunk_size")),
            left_context=int(get("left_context")), right_context=int(get("right_context")),
            chunk_growth=float(get("chunk_growth")),
            max_chunk_size=int(cap) if cap else 4 * chunk,
        )  # fmt: skip
        if policy.chunk_size < 1 or policy.first_chunk_size < 1:
            raise ValueError("chunk_size and first_chunk_size must be at least 1")
        if policy.left_context < 0 or policy.right_context < 0:
            raise ValueError("left_context and right_context must not be negative")
        if policy.chunk_growth < 1:
            raise ValueError(f"chunk_growth must be at least 1, got {policy.chunk_growth}")
        if policy.max_chunk_size < policy.chunk_size:
            raise ValueError(
                f"max_chunk_size ({policy.max_chunk_size}) must be at least "
                f"chunk_size ({policy.chunk_size})"
            )
        return policy

    @property
    def cap(self) -> int:
        """max_chunk_size rounded down to whole chunks."""
        return self.max_chunk_size // self.chunk_size * self.chunk_size

    def new_codes(self, chunks_done: int, available: int) -> int:
        """New codes for a streaming window after `chunks_done` windows; 0: not yet due."""
        if chunks_done == 0:
            return self.first_chunk_size if available >= self.first_chunk_size else 0
        size, cap = self.chunk_size, self.cap
        growth = self.chunk_growth ** min(chunks_done - 1, 64)
        want = min(cap, size * int(growth))
        if available < want:
            return 0
        return min(cap, want + (available - want) // size * size)


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


_Window = tuple[int, int, int, bool]
"""(start, new_end, end, final) of one decode, in codes."""
_Due = tuple[float, int, str, _Req, _Window]
"""(deadline, arrival order, request id, request, window) of a window that may be decoded now."""


class GenerationEngine(StageEngine):
    """Batched, streaming codec decoder over a model adapter (see module docstring)."""

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

    def _window(self, req: _Req) -> _Window | None:
        """The next decode of `req`, or None if nothing is due."""
        pol = self.policy
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
        return start, new_end, end, final

    def _widen(self, start: int, end: int) -> int:
        """`start`, moved back so [start, end) is one of the adapter's window lengths, if it can be."""
        for n in self.adapter.window_lengths():
            if n >= end - start:
                return end - n if end >= n else start
        return start

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

    def _payload(self, audio: np.ndarray) -> dict[str, Any]:
        return {"audio": audio, "sample_rate": self.adapter.sample_rate}

    def _finish(self, rid: str, audio: np.ndarray) -> EngineOutput:
        return EngineOutput(rid, self._payload(audio), finished=True)

    def close(self) -> None:
        self.reqs.clear()
