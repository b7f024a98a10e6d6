"""A realtime session's voice is checked against the pipeline's voices, as POST /v1/audio/speech checks it.

A tiny CSM checkpoint (voices "0" and "1") behind a real server: an unknown voice in
`session.update` (beta `voice` or GA `audio.output.voice`) gets an `error` event with
REST's code and the field as `param`; the session keeps its voice and goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from omni_actors.models.tiny import make_tiny
from tests.api.realtime.conftest import Client, RtServer, serve_rt


@pytest.fixture(scope="module")
async def srv(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RtServer]:
    model = make_tiny("csm", tmp_path_factory.mktemp("csm"))
    async with serve_rt("csm", model=str(model)) as server:
        yield server


async def open_session(srv: RtServer, http: aiohttp.ClientSession) -> Client:
    ws = await http.ws_connect(srv.url + "/v1/realtime?model=csm", headers=srv.headers, autoclose=False)
    client = Client(ws)
    assert (await client.recv())["type"] == "session.created"
    assert (await client.recv())["type"] == "conversation.created"
    return client


async def test_rest_refuses_the_voice_the_session_refuses(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            srv.url + "/v1/audio/speech", headers=srv.headers,
            json={"model": "csm", "input": "hi", "voice": "nobody"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "unknown_voice"


@pytest.mark.parametrize(("session", "param"), [
    ({"voice": "nobody"}, "session.voice"),
    ({"type": "realtime", "audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
])
async def test_an_unknown_voice_is_refused_and_the_session_goes_on(srv: RtServer, session: dict,
                                                                   param: str) -> None:
    async with aiohttp.ClientSession() as http:
        c = await open_session(srv, http)
        eid = await c.send("session.update", session=session)
        err = (await c.until("error"))[-1]["error"]
        assert (err["type"], err["code"], err["param"], err["event_id"]) == (
            "invalid_request_error", "unknown_voice", param, eid), err
        assert "'0'" in err["message"]  # names the voices the model has
        await c.send("session.update", session={"voice": "1"})  # a voice it has: accepted
        updated = (await c.until("session.updated"))[-1]["session"]
        assert updated.get("voice", updated.get("audio", {}).get("output", {}).get("voice")) == "1"
        await c.send("session.update", session={"voice": "alloy"})  # OpenAI's names map onto its voices
        await c.until("session.updated")
        await c.ws.close()


async def test_a_response_with_an_unknown_voice_is_refused_before_it_starts(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await open_session(srv, http)
        await c.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
        await c.until("conversation.item.created")
        eid = await c.send("response.create", response={"voice": "nobody"})
        got = await c.until("error")
        assert not any(e["type"] == "response.created" for e in got)
        err = got[-1]["error"]
        assert (err["code"], err["param"], err["event_id"]) == ("unknown_voice", "response.voice", eid), err
        await c.send("session.update", session={"voice": "1"})  # the session goes on
        await c.until("session.updated")
        await c.ws.close()
