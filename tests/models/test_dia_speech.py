"""The dia family end to end: a tiny Dia folder (decoder + DAC codec workers) served as `omni-run --model DIR` serves it.

The checks are the shared ones (speech_family.py), driven by the openai SDK; one server for the module.
"""

from __future__ import annotations

import openai
import pytest

from tests.models.speech_family import (  # noqa: F401 - the shared tests, collected here
    Family,
    _clip,
    _wav,
    family_fixtures,
    test_audio_at_the_family_rate_deterministic_for_a_seed,
    test_bad_voice_instructions_and_sizes_are_400s,
    test_custom_voices_clone_and_survive_a_restart,
    test_detected_served_and_voices_listed,
    test_every_format_decodes,
    test_plain_streaming_sends_encoded_bytes,
    test_speed_changes_duration,
    test_sse_deltas_arrive_before_done,
    test_text_in_socket_closed_mid_text_leaves_nothing_running,
    test_text_in_socket_speaks_before_done_in_order,
)

FAMILY = Family("dia", rate=44100, frame=512, voices=("S1", "S2"))
fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


async def test_text_past_the_encoder_is_a_400_naming_input(srv) -> None:
    """Dia's encoder has a fixed length; the stage refuses longer text, and the refusal names `input`."""
    with pytest.raises(openai.BadRequestError) as err:
        # (4000 characters: under the API's 4096, over the encoder's 1024 bytes)
        await srv.client().audio.speech.create(model=FAMILY.model, input="word " * 800, voice="S1")
    assert err.value.body["param"] == "input" and "at most" in err.value.message, err.value.body


async def test_a_voice_clip_past_the_decoders_positions_is_a_400_naming_voice(srv) -> None:
    """A 40 s clip is past the tiny decoder's 3072 positions (35.4 s of clip at 86 frames a second, with
    Dia's delay): a 400 naming `voice` and the longest clip allowed (before 2026-12-05 the CPU's dynamic
    cache ran past the positions the model has, and CUDA's static one refused naming no field); the
    worker speaks on."""
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("c.wav", _clip(), "audio/wav"),
                                                       language="en-US", name="me")
    voice = await client.audio.voices.create(audio_sample=("v.wav", _clip(40.0, 8000), "audio/wav"),
                                             consent=consent.id, name="long", extra_body={"transcript": "A hum."})
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input="Hi.", voice={"id": voice.id})
    body = err.value.body
    assert body["param"] == "voice" and "at most 35.4 s" in body["message"], body
    audio, rate = await _wav(srv, FAMILY, voice="S1", extra_body={"seed": 1})
    assert rate == FAMILY.rate and audio.size


async def test_a_voice_transcript_that_takes_the_text_past_the_encoder_is_a_400_naming_voice(srv) -> None:
    """The custom voice's transcript goes before the text into Dia's 1024-byte encoder: when the text fits alone
    and the transcript pushes it over, the refusal named `input`, which the client could not shorten enough."""
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("c.wav", _clip(), "audio/wav"),
                                                       language="en-US", name="me")
    voice = await client.audio.voices.create(audio_sample=("v.wav", _clip(), "audio/wav"), consent=consent.id,
                                             name="wordy", extra_body={"transcript": "word " * 200})
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input="word " * 20, voice={"id": voice.id})
    body = err.value.body
    assert body["param"] == "voice" and "transcript" in body["message"] and "at most" in body["message"], body
    with pytest.raises(openai.BadRequestError) as err:  # the text alone past it: still `input`
        await client.audio.speech.create(model=FAMILY.model, input="word " * 800, voice={"id": voice.id})
    assert err.value.body["param"] == "input", err.value.body
