"""The `speed` time stretch (api/time_stretch.py): duration scaled by 1/speed, pitch and loudness kept,
and the same output to the bit whatever the chunking of the input."""

from __future__ import annotations

import numpy as np
import pytest

from omni_actors.api.time_stretch import TimeStretch

RATE = 24000


def _sine(hz: float, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _pitch_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    return float(np.fft.rfftfreq(audio.size, 1 / RATE)[np.argmax(spectrum)])


def _chunked(audio: np.ndarray, speed: float, seed: int) -> np.ndarray:
    rng, ts, parts, i = np.random.default_rng(seed), TimeStretch(RATE, speed), [], 0
    while i < audio.size:
        n = int(rng.integers(1, 5000))
        parts.append(ts.feed(audio[i : i + n]))
        i += n
    parts.append(ts.feed(np.zeros(0, np.float32), last=True))
    return np.concatenate(parts)


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.5, 2.0, 4.0])
def test_a_tone_keeps_its_pitch_and_level_at_every_speed(speed: float) -> None:
    tone = _sine(220, 1.0)
    out = TimeStretch(RATE, speed).feed(tone, last=True)
    assert out.size == round(tone.size / speed)
    assert abs(_pitch_hz(out) - 220) < 2  # a resample by 1/speed would put it at 220 * speed
    middle = out[out.size // 4 : 3 * out.size // 4]
    assert abs(np.sqrt(np.mean(middle**2)) - 0.5 / np.sqrt(2)) < 0.02  # no dips where frames overlap


@pytest.mark.parametrize("speed", [0.25, 0.37, 1.3, 2.7, 4.0])
@pytest.mark.parametrize("length", [0, 1, 999, 24001])
def test_any_chunking_gives_the_same_samples(speed: float, length: int) -> None:
    noise = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    whole = TimeStretch(RATE, speed).feed(noise, last=True)
    assert whole.size == round(length / speed)
    for seed in (1, 2):
        assert np.array_equal(_chunked(noise, speed, seed), whole)
