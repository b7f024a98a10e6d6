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
