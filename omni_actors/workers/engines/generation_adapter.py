"""The model-specific half of the LLM_GENERATION engine (generation.py): `GenerationAdapter`
(loading, reading codes from payloads, the decode itself, per-request conditioning),
`FrameCodecAdapter` (a codec whose payloads carry frames of codes, decoded from CUDA graphs of
padded buckets when it is causal, of its chunk policy's window lengths when it is not;
codec_graphs.py), and `ChunkPolicy`, the window sizes an adapter's class attributes and
`engine_extras` set (the policy itself: generation.py's docstring).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni_actors.workers.engine import EngineContext, timed
from omni_actors.workers.engines.codec_graphs import CodecGraphs
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted

FINAL_WINDOW_SLACK = 1.5
"""A streaming request's rest (input ended) goes in one window up to this x max_chunk_size."""


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
    first_right_context: int | None = None
    """Right context of a streamed request's first window (None: right_context). Less than
    right_context: first audio right_context - first_right_context codes sooner, its last samples
    close to (not equal to) a whole decode's, faded into the next window's (generation.py)."""
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
        # A bus payload is a read-only view: torch cannot share it (it warned, once per worker), so it is
        # copied once, into `dtype`; a writable array of `dtype` is shared as before.
        arr = np.require(np.asarray(inputs[key]), torch.empty(0, dtype=dtype).numpy().dtype, "W")
        return torch.from_numpy(arr).reshape(-1, width)

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
        return self._codec_graphs(decode, {})

    def window_graphs(self, decode: Callable[[torch.Tensor], torch.Tensor]) -> CodecGraphs:
        """`causal_graphs` for a decoder that is not causal: graphs of the exact window lengths
        the chunk policy makes (`ChunkPolicy.window_lengths`), rows padded only; the engine widens
        a window to one of them where it has the codes (`window_lengths`), others run eagerly."""
        lengths = ChunkPolicy.of(self, self.ctx.engine_extras).window_lengths()
        return self._codec_graphs(decode, {"lengths": lengths, "pad_length": False})

    def window_lengths(self) -> tuple[int, ...]:
        """The lengths `window_graphs` captured (a causal codec's padded buckets take any length: none)."""
        graphs = getattr(self, "graphs", None)
        if graphs is None or not graphs.enabled or graphs.pad_length:
            return ()
        return graphs.lengths

    def _codec_graphs(self, decode: Callable[[torch.Tensor], torch.Tensor], shapes: dict[str, Any]) -> CodecGraphs:
        graphs = CodecGraphs(
            decode, self.groups, self.samples_per_code, self.ctx.device, self.ctx.max_num_seqs,
            cuda_graphs_wanted(self.ctx), **shapes,
        )  # fmt: skip
        if graphs.enabled:
            policy = ChunkPolicy.of(self, self.ctx.engine_extras)
            with timed(self.ctx, "cuda_graphs"):
                graphs.warm(policy.first_window)
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
    first_right_context: int
    chunk_growth: float
    max_chunk_size: int

    @classmethod
    def of(cls, adapter: GenerationAdapter, extras: dict[str, Any]) -> ChunkPolicy:
        def get(name: str) -> Any:
            return extras.get(name, getattr(adapter, name))

        chunk = int(get("chunk_size"))
        cap, right, first_right = get("max_chunk_size"), int(get("right_context")), get("first_right_context")
        policy = cls(
            chunk_size=chunk, first_chunk_size=int(get("first_chunk_size")),
            left_context=int(get("left_context")), right_context=right,
            first_right_context=right if first_right is None else int(first_right),
            chunk_growth=float(get("chunk_growth")),
            max_chunk_size=int(cap) if cap else 4 * chunk,
        )  # fmt: skip
        if policy.chunk_size < 1 or policy.first_chunk_size < 1:
            raise ValueError("chunk_size and first_chunk_size must be at least 1")
        if policy.left_context < 0 or policy.right_context < 0:
            raise ValueError("left_context and right_context must not be negative")
        if not 0 <= policy.first_right_context <= policy.right_context:
            raise ValueError(
                f"first_right_context must be between 0 and right_context ({policy.right_context}), "
                f"got {policy.first_right_context}"
            )
        if policy.chunk_growth < 1:
            raise ValueError(f"chunk_growth must be at least 1, got {policy.chunk_growth}")
        if policy.max_chunk_size < policy.chunk_size:
            raise ValueError(
                f"max_chunk_size ({policy.max_chunk_size}) must be at least "
                f"chunk_size ({policy.chunk_size})"
            )
        return policy

    @property
    def first_window(self) -> int:
        """Codes in a streamed request's first window (its new codes and their right context)."""
        return self.first_chunk_size + self.first_right_context

    @property
    def short_first(self) -> bool:
        """The first window's right context is cut short (first_right_context < right_context)."""
        return self.first_right_context < self.right_context

    @property
    def cap(self) -> int:
        """max_chunk_size rounded down to whole chunks."""
        return self.max_chunk_size // self.chunk_size * self.chunk_size

    def window_lengths(self) -> tuple[int, ...]:
        """The window lengths a long streamed request's decodes have: its first window; later
        ones of whole chunks after the first window's codes (while they start at code 0, with
        less than left_context before them) or between the two contexts; the longest last window
        (its rest; a shorter rest is widened to one of these by more left context)."""
        chunks = range(1, self.cap // self.chunk_size + 2)
        first = self.first_chunk_size + self.right_context
        lengths = {self.first_window} | {first + k * self.chunk_size for k in chunks}
        lengths |= {self.left_context + k * self.chunk_size + self.right_context for k in chunks[:-1]}
        lengths.add(self.left_context + int(FINAL_WINDOW_SLACK * self.cap))
        return tuple(sorted(lengths))

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
