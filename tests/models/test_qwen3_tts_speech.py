"""The qwen3_tts family end to end: a tiny Qwen3-TTS CustomVoice folder (talker + codec workers), served
as `omni-run --model DIR` serves it.

The shared checks (speech_family.py) driven by the openai SDK, one server for the
module; plus what is this family's own: named speakers, `instructions` as the style
prompt, and custom voices refused (a CustomVoice folder does not clone; Base folders do,
test_qwen3_tts_clone.py).
"""

from __future__ import annotations

import base64
import json

import aiohttp
import openai
import pytest

from tests.api.conftest import Server
from tests.models.speech_family import (  # noqa: F401 - the shared tests, collected here
    TEXT,
    Family,
    _clip,
    _wav,
    family_fixtures,
    test_audio_at_the_family_rate_deterministic_for_a_seed,
    test_detected_served_and_voices_listed,
    test_every_format_decodes,
    test_plain_streaming_sends_encoded_bytes,
    test_speed_changes_duration,
    test_sse_deltas_arrive_before_done,
    test_text_in_socket_closed_mid_text_leaves_nothing_running,
    test_text_in_socket_speaks_before_done_in_order,
)

FAMILY = Family(
    "qwen3_tts", rate=24000, frame=1920,
    voices=("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee"),
)  # fmt: skip


fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


async def test_instructions_are_the_style_prompt_and_speakers_differ(
    srv: Server, fam: Family
) -> None:
    plain, _ = await _wav(srv, fam, voice="ryan", extra_body={"seed": 5})
    styled, _ = await _wav(
        srv, fam, voice="ryan", instructions="Speak slowly and warmly.", extra_body={"seed": 5}
    )
    other, _ = await _wav(srv, fam, voice="vivian", extra_body={"seed": 5})
    again, _ = await _wav(
        srv, fam, voice="ryan", instructions="Speak slowly and warmly.", extra_body={"seed": 5}
    )
    assert styled.size == again.size and (styled == again).all()
    for audio in (styled, other):
        assert audio.size != plain.size or not (audio == plain).all()


async def test_custom_voices_and_bad_voices_are_400s(srv: Server, fam: Family) -> None:
    client = srv.client()
    model = await client.models.retrieve(fam.model)
    assert model.model_extra["custom_voices"] is False  # a CustomVoice folder: only its speakers
    consent = await client.audio.voice_consents.create(recording=("c.wav", _clip(), "audio/wav"),
                                                       language="en-US", name="me")
    voice = await client.audio.voices.create(audio_sample=("v.wav", _clip(2.0), "audio/wav"),
                                             consent=consent.id, name="mine", extra_body={"transcript": "A hum."})
    for vid in (voice.id, "voice_abc"):  # an existing custom voice and a missing one
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model=fam.model, input=TEXT, voice={"id": vid})
        assert err.value.body["param"] == "voice" and "custom voice" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="nobody")
    assert err.value.body["param"] == "voice" and "'vivian'" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(
            model=fam.model, input=TEXT, voice="ryan", instructions="x" * 70_000
        )
    assert err.value.body["param"] == "instructions"


async def _sse_usage(srv: Server, fam: Family, text: str) -> tuple[dict, int]:
    """`speech.audio.done`'s usage of an SSE request, and the 24 kHz samples its deltas held."""
    body = {"model": fam.model, "input": text, "voice": "ryan", "response_format": "pcm",
            "stream_format": "sse", "seed": 3}
    events = []
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(srv.url + "/v1/audio/speech",
                                                                       json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    return events[-1]["usage"], len(pcm) // 2


async def test_sse_usage_counts_this_requests_text_and_frames(srv: Server, fam: Family, model_dir) -> None:
    """input_tokens grow with the text by its token count (they were the talker's prefill rows alone,
    a constant); output_tokens are the code frames made."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    short, long = "Hi.", "Hello there, this is a much longer sentence to speak."
    (u1, n1), (u2, n2) = [await _sse_usage(srv, fam, t) for t in (short, long)]
    grew = len(tok(long, add_special_tokens=False).input_ids) - len(tok(short, add_special_tokens=False).input_ids)
    assert grew > 0 and u2["input_tokens"] - u1["input_tokens"] == grew, (u1, u2)
    for usage, samples in ((u1, n1), (u2, n2)):
        frames = samples // fam.frame  # (24 kHz pcm: the model's rate)
        assert usage["output_tokens"] in (frames, frames + 1), (usage, samples)  # (+ the stop code's step)
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
