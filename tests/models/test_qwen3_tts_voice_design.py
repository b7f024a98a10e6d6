"""qwen3_tts, VoiceDesign variant: no named speakers, the voice comes from `instructions` (openai SDK, real server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from omni_actors.models.tiny import make_tiny
from tests.api.conftest import Server
from tests.models.speech_family import Family, _wav, serve_family

FAMILY = Family("qwen3_tts", rate=24000, frame=1920, voices=())


@pytest.fixture(scope="module")
async def srv(tmp_path_factory) -> AsyncIterator[Server]:
    folder = make_tiny(
        "qwen3_tts-voice-design", tmp_path_factory.mktemp("models") / FAMILY.model, seed=0
    )
    async with serve_family(folder, tmp_path_factory.mktemp("data")) as server:
        yield server


async def test_the_voice_is_the_instructions(srv: Server) -> None:
    calm, rate = await _wav(
        srv, FAMILY, voice="alloy", instructions="A calm, low voice.", extra_body={"seed": 3}
    )
    named, _ = await _wav(
        srv, FAMILY, voice="ryan", instructions="A calm, low voice.", extra_body={"seed": 3}
    )
    bright, _ = await _wav(
        srv, FAMILY, voice="alloy", instructions="A bright, fast voice!", extra_body={"seed": 3}
    )
    assert rate == 24000 and calm.size and calm.size % FAMILY.frame == 0
    assert (
        calm.size == named.size and (calm == named).all()
    )  # no speakers: the voice name changes nothing
    assert calm.size != bright.size or not (calm == bright).all()
