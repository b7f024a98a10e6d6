"""/v1/audio/transcriptions without a speech model: form mistakes, a pipeline without ASR, and the timed
formats (verbose_json, srt, vtt) of synthetic_asr, a recognizer that does not time its text (one segment
over the audio).

(Whisper's own segment and word timestamps are tested with the assistant in
tests/models/test_assistant_serving.py.)
"""

from __future__ import annotations

import io
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.api.conftest import Server, serve

ROUTE = "/v1/audio/transcriptions"
WAV = b"RIFF" + b"\x00" * 40


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", server={"max_body_mb": 0.05}) as s:
        yield s


@pytest.fixture(scope="module")
async def asr_srv():
    async with serve("synthetic_asr") as s:
        yield s


def form(**fields: Any) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        if isinstance(value, bytes):
            data.add_field(name, value, filename="a.wav", content_type="audio/wav")
        else:
            data.add_field(name, str(value))
    return data


async def call(srv: Server, **kwargs: Any) -> tuple[int, dict]:
    async with aiohttp.ClientSession(headers=srv.headers) as http, http.post(srv.url + ROUTE, **kwargs) as resp:
        body = await resp.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        return resp.status, body["error"]


@pytest.mark.parametrize(("kwargs", "status", "param", "code"), [
    pytest.param({"json": {"model": "synthetic"}}, 415, None, "unsupported_media_type", id="json-body"),
    pytest.param({"data": form(model="synthetic")}, 400, "file", "missing_required_parameter", id="no-file"),
    pytest.param({"data": form(file=WAV)}, 400, "model", "missing_required_parameter", id="no-model"),
    pytest.param({"data": form(file=WAV, model="synthetic", speed=2)}, 400, "speed", "unknown_parameter",
                 id="unknown-field"),
    pytest.param({"data": form(file=WAV, model="nope")}, 404, "model", "model_not_found", id="unknown-model"),
    pytest.param({"data": form(file=WAV, model="synthetic")}, 400, "model", "unsupported_modality",
                 id="pipeline-without-asr"),
    pytest.param({"data": form(file=b"x" * 100_000, model="synthetic")}, 413, None, "body_too_large",
                 id="too-large"),
])
async def test_form_mistakes_are_4xx_naming_the_field(
        srv: Server, kwargs: dict, status: int, param: str | None, code: str) -> None:
    before = srv.orch.statistics().requests_total
    got_status, err = await call(srv, **kwargs)
    assert (got_status, err["param"], err["code"]) == (status, param, code), err
    assert srv.orch.statistics().requests_total == before  # nothing reached a stage


def _part(name: bytes, value: bytes, extra: bytes = b"") -> bytes:
    return b"--XyZ\r\nContent-Disposition: form-data; name=\"" + name + b"\"\r\n" + extra + b"\r\n" + value + b"\r\n"


@pytest.mark.parametrize(("content_type", "body", "code"), [
    pytest.param("multipart/form-data", _part(b"model", b"synthetic") + b"--XyZ--\r\n", "invalid_multipart",
                 id="no-boundary"),
    pytest.param("multipart/form-data; boundary=" + "a" * 100, b"--" + b"a" * 100 + b"\r\n\r\nx\r\n",
                 "invalid_multipart", id="boundary-over-70-chars"),
    pytest.param("multipart/form-data; boundary=XyZ", _part(b"mo\x01del", b"synthetic") + b"--XyZ--\r\n",
                 "invalid_multipart", id="control-char-in-disposition"),
    pytest.param("multipart/form-data; boundary=XyZ", _part(b"model", b"synthetic", b"X-\x07: a\r\n") + b"--XyZ--\r\n",
                 "invalid_multipart", id="control-char-in-header-name"),
    pytest.param("multipart/form-data; boundary=XyZ", b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nRIFF",
                 "invalid_multipart", id="truncated"),
    pytest.param("multipart/form-data; boundary=XyZ", b"no boundary anywhere", "invalid_multipart",
                 id="no-starting-boundary"),
    pytest.param("multipart/form-data; boundary=XyZ",
                 b"--XyZ\r\nContent-Type: multipart/mixed; boundary=Q\r\n\r\n--Q\r\n\r\nx\r\n--Q--\r\n--XyZ--\r\n",
                 "invalid_multipart", id="nested-multipart"),
    pytest.param("multipart/form-data; boundary=XyZ", b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--\r\n",
                 "invalid_multipart", id="part-without-name"),
])
async def test_unparseable_multipart_is_a_400(srv: Server, content_type: str, body: bytes, code: str) -> None:
    before = srv.orch.statistics().requests_total
    status, err = await call(srv, data=body, headers={"Content-Type": content_type})
    assert (status, err["code"], err["type"]) == (400, code, "invalid_request_error"), err
    assert srv.orch.statistics().requests_total == before
    # the server is fine afterwards: a well-formed upload gets its ordinary answer
    status, err = await call(srv, data=form(file=WAV, model="nope"))
    assert (status, err["code"]) == (404, "model_not_found"), err


SECONDS = 2.5


def _tone() -> bytes:
    buf = io.BytesIO()
    t = np.arange(int(SECONDS * 16_000)) / 16_000
    sf.write(buf, (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16_000, format="WAV")
    return buf.getvalue()


TONE = _tone()
SAID = f"{int(SECONDS * 16_000)} samples at 16000 Hz"
"""What synthetic_asr hears in TONE."""


async def test_timed_formats_of_an_untimed_recognizer(asr_srv: Server) -> None:
    """verbose_json, srt and vtt through the SDK: the transcript is one segment spanning the audio."""
    client = asr_srv.client()
    verbose = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                       response_format="verbose_json")
    assert (verbose.text, verbose.duration, verbose.task) == (SAID, SECONDS, "transcribe")
    assert [(s.id, s.start, s.end, s.text) for s in verbose.segments] == [(0, 0.0, SECONDS, SAID)]
    assert verbose.words is None and verbose.usage.seconds == 3
    srt = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE), response_format="srt")
    assert srt == f"1\n00:00:00,000 --> 00:00:02,500\n{SAID}\n"
    vtt = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE), response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:02.500\n{SAID}\n"
    segment = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                       response_format="verbose_json",
                                                       timestamp_granularities=["segment"])
    assert segment.segments[0].end == SECONDS


@pytest.mark.parametrize(("fields", "param", "says"), [
    pytest.param({"response_format": "verbose_json", "timestamp_granularities[]": "word"},
                 "timestamp_granularities", "does not time words", id="words-from-an-untimed-recognizer"),
    pytest.param({"timestamp_granularities[]": "segment"}, "timestamp_granularities", "needs response_format",
                 id="granularity-without-verbose-json"),
    pytest.param({"response_format": "verbose_json", "timestamp_granularities[]": "sentence"},
                 "timestamp_granularities", "segment and/or word", id="unknown-granularity"),
    pytest.param({"response_format": "srt", "stream": "true"}, "stream", "not streamed", id="streamed-srt"),
    pytest.param({"response_format": "tsv"}, "response_format", "verbose_json", id="unknown-format"),
])
async def test_timed_format_mistakes_are_400s(asr_srv: Server, fields: dict, param: str, says: str) -> None:
    before = asr_srv.orch.statistics().requests_total
    status, err = await call(asr_srv, data=form(file=TONE, model="synthetic_asr", **fields))
    assert (status, err["param"]) == (400, param) and says in err["message"], err
    assert asr_srv.orch.statistics().requests_total == before
    with pytest.raises(openai.BadRequestError):  # the SDK's list form, too
        await asr_srv.client().audio.transcriptions.create(
            model="synthetic_asr", file=("a.wav", TONE), response_format="json", timestamp_granularities=["word"])


def _encoded(container: str, codec: str, rate: int) -> bytes:
    """TONE's samples (2.5 s at 16 kHz) in a container libsndfile does not read, encoded by FFmpeg."""
    import av

    t = np.arange(int(SECONDS * rate)) / rate
    samples = (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as box:
        stream = box.add_stream(codec, rate=rate, layout="mono")
        frame_size = 960 if codec == "libopus" else 1024
        for at in range(0, samples.size, frame_size):
            frame = av.AudioFrame.from_ndarray(samples[None, at : at + frame_size], format="flt", layout="mono")
            frame.rate = rate
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize(("name", "container", "codec", "rate"), [
    ("a.m4a", "mp4", "aac", 16_000), ("a.webm", "webm", "libopus", 48_000), ("a.aac", "adts", "aac", 16_000),
])  # fmt: skip
async def test_files_libsndfile_does_not_read_are_decoded_by_ffmpeg(
    asr_srv: Server, name: str, container: str, codec: str, rate: int
) -> None:
    data = _encoded(container, codec, rate)
    with pytest.raises(sf.LibsndfileError):
        sf.info(io.BytesIO(data))
    said = await asr_srv.client().audio.transcriptions.create(model="synthetic_asr", file=(name, data))
    heard = int(said.text.split()[0])
    # at the file's own rate (the recognizer resamples), give or take the codec's priming and padding
    assert said.text == f"{heard} samples at {rate} Hz" and abs(heard - SECONDS * rate) <= 0.15 * rate


async def test_verbose_json_language_is_openais_name(asr_srv: Server) -> None:
    """`language` is the lower-case English name Whisper (and so OpenAI) uses, from a code or a name in any
    case, as a client sends it or a recognizer reports it (before 2026-12-05 a name was echoed as sent and
    only 29 codes were named)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    from omni_actors.api.transcript_formats import language_name

    for code, name in LANGUAGES.items():
        assert language_name(code) == language_name(code.upper()) == language_name(name.title()) == name
    assert (language_name("Filipino"), language_name("mandarin"), language_name(None)) == ("tagalog", "chinese", "")
    client = asr_srv.client()
    for asked, named in (("German", "german"), ("hu", "hungarian"), (None, "")):
        extra = {"language": asked} if asked else {}
        verbose = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                           response_format="verbose_json", **extra)
        assert verbose.language == named, (asked, verbose.language)
