"""Voice consents and voices as an outside client uses them: a consent recording is held to the voice samples'
silence floor, and voice ids are found however the client spells them. Real server, the unmodified openai SDK."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.api.conftest import Server
from tests.api.test_voice_clips import RATE, _cloning_synthetic, _tone, _wav


@pytest.fixture(scope="module")
async def srv(tmp_path_factory) -> AsyncIterator[Server]:
    async with _cloning_synthetic(tmp_path_factory.mktemp("data")) as server:
        yield server


def _float_wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


async def test_a_silent_consent_recording_is_a_400_naming_recording(srv: Server) -> None:
    """Voice samples were checked for silence, consent recordings were not: a recording of nothing was taken
    as the speaker's consent."""
    client = srv.client()
    before = [c.id async for c in client.audio.voice_consents.list()]
    silent = {"zeros": np.zeros(RATE, np.float32), "hiss": _tone(RATE) * 10 ** (-70 / 20) / 0.3}
    for what, samples in silent.items():
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.voice_consents.create(recording=("c.wav", _float_wav(samples), "audio/wav"),
                                                     language="en-US", name=what)
        body = err.value.body
        assert body["param"] == "recording" and body["code"] == "audio_silent", (what, body)
        assert "consent recording is silent" in body["message"] and "-60 dBFS" in body["message"], body
    assert [c.id async for c in client.audio.voice_consents.list()] == before  # nothing stored
    made = await client.audio.voice_consents.create(recording=("c.wav", _wav(RATE), "audio/wav"),
                                                    language="en-US", name="spoken")
    assert made.id.startswith("cons_")
