"""/v1/audio/transcriptions refusals that need no speech model: form mistakes and a pipeline without ASR.

(A real transcription, in every response format, is tested with the assistant's Whisper in
tests/models/test_assistant_serving.py.)
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.api.conftest import Server, serve

ROUTE = "/v1/audio/transcriptions"
WAV = b"RIFF" + b"\x00" * 40


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", server={"max_body_mb": 0.05}) as s:
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
