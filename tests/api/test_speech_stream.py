"""The text-in socket /v1/audio/speech/stream on a real server with real workers: a text keeps the settings it
started with, session.update is refused mid-text, every frame the client sends gets an answer."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.api.conftest import Server, eventually, idle
from tests.api.test_speech_rates import CHUNKS, MODEL_RATE, SAMPLES, serve_voiced

WS_TIMEOUT_S = 30
IDLE_TIMEOUT_S = 10
ERROR_KEYS = {"type", "code", "message", "param", "event_id"}
LONG_TEXT = "One, two, three, four, five, six, seven, eight."
"""Eight clauses: long enough that the texts sent after it are still waiting when a session.update arrives."""


def pcm_bytes(clauses: int) -> int:
    """The pcm (24 kHz, 16 bit) the synthetic pipeline makes for `clauses` clauses."""
    return 2 * round(clauses * CHUNKS * SAMPLES * 24000 / MODEL_RATE)


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve_voiced() as s:
        yield s


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive(timeout=WS_TIMEOUT_S)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def until(ws: aiohttp.ClientWebSocketResponse, last: str, count: int = 1) -> list[dict[str, Any]]:
    """Events up to and including the `count`-th `last`."""
    got: list[dict[str, Any]] = []
    while sum(e["type"] == last for e in got) < count:
        got.append(await receive(ws))
    return got


async def opened(http: aiohttp.ClientSession, srv: Server) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(f"{srv.url}/v1/audio/speech/stream")
    assert (await receive(ws))["type"] == "session.created"
    return ws


async def say(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    await ws.send_json({"type": "input_text.append", "text": text})
    await ws.send_json({"type": "input_text.done"})


def texts(events: list[dict[str, Any]]) -> list[bytes]:
    """The audio of each text in `events`, split at speech.audio.done."""
    out, cur = [], b""
    for e in events:
        if e["type"] == "speech.audio.delta":
            cur += base64.b64decode(e["audio"])
        elif e["type"] == "speech.audio.done":
            out, cur = [*out, cur], b""
    return out


async def test_an_update_after_done_leaves_the_texts_already_sent_as_they_were(
        srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[Any] = []
    submit = srv.orch.submit
    monkeypatch.setattr(srv.orch, "submit", lambda spec: (seeds.append(spec.params.get("seed")), submit(spec))[1])
    async with aiohttp.ClientSession() as http, await opened(http, srv) as ws:
        await ws.send_json({"type": "session.update", "session": {"seed": 3}})
        assert (await receive(ws))["session"]["seed"] == 3
        await say(ws, LONG_TEXT)
        await say(ws, "Second text. ")
        await ws.send_json({"type": "session.update", "session": {"response_format": "wav", "seed": 7}})
        events = await until(ws, "speech.audio.done", 2)
        updated = [e for e in events if e["type"] == "session.updated"]
        assert len(updated) == 1 and updated[0]["session"]["response_format"] == "wav", events
        first, second = texts(events)
        assert first[:4] != b"RIFF" and len(first) == pcm_bytes(8)  # pcm, as when it was sent
        assert second[:4] != b"RIFF" and len(second) == pcm_bytes(1)
        assert seeds == [3] * 9
        await say(ws, "Third text.")  # the update applies to the texts after it
        (third,) = texts(await until(ws, "speech.audio.done"))
        assert third[:4] == b"RIFF" and seeds[9:] == [7]
    await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)


@pytest.mark.parametrize("mid_text", [
    [{"type": "input_text.append", "text": "Hello"}],  # buffered, no clause end yet
    [{"type": "input_text.append", "text": "Hello, there"}],  # a clause started, the rest buffered
    [{"type": "input_text.append", "text": "Hello"}, {"type": "input_text.flush"}],  # all started, not done
])
async def test_an_update_in_the_middle_of_a_text_is_an_error_and_the_session_lives_on(
        srv: Server, mid_text: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as http, await opened(http, srv) as ws:
        for event in mid_text:
            await ws.send_json(event)
        await ws.send_json({"type": "session.update", "session": {"response_format": "wav"}, "event_id": "u1"})
        err = await receive(ws)
        while err["type"] == "speech.audio.delta":  # a started clause may speak first
            err = await receive(ws)
        assert err["type"] == "error" and set(err["error"]) == ERROR_KEYS, err
        assert (err["error"]["code"], err["error"]["param"], err["error"]["event_id"]) == (
            "text_in_progress", "session", "u1")
        await ws.send_json({"type": "input_text.done"})
        events = await until(ws, "speech.audio.done")
        assert not [e for e in events if e["type"] == "error"], events
        assert texts(events)[0][:4] != b"RIFF"  # the refused update changed nothing
        await ws.send_json({"type": "session.update", "session": {"response_format": "wav"}})
        updated = await receive(ws)  # between texts the same update is taken
        assert updated["type"] == "session.updated" and updated["session"]["response_format"] == "wav"
    await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)


async def test_a_binary_frame_is_answered_and_the_session_lives_on(srv: Server) -> None:
    """Binary frames are read as the same JSON events, as on /v1/realtime; bytes that are not one are an error."""
    async with aiohttp.ClientSession() as http, await opened(http, srv) as ws:
        await ws.send_bytes(b"\x00\x01RIFF not an event")
        err = await receive(ws)
        assert err["type"] == "error" and set(err["error"]) == ERROR_KEYS, err
        assert (err["error"]["type"], err["error"]["code"]) == ("invalid_request_error", "invalid_event")
        await ws.send_bytes(json.dumps({"type": "input_text.append", "text": "Sent as bytes."}).encode())
        await ws.send_bytes(json.dumps({"type": "input_text.done"}).encode())
        events = await until(ws, "speech.audio.done")
        assert [len(t) for t in texts(events)] == [pcm_bytes(1)], events
        await ws.send_str("{not json")
        err = await receive(ws)  # the text frame's twin, for comparison
        assert err["type"] == "error" and err["error"]["code"] == "invalid_event"


async def test_a_bad_update_names_the_session_field(srv: Server) -> None:
    """Update errors named `session.model` / `session.speed` but plain `voice` or `session` for the others."""
    async with aiohttp.ClientSession() as http, await opened(http, srv) as ws:
        for session, param in (({"voice": "nobody"}, "session.voice"), ({"speed": "fast"}, "session.speed"),
                               ({"seed": 1.5}, "session.seed")):
            await ws.send_json({"type": "session.update", "session": session})
            err = await receive(ws)
            assert err["type"] == "error" and err["error"]["param"] == param, (session, err)
