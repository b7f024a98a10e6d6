"""The higgs_audio_v2 family end to end: a tiny Higgs-Audio-V2 folder (LM + audio tokenizer workers) served
as `omni-run --model DIR` serves it.

The shared checks (speech_family.py) driven by the openai SDK, one server for the module; plus
what is this family's own: `instructions` as the scene description (accepted, changing the
audio), and the bad-input 400s with that in mind.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.api.conftest import Server
from tests.models.speech_family import (  # noqa: F401 - the shared tests, collected here
    TEXT,
    Family,
    _wav,
    family_fixtures,
    test_audio_at_the_family_rate_deterministic_for_a_seed,
    test_custom_voices_clone_and_survive_a_restart,
    test_detected_served_and_voices_listed,
    test_every_format_decodes,
    test_plain_streaming_sends_encoded_bytes,
    test_speed_changes_duration,
    test_sse_deltas_arrive_before_done,
    test_text_in_socket_closed_mid_text_leaves_nothing_running,
    test_text_in_socket_speaks_before_done_in_order,
)

FAMILY = Family("higgs_audio_v2", rate=24000, frame=960, voices=("default", "SPEAKER0", "SPEAKER1"))
# frame: samples per audio tokenizer frame (25 Hz at 24 kHz)
fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


async def test_instructions_are_the_scene_description(srv: Server, fam: Family) -> None:
    plain, _ = await _wav(srv, fam, voice="default", extra_body={"seed": 5})
    scene, _ = await _wav(srv, fam, voice="default", instructions="A noisy street.", extra_body={"seed": 5})
    again, _ = await _wav(srv, fam, voice="default", instructions="A noisy street.", extra_body={"seed": 5})
    tagged, _ = await _wav(srv, fam, voice="SPEAKER1", extra_body={"seed": 5})
    # The same codes; the codec's windows are cut where the codes had arrived (a window takes every
    # whole chunk ready), and a non-causal decoder's float rounding differs by cut: at most 1 LSB
    # of the 16-bit audio, on a few samples (3 of 30,720 on a loaded 2-core box).
    assert scene.size == again.size and np.abs(scene - again).max() <= 1.0 / 32768 + 1e-9
    assert (scene != again).mean() < 1e-3
    for audio in (scene, tagged):
        assert audio.size != plain.size or not (audio == plain).all()


async def test_bad_voice_input_and_sizes_are_400s(srv: Server, fam: Family) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="nobody")
    body = err.value.body
    assert body["param"] == "voice" and "'default'" in body["message"] and "alloy" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="x" * 500)
    assert err.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="default", instructions="x" * 70_000)
    assert err.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice={"id": "voice_missing"})
    assert err.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=" \n\t ", voice="default")
    assert err.value.body["param"] == "input"
