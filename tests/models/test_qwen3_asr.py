"""The qwen3_asr family end to end: a tiny Qwen3-ASR folder served as `omni-run --model DIR` serves it,
transcribing through /v1/audio/transcriptions with the openai SDK; the reference is transformers' own generate."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import Server, eventually, idle, serve_deploy

KEY = "asr-key"
RATE = 16000


@pytest.fixture(scope="module")
def asr_dir(tmp_path_factory) -> Path:
    return make_tiny("qwen3_asr", tmp_path_factory.mktemp("models") / "tiny-asr")


@pytest.fixture(scope="module")
async def srv(asr_dir) -> AsyncIterator[Server]:
    deploy = served_folder(str(asr_dir), {"model": str(asr_dir), "server": {"api_keys": [KEY]}})
    async with serve_deploy(deploy, KEY) as server:
        yield server


def _speechlike() -> np.ndarray:
    rng = np.random.default_rng(3)
    t = np.arange(2 * RATE) / RATE
    return (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _reference(folder: Path, audio: np.ndarray) -> str:
    """What transformers' own processor + generate write for the same audio (greedy, language forced)."""
    import torch
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    proc = AutoProcessor.from_pretrained(folder)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(folder).eval()
    batch = proc.apply_transcription_request(audio=audio, language="en")
    with torch.inference_mode():
        out = model.generate(**batch, do_sample=False)
    return proc.decode(out[0][batch["input_ids"].shape[1]:], skip_special_tokens=True).strip()


async def test_transcribes_like_transformers_and_streams(srv: Server, asr_dir: Path) -> None:
    assert srv.orch.pipeline.name == "qwen3_asr"
    audio = _speechlike()
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="WAV", subtype="FLOAT")
    wav = buf.getvalue()
    client = srv.client()
    got = await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), language="en")
    want = _reference(asr_dir, audio)
    assert got.text and got.text == want
    events = [e async for e in await client.audio.transcriptions.create(
        model="tiny-asr", file=("a.wav", wav), language="en", stream=True)]
    assert events[-1].type == "transcript.text.done" and events[-1].text == want
    assert len(events) >= 3 and "".join(e.delta for e in events[:-1]).strip() == want
    # without a language the model names it itself; only text after <asr_text> is sent
    auto = await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), response_format="text")
    assert isinstance(auto, str) and "<asr_text>" not in auto and "language" not in auto.split(" ")[:1]
    await eventually(lambda: idle(srv.orch))
