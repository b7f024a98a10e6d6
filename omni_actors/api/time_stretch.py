"""`speed` without a pitch change: a streaming WSOLA time stretch (waveform-similarity overlap-add).

    ts = TimeStretch(sample_rate, speed)      speed 0.25-4: 2.0 halves the duration, same pitch
    ts.feed(chunk) -> float32 samples         what is final so far
    ts.feed(tail, last=True) -> the rest      the whole output is round(len(input) / speed) samples

The output is built from Hann-windowed frames of FRAME_S laid down every half frame (Hs);
frame k is read from the input near k * Hs * speed, shifted by up to SEARCH_S either way to
the offset whose samples best match (largest dot product) the natural continuation of the
frame before it: the input right after where that frame was read. So periods line up across
the overlaps, and a voice keeps its pitch where resampling would shift it by the speed (an
octave at 2x). The choice depends on the samples alone, so any chunking of the input gives
the same output to the bit. Frame 0 is not faded in (its first half weighs 1) and the input
is padded with silence at the end.
"""

from __future__ import annotations

import numpy as np

FRAME_S = 0.03
"""Frame length (30 ms: a few pitch periods of a voice)."""
SEARCH_S = 0.01
"""How far a frame may move from its nominal place to line up with the one before (either way)."""


class TimeStretch:
    def __init__(self, sample_rate: int, speed: float) -> None:
        self.speed = float(speed)
        self.hop = max(1, round(FRAME_S * sample_rate / 2))  # Hs, the output hop
        self.n = 2 * self.hop
        self.delta = max(1, round(SEARCH_S * sample_rate))
        self.window = np.hanning(self.n + 1)[: self.n].astype(np.float32)  # periodic: halves sum to 1
        self.first_window = self.window.copy()
        self.first_window[: self.hop] = 1.0
        self.buf = np.zeros(0, np.float32)
        self.base = 0  # input index of buf[0]
        self.total_in = 0
        self.k = 0  # next frame
        self.prev = 0  # input index where the last frame was read
        self.out = np.zeros(0, np.float32)  # output from index `emitted` on, frames still adding
        self.emitted = 0

    def _x(self, start: int, length: int) -> np.ndarray:
        """Input [start, start + length) (silence before 0); the caller made sure it is buffered."""
        lead = max(0, -start)
        part = self.buf[start + lead - self.base : start + length - self.base]
        return np.concatenate([np.zeros(lead, np.float32), part]) if lead else part

    def _frame(self, end: int) -> bool:
        """Lay down frame k if the input up to `end` holds what it needs; whether it did."""
        p = round(self.k * self.hop * self.speed)
        if self.k == 0:
            if self.n > end:
                return False
            start, window = 0, self.first_window
        else:
            natural = self.prev + self.hop
            if max(p + self.delta, natural) + self.n > end:
                return False
            lo = max(p - self.delta, -self.n)
            region = self._x(lo, p + self.delta - lo + self.n)
            score = np.correlate(region, self._x(natural, self.n), "valid")
            start, window = lo + int(np.argmax(score)), self.window
        at = self.k * self.hop - self.emitted
        if at + self.n > self.out.size:
            self.out = np.concatenate([self.out, np.zeros(at + self.n - self.out.size, np.float32)])
        self.out[at : at + self.n] += window * self._x(start, self.n)
        self.prev, self.k = start, self.k + 1
        return True

    def _emit(self, upto: int) -> np.ndarray:
        """Output samples [emitted, upto): no frame after these adds to them."""
        take = upto - self.emitted
        done = self.out[:take].copy()
        self.out = self.out[take:]
        self.emitted = upto
        return done

    def feed(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        audio = np.asarray(audio, np.float32).reshape(-1)
        self.buf = np.concatenate([self.buf, audio])
        self.total_in += audio.size
        target = None
        if last:  # frames until every sample before the target length is final, over silence past the end
            target = round(self.total_in / self.speed)
            pad = self.n + 2 * self.delta + int(np.ceil(self.hop * (self.speed + 1))) + 2
            self.buf = np.concatenate([self.buf, np.zeros(pad, np.float32)])
        end = self.base + self.buf.size
        parts = []
        # Before the end, never past what the input so far will make whatever comes (the final
        # length is at least this), so a fast speed's last frames are not sent beyond it.
        bound = target if target is not None else int(self.total_in / self.speed)
        while (target is None or self.k * self.hop < target) and self._frame(end):
            parts.append(self._emit(max(self.emitted, min(self.k * self.hop, bound))))
        if target is not None and self.emitted < target:  # laid down before the end, not yet sent
            parts.append(self._emit(target))
        got = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        if target is not None:
            return got
        keep = min(round(self.k * self.hop * self.speed) - self.delta, self.prev + self.hop, end)
        if keep > self.base:
            self.buf = self.buf[keep - self.base :]
            self.base = keep
        return got
