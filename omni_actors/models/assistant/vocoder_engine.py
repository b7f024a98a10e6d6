"""Stage engine "vocoder": Piper's HiFi-GAN decoder, latent chunks in, audio deltas out.

The decoder is convolutional with a receptive field of about +-10 latent frames.
Each step decodes, per request, the next `chunk_frames` frames that are
followed by at least `lookahead` received frames (or that end the input),
inside a window widened by `left_context` frames already sent and the
lookahead; only the chunk's own samples are emitted. So the concatenated
output equals decoding the whole latent at once (within ~1e-6 with the
defaults) and nothing is decoded for output twice. Requests whose windows have
the same length are decoded in one batched run.

Inputs: {"latent": float32 [192, frames] (or [1, 192, frames])}; streaming
requests get more through `feed`. Outputs: {"audio": float32 [samples],
"sample_rate": 22050}. engine_extras: `chunk_frames` (32, ~0.37 s of audio),
`left_context` (16), `lookahead` (16), `threads` (1), `max_batch` (max_num_seqs).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.models.assistant.piper_engine import (
    HOP_SAMPLES,
    LATENT_INPUT,
    as_latent,
    empty_latent,
    load_voice,
    onnx_session,
)
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine


@dataclass
class _Request:
    frames: np.ndarray = field(default_factory=empty_latent)
    """Received latent frames from `offset` on (older ones are no longer needed)."""
    offset: int = 0
    sent: int = 0
    """Frames whose audio has been emitted."""
    input_done: bool = False

    @property
    def received(self) -> int:
        return self.offset + self.frames.shape[1]


class PiperVocoderEngine(StageEngine):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        if ctx.model_path is None:
            raise ValueError("vocoder stage needs a model path (the prepared vocoder/ folder)")
        extras = ctx.engine_extras
        self.sample_rate = int(load_voice(ctx.model_path)["audio"]["sample_rate"])
        self.chunk_frames = int(extras.get("chunk_frames", 32))
        self.left_context = int(extras.get("left_context", 16))
        self.lookahead = int(extras.get("lookahead", 16))
        self.max_batch = int(extras.get("max_batch", ctx.max_num_seqs))
        if self.chunk_frames < 1 or self.left_context < 0 or self.lookahead < 0:
            raise ValueError("vocoder: chunk_frames >= 1, left_context >= 0, lookahead >= 0")
        self.session = onnx_session(ctx.model_path, ctx.device, int(extras.get("threads", 1)))
        self.requests: dict[str, _Request] = {}

    # -- requests --
    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        self.requests[request_id] = _Request()
        if not streaming:  # a streaming request's latents come only through `feed`
            self._take(request_id, inputs, last=True)

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        if request_id in self.requests:
            self._take(request_id, inputs, last)

    def _take(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        req = self.requests[request_id]
        latent = inputs.get("latent")
        if latent is not None:
            req.frames = np.concatenate([req.frames, as_latent(latent)], axis=1)
        req.input_done = req.input_done or last

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def _next_end(self, req: _Request) -> int:
        """End (exclusive) of the next chunk to emit; == req.sent when none is ready."""
        ready = req.received if req.input_done else req.received - self.lookahead
        return max(req.sent, min(ready, req.sent + self.chunk_frames))

    def has_work(self) -> bool:
        return any(
            self._next_end(r) > r.sent or (r.input_done and r.sent >= r.received)
            for r in self.requests.values()
        )

    # -- work --
    def step(self) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        groups: dict[int, list[tuple[str, int, int, int]]] = defaultdict(list)
        taken = 0
        for rid, req in list(self.requests.items()):
            end = self._next_end(req)
            if end > req.sent and taken < self.max_batch:
                lo = max(0, req.sent - self.left_context)
                hi = min(req.received, end + self.lookahead)
                groups[hi - lo].append((rid, lo, hi, end))
                taken += 1
            elif end == req.sent and req.input_done and req.sent >= req.received:
                self.requests.pop(rid)
                outputs.append(EngineOutput(rid, self._audio(np.zeros(0, np.float32)), finished=True))
        for items in groups.values():
            windows = np.stack([self._window(self.requests[rid], lo, hi) for rid, lo, hi, _ in items])
            (audio,) = self.session.run(None, {LATENT_INPUT: windows})
            audio = audio.reshape(len(items), -1)
            for row, (rid, lo, _, end) in enumerate(items):
                req = self.requests[rid]
                chunk = audio[row, (req.sent - lo) * HOP_SAMPLES : (end - lo) * HOP_SAMPLES]
                req.sent = end
                self._forget(req)
                done = req.input_done and req.sent >= req.received
                if done:
                    self.requests.pop(rid)
                outputs.append(EngineOutput(rid, self._audio(chunk), finished=done))
        return outputs

    @staticmethod
    def _window(req: _Request, lo: int, hi: int) -> np.ndarray:
        return req.frames[:, lo - req.offset : hi - req.offset]

    def _forget(self, req: _Request) -> None:
        keep_from = max(req.offset, req.sent - self.left_context)
        if keep_from > req.offset:
            req.frames = req.frames[:, keep_from - req.offset :].copy()
            req.offset = keep_from

    def _audio(self, samples: np.ndarray) -> dict[str, Any]:
        return {"audio": np.ascontiguousarray(samples, dtype=np.float32), "sample_rate": self.sample_rate}
