"""`speed` on speech: what the pitch-keeping WSOLA stretch (api/time_stretch.py) costs, against resampling.

The baseline, in the same run, is the cheapest way to change speed: resample the audio with
soxr (what `speed` would be if pitch were allowed to move: an octave up at 2x). Both run on the
same 10 s voiced signal (a 150 Hz buzz with harmonics and a syllable-rate envelope, 24 kHz, as TTS gives),
fed in 40 ms chunks as a stream arrives; each speed is timed over `--rounds` runs (median).
Also reported: the main frequency of the output, which WSOLA keeps and resampling moves.

    .venv/bin/python scripts/bench_time_stretch.py

Prints one JSON line: CPU milliseconds per second of input audio, for each speed and method, and
the output's main frequency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_actors.api.time_stretch import TimeStretch
from omni_actors.audio import resample

RATE = 24000
CHUNK_S = 0.04
SPEEDS = (0.5, 0.8, 1.25, 1.5, 2.0, 4.0)


def voice(seconds: float) -> np.ndarray:
    """A voiced buzz: 150 Hz, five harmonics, a syllable-rate envelope (a steady pitch, so the
    output's main frequency says whether it moved)."""
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * 150 * t
    x = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t) ** 2
    return (0.3 * x * envelope).astype(np.float32)


def main_frequency(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * RATE / len(x))


def stretch(x: np.ndarray, speed: float) -> np.ndarray:
    ts, step, out = TimeStretch(RATE, speed), int(CHUNK_S * RATE), []
    for i in range(0, len(x), step):
        out.append(ts.feed(x[i : i + step], last=i + step >= len(x)))
    return np.concatenate(out)


def resampled(x: np.ndarray, speed: float) -> np.ndarray:
    """The baseline: the whole clip resampled so that it plays `speed` times faster."""
    return resample(x, round(RATE * speed), RATE)


def timed(fn, x: np.ndarray, speed: float, rounds: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.process_time()
        out = fn(x, speed)
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    x = voice(args.seconds)
    results = []
    for speed in SPEEDS:
        wsola_s, out = timed(stretch, x, speed, args.rounds)
        base_s, ref = timed(resampled, x, speed, args.rounds)
        results.append({
            "speed": speed, "wsola_ms_per_audio_s": round(1000 * wsola_s / args.seconds, 3),
            "resample_ms_per_audio_s": round(1000 * base_s / args.seconds, 3),
            "cost_vs_resample": round(wsola_s / base_s, 1),
            "duration_ratio": round(len(x) / len(out), 4),
            "main_hz": {"input": round(main_frequency(x), 1), "wsola": round(main_frequency(out), 1),
                        "resample": round(main_frequency(ref), 1)},
        })  # fmt: skip
    print(json.dumps({"bench": "time_stretch", "rate": RATE, "seconds": args.seconds, "chunk_s": CHUNK_S,
                      "rounds": args.rounds, "results": results}))


if __name__ == "__main__":
    main()
