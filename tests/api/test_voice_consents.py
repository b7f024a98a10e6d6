"""Voice consents and voices as an outside client uses them: a consent recording is held to the voice samples'
silence floor, and voice ids are found however the client spells them. Real server, the unmodified openai SDK."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import numpy as np
import openai
import pytest
import soundfile as sf

from omni_actors.api.voices import MIN_SAMPLE_S
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


async def test_a_consent_recording_shorter_than_a_voice_sample_is_a_400_naming_recording(srv: Server) -> None:
    """A 0.05 s consent recording was stored; it is held to the voice samples' minimum (MIN_SAMPLE_S)."""
    client = srv.client()
    before = [c.id async for c in client.audio.voice_consents.list()]
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.voice_consents.create(recording=("c.wav", _wav(int(RATE * MIN_SAMPLE_S) - 1), "audio/wav"),
                                                 language="en-US", name="short")
    body = err.value.body
    assert (body["param"], body["code"]) == ("recording", "audio_too_short"), body
    assert "consent recording is too short" in body["message"], body
    assert [c.id async for c in client.audio.voice_consents.list()] == before  # nothing stored
    made = await client.audio.voice_consents.create(recording=("c.wav", _wav(int(RATE * MIN_SAMPLE_S)), "audio/wav"),
                                                    language="en-US", name="long enough")
    assert made.id.startswith("cons_")


async def test_a_consent_page_after_an_unknown_id_is_a_400_and_after_a_deleted_one_goes_on(srv: Server) -> None:
    """`after` naming no consent was an empty page (the client took it for the end of the list); /v1/videos
    answers a 400 naming `after`. A consent deleted since its page was read still places the cursor."""
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.voice_consents.list(after="cons_nosuch")
    assert err.value.body["param"] == "after", err.value.body
    made = [(await client.audio.voice_consents.create(recording=("c.wav", _wav(RATE), "audio/wav"),
                                                      language="en-US", name=f"page {i}")).id for i in range(3)]
    assert (await client.audio.voice_consents.delete(made[1])).deleted
    page = await client.audio.voice_consents.list(after=made[1])
    assert [c.id for c in page.data] == [made[2]], page
    assert (await client.audio.voice_consents.delete(made[2])).deleted
    newer = await client.audio.voice_consents.create(recording=("c.wav", _wav(RATE), "audio/wav"),
                                                     language="en-US", name="after the last was deleted")
    page = await client.audio.voice_consents.list(after=made[2])  # (its rowid is not given to the newer one)
    assert [c.id for c in page.data] == [newer.id], page
