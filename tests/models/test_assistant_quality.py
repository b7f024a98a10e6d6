"""Measured quality of the assistant's speech stages: ASR on recorded speech, TTS intelligibility.

Engine level, deterministic settings (greedy Whisper, Piper noise scales 0).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import soundfile as sf
from assistant_support import LIBRIVOX, assistant_dir, drain, engine_ctx, wer

from omni_actors.models.assistant.asr_engine import WhisperAsrEngine
from omni_actors.models.assistant.processors import tts_to_vocoder_chunk
from omni_actors.models.assistant.tts_engine import PiperAcousticEngine
from omni_actors.models.assistant.vocoder_engine import PiperVocoderEngine

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

ASR_MAX_WER = 0.15
TTS_MAX_WER = 0.10
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "It is a beautiful day in the neighborhood.",
    "The train leaves the station at noon every day.",
    "My favorite color is green because it reminds me of the forest.",
    "We should plant more trees in the city park.",
    "Can you tell me the way to the nearest library?",
    "The children played happily in the garden after school.",
    "Turn off the lights before you leave the room.",
    "Music helps many people relax at the end of a long week.",
]


@pytest.fixture(scope="module")
def asr(assistant_dir):
    engine = WhisperAsrEngine(engine_ctx(assistant_dir, "asr"))
    yield engine
    engine.close()


def _librivox() -> dict[str, str]:
    refs = {}
    for line in (LIBRIVOX / "transcription").read_text().splitlines():
        match = re.fullmatch(r"<s> (.*) </s> \((.*)\)", line.strip())
        if match:
            refs[match.group(2)] = match.group(1)
    return refs


def test_wer_helper():
    assert wer(["Mister Smith, hello!"], ["mr. smith hello"]) == 0.0
    assert wer(["a b c d"], ["a x c"]) == 0.5  # one substitution, one deletion
    assert wer(["cold-hearted man"], ["cold hearted"]) == pytest.approx(1 / 3)


def test_asr_on_recorded_speech(asr):
    refs = _librivox()
    assert len(refs) == 5
    for name in refs:
        audio, rate = sf.read(LIBRIVOX / f"{name}.wav", dtype="int16")  # int16 as a client sends it
        asr.add(name, {"audio": audio, "sample_rate": rate}, {})
    outputs = drain(asr)
    hyps = [outputs[name][-1].payload["text"] for name in refs]
    assert all(len(outputs[name]) == 1 and outputs[name][0].finished for name in refs)
    score = wer(list(refs.values()), hyps)
    print(f"asr librivox WER {score:.3f}")
    assert score <= ASR_MAX_WER, list(zip(refs.values(), hyps, strict=True))


def test_asr_streamed_input_matches_whole(asr):
    name = next(iter(_librivox()))
    audio, rate = sf.read(LIBRIVOX / f"{name}.wav", dtype="float32")
    asr.add("whole", {"audio": audio, "sample_rate": rate}, {})
    asr.add("streamed", {"sample_rate": rate}, {}, streaming=True)
    for i, piece in enumerate(np.array_split(audio, 5)):
        asr.feed("streamed", {"audio": piece, "sample_rate": rate}, last=i == 4)
    outputs = drain(asr)
    assert outputs["streamed"][0].payload["text"] == outputs["whole"][0].payload["text"] != ""


def test_asr_long_form(asr):
    """Audio past Whisper's 30 s window goes through faster-whisper's long-form path."""
    refs = _librivox()
    gap = np.zeros(8000, np.float32)
    clips = [sf.read(LIBRIVOX / f"{name}.wav", dtype="float32")[0] for name in refs]
    audio = np.concatenate([x for clip in clips * 2 for x in (clip, gap)])
    assert audio.size > 30 * 16000
    asr.add("long", {"audio": audio, "sample_rate": 16000}, {})
    text = drain(asr)["long"][0].payload["text"]
    score = wer([" ".join(list(refs.values()) * 2)], [text])
    print(f"asr long-form WER {score:.3f}")
    assert score <= ASR_MAX_WER, text


@pytest.mark.slow  # (default-suite budget: the slow run, `-m slow`, keeps it)
def test_tts_intelligibility(assistant_dir, asr):
    """Ten sentences through tts and (chunk-streamed) vocoder, transcribed back by the asr."""
    tts = PiperAcousticEngine(engine_ctx(assistant_dir, "tts"))
    vocoder = PiperVocoderEngine(engine_ctx(assistant_dir, "vocoder"))
    for i, sentence in enumerate(SENTENCES):
        tts.add(f"s{i}", {"text": sentence}, {})
        vocoder.add(f"s{i}", {}, {}, streaming=True)
    audio: dict[str, list[np.ndarray]] = {f"s{i}": [] for i in range(len(SENTENCES))}
    while tts.has_work() or vocoder.has_work():
        for out in tts.step():
            assert out.error is None
            inputs = tts_to_vocoder_chunk(2, out.payload, out.finished, {}, {})
            if inputs is not None:
                vocoder.feed(out.request_id, inputs, out.finished)
        for out in vocoder.step():
            assert out.error is None
            assert out.payload["sample_rate"] == 22050
            audio[out.request_id].append(out.payload["audio"])
    assert not vocoder.requests and not tts.requests
    for i in range(len(SENTENCES)):
        wave = np.concatenate(audio[f"s{i}"])
        assert wave.dtype == np.float32 and 0.5 < wave.size / 22050 < 10
        assert 0.05 < np.abs(wave).max() <= 1.0
        asr.add(f"s{i}", {"audio": wave, "sample_rate": 22050}, {})
    outputs = drain(asr)
    hyps = [outputs[f"s{i}"][0].payload["text"] for i in range(len(SENTENCES))]
    score = wer(SENTENCES, hyps)
    print(f"tts intelligibility WER {score:.3f}")
    assert score <= TTS_MAX_WER, list(zip(SENTENCES, hyps, strict=True))


def test_espeak_ng_keeps_its_audio_runtime_in_the_engines_folder(assistant_dir):
    """espeak-ng opens PulseAudio even for phonemes: its runtime folder is the engine's own (never
    a /tmp/pulse-* left behind), and goes when the engine closes."""
    from pathlib import Path

    before = set(Path("/tmp").glob("pulse-*"))
    tts = PiperAcousticEngine(engine_ctx(assistant_dir, "tts"))
    runtime = Path(tts.phonemizer.env["XDG_RUNTIME_DIR"])
    assert tts.phonemizer.phonemes("Hello there.")
    assert set(Path("/tmp").glob("pulse-*")) == before  # (here: in runtime/pulse, where libpulse is)
    tts.close()
    assert not runtime.exists()
