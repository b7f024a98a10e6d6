"""The realtime package's pieces without a server: audio, VAD, session updates, requests, truncation."""

from __future__ import annotations

import numpy as np
import pytest

from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime.audio import (
    AudioFormatError,
    Resampler,
    decode_wire,
    encode_wire,
    resample,
)
from omni_actors.api.realtime.conversation import Item, Part, truncate
from omni_actors.api.realtime.response_request import Options, build_request
from omni_actors.api.realtime.session import SessionConfig, apply_update
from omni_actors.api.realtime.vad import VadDetector, VadParams
from omni_actors.config.pipeline import get_pipeline
from tests.api.realtime.conftest import silence


@pytest.mark.parametrize(("src", "dst"), [(24_000, 16_000), (22_050, 24_000), (8_000, 16_000)])
def test_resampler_is_chunk_seamless_and_accurate(src: int, dst: int) -> None:
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(src) / src)).astype(np.float32)
    whole = resample(x, src, dst)
    r = Resampler(src, dst)
    chunked = np.concatenate([r.push(x[i:i + 777]) for i in range(0, len(x), 777)] + [r.flush()])
    assert len(whole) == dst and np.array_equal(whole, chunked)
    ref = 0.5 * np.sin(2 * np.pi * 440 * np.arange(dst) / dst)
    assert np.abs(whole[64:-64] - ref[64:-64]).max() < 1e-3


@pytest.mark.parametrize("fmt", ["pcm16", "g711_ulaw", "g711_alaw"])
def test_wire_formats_round_trip(fmt: str) -> None:
    x = (0.3 * np.sin(np.arange(800) / 7)).astype(np.float32)
    y, _ = decode_wire(encode_wire(x, fmt), fmt)
    assert np.abs(x - y).max() < (1e-4 if fmt == "pcm16" else 0.01)
    with pytest.raises(AudioFormatError):
        decode_wire("@@@", fmt)


def test_vad_finds_the_spoken_span(speech: dict[str, np.ndarray]) -> None:
    x16 = resample(np.concatenate([silence(1.0), speech["hello"], silence(1.0)]), 24_000, 16_000)
    assert VadDetector(VadParams()).feed(np.zeros(16_000, np.float32)) == []
    events = VadDetector(VadParams(prefix_padding_ms=0, silence_duration_ms=300)).feed(x16)
    assert [e.kind for e in events] == ["start", "stop"]
    speech_end_ms = 1000 + len(speech["hello"]) * 1000 // 24_000
    assert 950 <= events[0].sample / 16 <= 1300
    assert speech_end_ms - 300 <= events[1].sample / 16 <= speech_end_ms + 500


def test_session_update_dialects_and_errors() -> None:
    cfg = SessionConfig(model="m")
    beta, dialect = apply_update(cfg, ce.decode_client(
        b'{"type":"session.update","session":{"input_audio_format":"g711_ulaw","turn_detection":{"silence_duration_ms":200}}}'
    ).session)
    assert dialect is None and beta.input_audio_format == "g711_ulaw"
    assert beta.turn_detection is not None and beta.turn_detection.silence_duration_ms == 200
    ga, dialect = apply_update(cfg, ce.decode_client(
        b'{"type":"session.update","session":{"type":"realtime","output_modalities":["text"],'
        b'"audio":{"input":{"format":{"type":"audio/pcma"},"turn_detection":null}}}}').session)
    assert dialect == "ga" and ga.modalities == ("text",) and ga.turn_detection is None
    assert ga.input_audio_format == "g711_alaw"
    with pytest.raises(ce.BadEvent) as err:
        apply_update(cfg, ce.decode_client(
            b'{"type":"session.update","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":16000}}}}}'
        ).session)
    assert err.value.param == "session.audio.input.format.rate"


def test_request_carries_history_instructions_and_newest_audio() -> None:
    pipe = get_pipeline("synthetic")
    audio = np.ones(1600, np.float32)
    older = np.zeros(800, np.float32)
    items = [
        Item("a", "user", [Part("input_audio", audio=audio, transcript="earlier words")]),
        Item("b", "assistant", [Part("audio", transcript="an answer")]),
        Item("c", "user", [Part("input_text", text="listen:"), Part("input_audio", audio=older)]),
        Item("d", "user", [Part("input_audio", audio=audio)]),
    ]
    opts = Options.build(SessionConfig(model="m", instructions="be brief", max_output_tokens=7), None, None)
    turn = build_request(pipe, opts, items)
    # the chat-input convention: media parts name top-level arrays, "audio" for the last user message
    assert turn.audio_item is items[3] and turn.inputs["audio"] is audio and turn.inputs["sample_rate"] == 16_000
    assert turn.inputs["audio_1"] is older
    assert turn.inputs["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "earlier words"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "listen:"},
                                     {"type": "input_audio", "array": "audio_1", "sample_rate": 16_000}]},
        {"role": "user", "content": [{"type": "input_audio", "array": "audio", "sample_rate": 16_000}]},
    ]
    assert turn.params["max_tokens"] == 7 and turn.wanted == {"text", "audio"}
    text_only = Options.build(SessionConfig(model="m"), ce.ResponseIn(modalities=["text"]), None)
    turn = build_request(pipe, text_only, items[:2])
    assert turn.wanted == {"text"} and turn.audio_item is None and "max_tokens" not in turn.params
    assert pipe.stages_for_outputs(turn.wanted) == (0,)


def test_truncate_keeps_what_was_heard() -> None:
    part = Part("audio", transcript="one two three", audio_ms=300, segments=[(0, "one"), (100, " two"), (200, " three")])
    truncate(part, 150)
    assert (part.transcript, part.audio_ms) == ("one two", 150)
    plain = Part("audio", transcript="a b c d", audio_ms=400)
    truncate(plain, 200)
    assert plain.transcript == "a b"
