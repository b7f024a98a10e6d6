"""Every upload route answers a multipart body it cannot parse with a 400, never a 500.

The routes share one reader (api/multipart.py: `form_parts`, `BodyBudget`); each is
called here over real HTTP with bodies aiohttp's reader refuses, then with a
well-formed form, which gets that route's ordinary answer (the server is fine after).
"""

from __future__ import annotations

import aiohttp
import msgspec
import pytest

from omni_actors.api.errors import ApiError
from tests.api.conftest import Server, serve

UPLOAD_ROUTES = {"/v1/audio/transcriptions": b"model", "/v1/audio/voice_consents": b"name", "/v1/audio/voices": b"name",
                 "/v1/images/edits": b"prompt", "/v1/videos": b"prompt"}
"""Each upload route (/v1/videos/sync reads its form as /v1/videos does), with a field it accepts: the
bodies below break only the form's syntax, never name a field the route would refuse first."""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic") as s:
        yield s


def _part(name: bytes, value: bytes, extra: bytes = b"") -> bytes:
    return b"--XyZ\r\nContent-Disposition: form-data; name=\"" + name + b"\"\r\n" + extra + b"\r\n" + value + b"\r\n"


BAD_BODIES = [
    pytest.param(lambda f: _part(f[:2] + b"\x14" + f[2:], b"x") + b"--XyZ--\r\n", id="control-char-in-disposition"),
    pytest.param(lambda f: _part(f, b"x", b"X-\x07: a\r\n") + b"--XyZ--\r\n", id="control-char-in-header-name"),
    pytest.param(lambda f: b"--XyZ\r\nContent-Disposition: form-data; name=\"" + f + b"\"\r\n\r\nabc", id="truncated"),
    pytest.param(lambda f: b"--XyZ\r\nContent-Type: multipart/mixed; boundary=Q\r\n\r\n--Q\r\n\r\nx\r\n--Q--\r\n"
                 b"--XyZ--\r\n", id="nested-multipart"),
    pytest.param(lambda f: b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--\r\n", id="part-without-name"),
    # aiohttp keeps bytes that are not UTF-8 as lone surrogates, which the error body could not encode (a 500)
    pytest.param(lambda f: _part(b"\xff\xfe" + f, b"x") + b"--XyZ--\r\n", id="name-not-utf8"),
]


async def _post(srv: Server, route: str, **kwargs) -> tuple[int, dict]:
    async with aiohttp.ClientSession(headers=srv.headers) as http, http.post(srv.url + route, **kwargs) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("route", UPLOAD_ROUTES)
@pytest.mark.parametrize("body", BAD_BODIES)
async def test_an_unparseable_form_is_a_400_on_every_upload_route(srv: Server, route: str, body) -> None:
    status, answer = await _post(srv, route, data=body(UPLOAD_ROUTES[route]),
                                 headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
    assert (status, answer["error"]["code"]) == (400, "invalid_multipart"), answer
    well_formed = aiohttp.FormData({"unknown_field": "x"}, default_to_multipart=True)
    status, answer = await _post(srv, route, data=well_formed)
    assert status == 400 and answer["error"]["code"] != "invalid_multipart", answer


def test_an_error_echoing_bytes_that_are_not_utf8_is_still_a_json_body() -> None:
    """A message or param holding a lone surrogate (how aiohttp keeps a header's bytes that are not UTF-8) is
    answered with them escaped, not as a 500 from the encoder."""
    resp = ApiError(400, "unknown form field `\udcff`", "\udcff", "unknown_parameter").response()
    assert resp.status == 400 and resp.body is not None
    error = msgspec.json.decode(resp.body)["error"]
    assert error == {"message": "unknown form field `\\udcff`", "type": "invalid_request_error",
                     "param": "\\udcff", "code": "unknown_parameter"}
