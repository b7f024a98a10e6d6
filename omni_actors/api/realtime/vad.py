"""Server VAD: silero-vad's packaged ONNX model, 32 ms windows at 16 kHz, turn boundaries.

    detector = VadDetector(params)         # one per session; the ONNX session is shared
    for ev in detector.feed(samples_16k):  # plain def, pure CPU; callers run big feeds in a thread
        VadEvent(kind="start"|"stop", sample=...)

`start` is reported at the first window whose speech probability reaches
`threshold`; its `sample` is that window's start minus `prefix_padding_ms`.
`stop` is reported once speech has been absent (probability under
threshold - NEG_MARGIN) for `silence_duration_ms`; its `sample` is the end of
that silence. Samples count from the start of the session's input audio.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

VAD_RATE = 16_000
WINDOW = 512
"""Samples per silero window at 16 kHz (32 ms)."""
CONTEXT = 64
"""Samples of the previous window that silero v5+ expects in front of each window."""
NEG_MARGIN = 0.15
"""Hysteresis: speech continues until the probability drops this far under threshold."""
MODEL_FILE = "silero_vad.onnx"


@functools.cache
def _session():
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(model_path()), sess_options=opts, providers=["CPUExecutionProvider"])


def model_path() -> Path:
    """The ONNX file silero-vad ships, found without importing the package: its `__init__` imports
    torch (seconds, hundreds of MB, and seconds more at exit) into the API's process, which runs
    the ONNX model only."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("silero-vad is not installed (its ONNX model runs the realtime server VAD)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / MODEL_FILE


def warm_up() -> None:
    """Load the model once (a few tens of ms) so the first session does not pay for it."""
    VadDetector(VadParams()).feed(np.zeros(WINDOW, np.float32))


@dataclass(frozen=True)
class VadParams:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["start", "stop"]
    sample: int
    """Position (16 kHz samples since the session's first input audio)."""


class VadDetector:
    def __init__(self, params: VadParams, origin: int = 0) -> None:
        self.params = params
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._pos = origin  # samples consumed in whole windows (session timeline)
        self.speaking = False
        self._silence_from: int | None = None
        self._sr = np.array(VAD_RATE, dtype=np.int64)

    @property
    def position(self) -> int:
        """Timeline position just after the last whole window consumed."""
        return self._pos

    def probability(self, window: np.ndarray) -> float:
        x = np.concatenate([self._context, window])[None, :]
        out, self._state = _session().run(None, {"input": x, "state": self._state, "sr": self._sr})
        self._context = window[-CONTEXT:]
        return float(out[0, 0])

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """Consume 16 kHz samples; return the turn boundaries they complete, in order."""
        buf = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        n = len(buf) // WINDOW
        self._pending = buf[n * WINDOW:]
        events: list[VadEvent] = []
        p = self.params
        silence_needed = p.silence_duration_ms * VAD_RATE // 1000
        for i in range(n):
            window = buf[i * WINDOW:(i + 1) * WINDOW]
            start = self._pos
            self._pos += WINDOW
            prob = self.probability(window)
            if not self.speaking:
                if prob >= p.threshold:
                    self.speaking = True
                    self._silence_from = None
                    pad = p.prefix_padding_ms * VAD_RATE // 1000
                    events.append(VadEvent("start", max(0, start - pad)))
                continue
            if prob >= p.threshold - NEG_MARGIN:
                self._silence_from = None
            elif self._silence_from is None:
                self._silence_from = start
            if self._silence_from is not None and self._pos - self._silence_from >= silence_needed:
                self.speaking = False
                self._silence_from = None
                events.append(VadEvent("stop", self._pos))
        return events
