"""VibeVoice's LM engine and streaming acoustic decoder in process: seeds, batching, cloning, stream = whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext

TEXT = "Hello there."


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return Path(
        make_tiny("vibevoice", tmp_path_factory.mktemp("models") / "tiny-vibevoice", seed=0)
    )


@pytest.fixture(scope="module")
def engine(folder):
    from omni_actors.models.vibevoice.engine import VibeVoiceEngine

    eng = VibeVoiceEngine(EngineContext(0, 0, "lm", folder, "cpu", 4, "auto", 0.9, 1))
    yield eng
    eng.close()


def _run(
    engine, requests: list[tuple[str, str, dict]], inputs: dict | None = None
) -> dict[str, np.ndarray]:
    latents: dict[str, list[np.ndarray]] = {rid: [] for rid, _, _ in requests}
    for rid, text, params in requests:
        engine.add(rid, {"text": text, "voice": "0", **(inputs or {})}, params)
    done = set()
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            if "latents" in out.payload:
                latents[out.request_id].append(out.payload["latents"][0])
            if out.finished:
                assert out.payload["finish_reason"] in ("stop", "length")
                done.add(out.request_id)
    assert done == set(latents)
    return {rid: np.array(x) for rid, x in latents.items()}


def test_seeded_latents_alone_equal_batched(engine) -> None:
    alone = _run(engine, [("a", TEXT, {"seed": 1})])["a"]
    batched = _run(engine, [("b", TEXT, {"seed": 1}), ("c", "Another, longer text.", {"seed": 2})])
    other = _run(engine, [("d", TEXT, {"seed": 2})])["d"]
    assert alone.shape == (engine.defaults["max_tokens"], engine.latent)
    assert np.allclose(alone, batched["b"], atol=1e-5)
    assert not np.allclose(alone, other, atol=1e-3)


def test_reference_clip_conditions_the_prompt(engine) -> None:
    clip = (0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
    plain = _run(engine, [("p", TEXT, {"seed": 1})])["p"]
    cloned = _run(engine, [("c", TEXT, {"seed": 1})], {"reference_audio": clip})["c"]
    again = _run(engine, [("c2", TEXT, {"seed": 1})], {"reference_audio": clip})["c2"]
    assert not np.allclose(plain, cloned, atol=1e-6)
    assert np.allclose(cloned, again, atol=1e-5)
    with pytest.raises(ValueError, match="voice"):
        engine.add("bad", {"text": TEXT, "voice": "7"}, {})


def test_streamed_windows_equal_one_decode(engine, folder) -> None:
    from omni_actors.models.vibevoice.codec import AcousticCodecAdapter

    latents = torch.tensor(_run(engine, [("s", TEXT, {"seed": 3})])["s"])
    codec = AcousticCodecAdapter(EngineContext(1, 0, "codec", folder, "cpu", 4, "auto", 0.9, 1))
    codec.load()
    stream = codec.start({}, {})
    parts = [
        codec.decode([latents[a:b]], [a], [stream])[0]
        for a, b in ((0, 1), (1, 3), (3, len(latents)))
    ]
    whole = codec.decode([latents], [0], [codec.start({}, {})])[0]
    assert whole.shape[0] == len(latents) * 3200
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5)
    with pytest.raises(RuntimeError, match="window"):
        codec.decode([latents[:1]], [0], [stream])  # the stream is past latent 0


def test_unseeded_latents_equal_transformers_generate(engine) -> None:
    """One request drawing noise from the global generator as `generate` does: the same audio."""
    from omni_actors.models.vibevoice.request import prompt_text

    assert not engine.requests  # nothing left over from the other tests
    torch.manual_seed(0)
    latents = torch.tensor(_run(engine, [("g", TEXT, {})])["g"])
    bos, eos, pad = engine.tokens
    ids = engine.tokenizer(
        prompt_text(TEXT, "0", 0, bos, eos, pad), return_tensors="pt", add_special_tokens=False
    )
    torch.manual_seed(0)
    audio = engine.model.generate(**ids)[0]
    ours = engine.parts.audio_tower.decode(latents[None]).audio.reshape(-1)
    assert audio.shape[-1] == ours.shape[0] and torch.allclose(audio.reshape(-1), ours, atol=1e-4)


def test_ignore_eos_runs_to_max_tokens(folder) -> None:
    """An LM that always says "end" stops a request at once, but not one that asks for ignore_eos."""
    from omni_actors.models.vibevoice.engine import VibeVoiceEngine

    eng = VibeVoiceEngine(EngineContext(0, 0, "lm", folder, "cpu", 4, "auto", 0.9, 1))
    try:
        eng.allowed[eng.model.config.audio_eos_token_id] = 1e30  # the end token always wins
        stopped = _run(eng, [("s", TEXT, {"seed": 1, "max_tokens": 6})])["s"]
        endless = _run(eng, [("e", TEXT, {"seed": 1, "max_tokens": 6, "ignore_eos": True})])["e"]
    finally:
        eng.close()
    assert len(stopped) < 6
    assert endless.shape[0] == 6
