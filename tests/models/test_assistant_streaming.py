"""Async-chunk behaviour of the assistant's speech stages: seamless chunked vocoding, sentence streaming."""

from __future__ import annotations

import numpy as np
import pytest
from assistant_support import assistant_dir, drain, engine_ctx

from omni_actors.models.assistant.piper_engine import HOP_SAMPLES, LATENT_INPUT, onnx_session
from omni_actors.models.assistant.processors import (
    llm_to_tts_chunk,
    tts_to_vocoder,
    tts_to_vocoder_chunk,
)
from omni_actors.models.assistant.tts_engine import PiperAcousticEngine
from omni_actors.models.assistant.vocoder_engine import PiperVocoderEngine

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

JOIN_TOLERANCE = 1e-4
"""Max |chunked - full| per sample; the defaults give ~1e-6, a seam would be ~1e-2."""
ANSWER = "Paris is the capital of France. It is known for the Eiffel Tower! Would you like to visit?"


@pytest.fixture(scope="module")
def tts(assistant_dir):
    return PiperAcousticEngine(engine_ctx(assistant_dir, "tts"))


@pytest.fixture(scope="module")
def latents(tts):
    """Latents of three different texts, [192, frames] each."""
    texts = [ANSWER, "Hello there.", "The quick brown fox jumps over the lazy dog, twice."]
    for i, text in enumerate(texts):
        tts.add(f"t{i}", {"text": text}, {})
    outputs = drain(tts)
    return [tts_to_vocoder({2: [o.payload for o in outputs[f"t{i}"]]}, {})["latent"] for i in range(len(texts))]


@pytest.fixture(scope="module")
def full_decode(assistant_dir):
    session = onnx_session(assistant_dir / "vocoder", "cpu", 1)

    def decode(latent: np.ndarray) -> np.ndarray:
        return session.run(None, {LATENT_INPUT: latent[None]})[0].reshape(-1)

    return decode


def _stream(vocoder: PiperVocoderEngine, pieces: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Feed every request's pieces round-robin, stepping between feeds; collect audio chunks."""
    audio: dict[str, list[np.ndarray]] = {rid: [] for rid in pieces}
    for rid in pieces:
        vocoder.add(rid, {}, {}, streaming=True)
    for k in range(max(len(p) for p in pieces.values())):
        for rid, parts in pieces.items():
            if k < len(parts):
                vocoder.feed(rid, {"latent": parts[k]}, last=k == len(parts) - 1)
        for out in vocoder.step():
            audio[out.request_id].append(out.payload["audio"])
    for rid, outs in drain(vocoder).items():
        audio[rid] += [o.payload["audio"] for o in outs]
    assert not vocoder.requests
    return audio


def _split(latent: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    cuts = np.cumsum(sizes)
    cuts = cuts[cuts < latent.shape[1]]
    return np.split(latent, cuts, axis=1)


@pytest.mark.parametrize("chunk_frames", [7, 32])
def test_chunked_vocoding_equals_full_decoding(assistant_dir, latents, full_decode, chunk_frames):
    vocoder = PiperVocoderEngine(engine_ctx(assistant_dir, "vocoder", chunk_frames=chunk_frames))
    pieces = {
        "a": _split(latents[0], [1, 5, 17, 40, 3, 60, 11] * 20),
        "b": _split(latents[1], [9] * 50),
        "c": _split(latents[2], [latents[2].shape[1]]),
    }
    audio = _stream(vocoder, pieces)
    for rid, latent in zip(pieces, latents, strict=True):
        chunks = audio[rid]
        # Nothing is sent twice: the chunks tile the audio exactly.
        assert sum(c.size for c in chunks) == latent.shape[1] * HOP_SAMPLES
        assert all(c.size <= chunk_frames * HOP_SAMPLES for c in chunks)
        assert len([c for c in chunks if c.size]) >= latent.shape[1] // chunk_frames
        full = full_decode(latent)
        diff = np.abs(np.concatenate(chunks) - full)
        assert diff.max() <= JOIN_TOLERANCE, (rid, float(diff.max()))


def test_too_little_context_shows_at_the_joins(assistant_dir, latents, full_decode):
    """The tolerance is meaningful: without context the chunk joins are audible."""
    vocoder = PiperVocoderEngine(
        engine_ctx(assistant_dir, "vocoder", chunk_frames=16, left_context=0, lookahead=0)
    )
    chunks = _stream(vocoder, {"a": [latents[0]]})["a"]
    assert np.abs(np.concatenate(chunks) - full_decode(latents[0])).max() > 100 * JOIN_TOLERANCE


def test_whole_latent_request(assistant_dir, latents, full_decode):
    vocoder = PiperVocoderEngine(engine_ctx(assistant_dir, "vocoder"))
    vocoder.add("r", {"latent": latents[1][None]}, {})  # [1, 192, frames] is accepted too
    outputs = drain(vocoder)["r"]
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    audio = np.concatenate([o.payload["audio"] for o in outputs])
    assert np.abs(audio - full_decode(latents[1])).max() <= JOIN_TOLERANCE


def test_empty_and_aborted_requests(assistant_dir, latents):
    vocoder = PiperVocoderEngine(engine_ctx(assistant_dir, "vocoder"))
    vocoder.add("empty", {}, {}, streaming=True)
    vocoder.feed("empty", tts_to_vocoder_chunk(2, {"latent": latents[0][:, :0]}, True, {}, {}), last=True)
    vocoder.add("gone", {"latent": latents[0]}, {})
    vocoder.abort("gone")
    outputs = drain(vocoder)
    assert list(outputs) == ["empty"]
    assert outputs["empty"][0].finished and outputs["empty"][0].payload["audio"].size == 0


def test_tts_is_deterministic_and_batch_independent(tts, latents):
    tts.add("again", {"text": "Hello there."}, {})
    tts.add("other", {"text": "Something else entirely, to share the batch."}, {})
    outputs = drain(tts)
    again = outputs["again"][0].payload["latent"]
    assert again.shape == latents[1].shape
    assert np.abs(again - latents[1]).max() < 1e-3


def test_tts_speed_param(tts, latents):
    tts.add("fast", {"text": "Hello there."}, {"speed": 2.0})
    fast = drain(tts)["fast"][0].payload["latent"]
    assert 0.4 < fast.shape[1] / latents[1].shape[1] < 0.6
    with pytest.raises(ValueError):
        tts.add("bad", {"text": "x"}, {"speed": 10})


def test_sentences_stream_from_llm_deltas_to_audio(tts):
    """The first sentence's latent is ready before the LLM's text is complete."""
    deltas = [ANSWER[i : i + 5] for i in range(0, len(ANSWER), 5)]
    state: dict = {}
    tts.add("s", {"messages": [{"role": "user", "content": "ignored"}]}, {}, streaming=True)
    spoken: list[str] = []
    first_latent_at = None
    for k, delta in enumerate(deltas):
        last = k == len(deltas) - 1
        inputs = llm_to_tts_chunk(1, {"text": delta}, last, {}, state)
        if inputs is not None:
            tts.feed("s", inputs, last)
        for out in tts.step():
            assert out.error is None
            spoken.append(out.payload["text"])
            if first_latent_at is None and out.payload["latent"].shape[1] > 0:
                first_latent_at = k
    spoken += [o.payload["text"] for o in drain(tts).get("s", [])]
    assert spoken == [
        "Paris is the capital of France.",
        "It is known for the Eiffel Tower!",
        "Would you like to visit?",
    ]
    assert first_latent_at is not None and first_latent_at < len(deltas) // 2
