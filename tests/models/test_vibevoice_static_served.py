"""The vibevoice folder served with `engine_extras.kv_cache: static` speaks what the dynamic cache speaks (openai SDK).

Two real servers, one after the other, over one tiny folder as `omni-run --model DIR`
serves it, with the LM stage's KV cache static (slots for both guidance branches, the
fixed-shape LM step and denoising loop) and dynamic. Three seeded requests at once on
two slots, so requests share steps and the third takes a slot another gave back: the
same audio from both.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import eventually, idle, serve_deploy

KEY = "vibevoice-static-key"
TEXTS = ("Hello there, how are you?", "Hi.", "A rather longer sentence, spoken third of all.")


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


async def test_static_and_dynamic_servers_speak_the_same_audio(tmp_path: Path) -> None:
    folder = make_tiny("vibevoice", tmp_path / "tiny-vibevoice", seed=0)
    static = await _speak(folder, "static")
    dynamic = await _speak(folder, "dynamic")
    assert len({a.tobytes() for a in static}) == len(TEXTS), "the requests should differ"
    for a, b in zip(static, dynamic, strict=True):
        assert a.size == b.size and a.size >= 6 * 3200
        assert np.allclose(a, b, atol=1e-4)
