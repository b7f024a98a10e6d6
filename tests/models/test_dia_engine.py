"""Dia's decoder engine against transformers' own `generate`: the same frames, batched or alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext

TEXT = "Hello there."


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from omni_actors.models.dia.engine import DiaEngine

    folder = make_tiny("dia", tmp_path_factory.mktemp("models") / "tiny-dia", seed=0)
    eng = DiaEngine(EngineContext(0, 0, "decoder", Path(folder), "cpu", 4, "auto", 0.9, 1))
    yield eng
    eng.close()


def _run(
    engine, requests: list[tuple[str, str, dict]], inputs: dict | None = None
) -> dict[str, np.ndarray]:
    frames: dict[str, list[np.ndarray]] = {rid: [] for rid, _, _ in requests}
    for rid, text, params in requests:
        engine.add(rid, {"text": text, "voice": "S1", **(inputs or {})}, params)
    done = set()
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            if "codes" in out.payload:
                frames[out.request_id].append(out.payload["codes"][0])
            if out.finished:
                done.add(out.request_id)
    assert done == set(frames)
    return {rid: np.array(f) for rid, f in frames.items()}


def _undelayed(codes: torch.Tensor, delay: tuple[int, ...], pad: int) -> np.ndarray:
    """transformers' output grid [positions, channels] -> audio frames (DiaProcessor.batch_decode's cut)."""
    n = codes.shape[0]
    end = n - int((codes[:, 0] == pad).sum()) - 1
    return np.array([[int(codes[s + d, c]) for c, d in enumerate(delay)] for s in range(1, end)])


def test_greedy_frames_equal_transformers_generate(engine) -> None:
    from transformers import DiaFeatureExtractor, DiaProcessor

    ours = _run(engine, [("a", TEXT, {"temperature": 0.0})])["a"]
    fe = DiaFeatureExtractor(sampling_rate=44100, hop_length=512)
    processor = DiaProcessor(fe, engine.tokenizer, engine.dac)
    inputs = processor(text=[f"[S1] {TEXT}"], return_tensors="pt")
    theirs = engine.model.generate(**inputs, do_sample=False)[0]
    expected = _undelayed(theirs, engine.tok.delay, engine.tok.pad)
    assert ours.shape[1] == 9 and len(ours) > 8
    assert np.array_equal(ours, expected)


def test_batched_equals_alone_and_seeds_matter(engine) -> None:
    together = _run(
        engine,
        [
            ("x", TEXT, {"seed": 3}),
            ("y", "A longer, different text!", {"seed": 4}),
            ("z", "Hi.", {"temperature": 0.0}),
        ],
    )
    assert np.array_equal(together["x"], _run(engine, [("x", TEXT, {"seed": 3})])["x"])
    assert np.array_equal(together["z"], _run(engine, [("z", "Hi.", {"temperature": 0.0})])["z"])
    other = _run(engine, [("w", TEXT, {"seed": 5})])["w"]
    assert not np.array_equal(together["x"][: len(other)], other[: len(together["x"])])


def test_reference_clip_fills_the_prompt(engine) -> None:
    clip = (0.3 * np.sin(np.arange(44100) / 44100 * 2 * np.pi * 220)).astype(np.float32)
    plain = _run(engine, [("p", TEXT, {"temperature": 0.0})])["p"]
    cloned = _run(
        engine,
        [("c", TEXT, {"temperature": 0.0})],
        {"reference_audio": clip, "reference_text": "A low hum."},
    )["c"]
    assert len(cloned) and not np.array_equal(cloned[: len(plain)], plain[: len(cloned)])
    with pytest.raises(ValueError, match="voice"):
        engine.add("bad", {"text": TEXT, "voice": "S3"}, {})


def test_greedy_cloned_frames_equal_transformers_generate(engine) -> None:
    """A reference clip is Dia's audio prompt: its DAC codes prefill the decoder after bos."""
    from transformers import DiaFeatureExtractor, DiaProcessor

    clip = (0.3 * np.sin(np.arange(22050) / 44100 * 2 * np.pi * 220)).astype(np.float32)
    ours = _run(
        engine,
        [("r", TEXT, {"temperature": 0.0})],
        {"reference_audio": clip, "reference_text": "A low hum."},
    )["r"]
    fe = DiaFeatureExtractor(sampling_rate=44100, hop_length=512)
    processor = DiaProcessor(fe, engine.tokenizer, engine.dac)
    inputs = processor(text=[f"[S1] A low hum. [S1] {TEXT}"], audio=[clip], return_tensors="pt")
    start = processor.get_audio_prompt_len(inputs["decoder_attention_mask"])
    theirs = engine.model.generate(**inputs, do_sample=False)[0]
    frames = _undelayed(theirs, engine.tok.delay, engine.tok.pad)
    assert len(ours) > 8 and np.array_equal(ours, frames[start - 1 :])
