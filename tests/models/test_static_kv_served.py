"""A speech folder served with `engine_extras.kv_cache: static` speaks what the dynamic cache speaks (openai SDK).

Per family (dia: the decoder stage's slots and fixed-shape step; vibevoice: the LM stage's
slots for both guidance branches, the fixed-shape LM step and denoising loop), two real
servers one after the other over one tiny folder as `omni-run --model DIR` serves it, the
stage's KV cache static then dynamic. Three seeded requests at once on two slots, so
requests share steps and the third takes a slot another gave back: the same audio from both.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import eventually, idle, serve_deploy

KEY = "static-kv-key"
TEXTS = ("Hello there, how are you?", "Hi.", "A rather longer sentence, spoken third of all.")
MIN_SAMPLES = {"dia": 1, "vibevoice": 6 * 3200}
"""Samples each answer has at least (vibevoice: six latents of 3,200)."""


def _deploy(folder: Path, kind: str):
    stage = {"stage_id": 0, "max_num_seqs": 2, "engine_extras": {"kv_cache": kind}}
    return served_folder(
        str(folder), {"model": str(folder), "server": {"api_keys": [KEY]}, "stages": [stage]}
    )


async def _speak(folder: Path, kind: str) -> list[np.ndarray]:
    async with serve_deploy(_deploy(folder, kind), KEY) as srv:
        client = srv.client()
        replies = await asyncio.gather(*(
            client.audio.speech.create(model=folder.name, input=text, voice="alloy", response_format="pcm",
                                       extra_body={"seed": 10 + i})
            for i, text in enumerate(TEXTS)
        ))  # fmt: skip
        await eventually(lambda: idle(srv.orch))
        return [np.frombuffer(r.content, "<i2").astype(np.float32) / 32768 for r in replies]


FAMILIES = ["dia", "vibevoice"]
"""Dia and VibeVoice: the deploy's `kv_cache` reaching a served stage's engine (VibeVoice's static path is
also checked against the dynamic one down to the decoded audio, engine by engine, in test_vibevoice_static.py)."""


@pytest.mark.parametrize("family", FAMILIES)
async def test_static_and_dynamic_servers_speak_the_same_audio(tmp_path: Path, family: str) -> None:
    folder = make_tiny(family, tmp_path / f"tiny-{family}", seed=0)
    static = await _speak(folder, "static")
    dynamic = await _speak(folder, "dynamic")
    assert len({a.tobytes() for a in static}) == len(TEXTS), "the requests should differ"
    for a, b in zip(static, dynamic, strict=True):
        assert a.size == b.size and a.size >= MIN_SAMPLES[family]
        assert np.allclose(a, b, atol=1e-4)
