"""A full-duplex model's edges: refused sessions, REST requests, a stream the server ends (tiny Moshi, real server).

The deploy's duplex slots equal the server's realtime cap, so the cap is the limit a
refused client meets first: it must get the same `error` event and count as the
duplex limit's refusals do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import idle
from tests.api.realtime.conftest import Client, RtServer, b64, serve_rt
from tests.api.realtime.test_duplex import CLOSE_TIMEOUT_S, connect, frames, voice
from tests.conftest import eventually

SLOTS = 2
"""The duplex stage's batch slots, and the server's max_realtime_sessions."""


@pytest.fixture(scope="module")
async def srv(tiny_moshi: Path) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": SLOTS, "engine_extras": {"frame_budget": 0}}]
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages,
                        server={"max_realtime_sessions": SLOTS}) as server:
        yield server


async def closed_with(client: Client) -> int:
    """The close code the server sent (after any events already read)."""
    msg = await client.ws.receive(timeout=CLOSE_TIMEOUT_S)
    assert msg.type == aiohttp.WSMsgType.CLOSE, f"expected a close, got {msg.type} {msg.data!r}"
    await client.ws.close()
    return int(msg.data)


async def rejected_metric(srv: RtServer, http: aiohttp.ClientSession) -> float:
    async with http.get(srv.url + "/metrics", headers=srv.headers) as resp:
        text = await resp.text()
    line = next(ln for ln in text.splitlines() if ln.startswith("omni_duplex_sessions_rejected_total"))
    return float(line.split()[-1])


async def test_a_session_past_the_server_cap_gets_the_error_event_and_is_counted(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        blockers = [await connect(srv, http) for _ in range(SLOTS)]
        before, total_before = srv.stats().duplex.sessions_rejected, srv.stats().sessions_rejected
        ws = await http.ws_connect(srv.url + "/v1/realtime?model=moshi", headers=srv.headers, autoclose=False)
        refused = Client(ws)
        event = await refused.recv()
        assert event["type"] == "error", event
        assert event["error"]["code"] == "session_limit_reached" and str(SLOTS) in event["error"]["message"]
        assert await closed_with(refused) == 1013
        assert srv.stats().duplex.sessions_rejected == before + 1
        assert srv.stats().sessions_rejected == total_before + 1
        assert await rejected_metric(srv, http) == before + 1
        for b in blockers:
            await b.ws.close()
        await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)
        again = await connect(srv, http)  # a slot is free again: the next session opens
        await again.ws.close()


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": "moshi", "messages": [{"role": "user", "content": "hi"}],
                              "modalities": ["audio"], "audio": {"voice": "alloy", "format": "wav"}}),
    ("/v1/responses", {"model": "moshi", "input": "hi"}),
    ("/v1/audio/speech", {"model": "moshi", "input": "hello", "voice": "alloy"}),
])
async def test_rest_requests_to_a_full_duplex_model_are_refused(srv: RtServer, path: str,
                                                                body: dict[str, Any]) -> None:
    total = srv.orch.statistics().requests_total
    async with aiohttp.ClientSession() as http, \
            http.post(srv.url + path, json=body, headers=srv.headers) as resp:
        answer = await resp.json()
    assert resp.status == 400, answer
    err = answer["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", "model", "full_duplex_model"), err
    assert "full-duplex" in err["message"] and "/v1/realtime" in err["message"]
    assert srv.orch.statistics().requests_total == total  # nothing reached the stage


async def test_session_update_checks_a_duplex_session_as_every_session(srv: RtServer) -> None:
    """A duplex session gets every session's session.update checks (before its own): a transcription
    session, tools or a forced call Moshi cannot serve are `error` events, and the session stays a
    conversation whose first append opens a response."""
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http, dialect="ga")
        refusals: list[tuple[dict[str, Any], str, str]] = [  # session fields, code, param
            ({"type": "transcription"}, "unsupported_session_type", "session.type"),
            ({"type": "transcription", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
             "unsupported_session_type", "session.type"),
            ({"type": "realtime", "tools": [{"type": "function", "name": "lookup"}]},
             "unsupported_parameter", "session.tools"),
            ({"type": "realtime", "tool_choice": "required"}, "unsupported_parameter", "session.tool_choice"),
        ]
        for i, (fields, code, param) in enumerate(refusals):
            eid = await client.send("session.update", session=fields, event_id=f"u{i}")
            event = await client.recv()
            assert event["type"] == "error", (fields, event)
            err = event["error"]
            assert (err["code"], err["param"], err["event_id"]) == (code, param, eid), (fields, err)
        assert "makes no transcripts" in (await _refused(client, {"type": "transcription"}))["message"]
        await client.send("session.update", session={"type": "realtime", "instructions": "hi"})
        session = (await client.until("session.updated"))[-1]["session"]
        assert (session["type"], session["object"]) == ("realtime", "realtime.session")
        assert session["tools"] == [] and session["tool_choice"] == "auto"
        await client.send("input_audio_buffer.append", audio=b64(voice(6, 0.16)))
        opened = await client.until("response.created", timeout_s=CLOSE_TIMEOUT_S)
        assert not [e for e in opened if e["type"] == "error"], opened
        assert opened[-1]["response"]["output_modalities"] == ["audio"]
        await client.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and not srv.sessions and idle(srv.orch),
                     CLOSE_TIMEOUT_S)


async def _refused(client: Client, fields: dict[str, Any]) -> dict[str, Any]:
    await client.send("session.update", session=fields)
    event = await client.recv()
    assert event["type"] == "error", event
    return event["error"]


async def test_what_the_model_would_never_hear_is_refused_not_silently_taken(srv: RtServer) -> None:
    """Moshi hears only the audio stream (its adapter takes no text): a text item, `response.input` and an
    out-of-band response.create are `error` events naming what is not served, nothing is added and no
    stream starts; so are a beta transcription session (it makes no transcripts). A plain response.create
    still opens the model's response."""
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        total = srv.orch.statistics().requests_total
        text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hello"}]}
        refusals: list[tuple[str, dict[str, Any], str, str | None]] = [  # event, fields, code, param
            ("conversation.item.create", {"item": text}, "unsupported_in_duplex_session", "item"),
            ("response.create", {"response": {"conversation": "none"}}, "unsupported_parameter",
             "response.conversation"),
            ("response.create", {"response": {"conversation": "none", "input": [text]}}, "unsupported_parameter",
             "response.conversation"),
            ("response.create", {"response": {"input": [text]}}, "unsupported_parameter", "response.input"),
            ("transcription_session.update", {"session": {}}, "unsupported_session_type", None),
        ]
        for i, (kind, fields, code, param) in enumerate(refusals):
            eid = await client.send(kind, event_id=f"r{i}", **fields)
            event = await client.recv()
            assert event["type"] == "error", (kind, fields, event)
            err = event["error"]
            assert (err["code"], err["param"], err["event_id"]) == (code, param, eid), (kind, fields, err)
        assert "hears only the audio stream" in client.seen[-5]["error"]["message"]
        assert srv.stats().duplex.sessions_live == 1
        assert srv.orch.statistics().requests_total == total  # no stream was started
        await client.send("response.create")
        assert (await client.until("response.created", timeout_s=CLOSE_TIMEOUT_S))[-1]["type"] == "response.created"
        await client.ws.close()
        async with http.get(srv.url + "/v1/realtime?model=moshi&intent=transcription",
                            headers={**srv.headers, "Upgrade": "websocket"}) as resp:
            body = await resp.json()
        assert resp.status == 400, body
        assert (body["error"]["code"], body["error"]["param"]) == ("unsupported_session_type", "intent"), body
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and not srv.sessions and idle(srv.orch),
                     CLOSE_TIMEOUT_S)


async def test_a_response_the_live_stream_would_not_be_is_refused_not_ignored(srv: RtServer) -> None:
    """response.create fields were accepted and ignored: a client asking for text only, G.711 or a forced tool
    call got the session's pcm16 stream. Each is an `error` naming the field; a bad value gets every
    session's code; a response.create with the session's own values opens the response."""
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    refusals: list[tuple[dict[str, Any], str, str]] = [  # response, code, param
        ({"output_audio_format": "bogus"}, "invalid_value", "response.output_audio_format"),
        ({"output_audio_format": "g711_ulaw"}, "unsupported_parameter", "response.output_audio_format"),
        ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "unsupported_parameter",
         "response.audio.output.format"),
        ({"modalities": ["text"]}, "unsupported_parameter", "response.modalities"),
        ({"output_modalities": ["text"]}, "unsupported_parameter", "response.output_modalities"),
        ({"tools": [tool]}, "unsupported_parameter", "response.tools"),
        ({"temperature": 0.2}, "unsupported_parameter", "response.temperature"),
        ({"max_output_tokens": 5}, "unsupported_parameter", "response.max_output_tokens"),
    ]
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        total = srv.orch.statistics().requests_total
        for i, (response, code, param) in enumerate(refusals):
            eid = await client.send("response.create", event_id=f"r{i}", response=response)
            event = await client.recv()
            assert event["type"] == "error", (response, event)
            assert (event["error"]["code"], event["error"]["param"], event["error"]["event_id"]) == (code, param, eid)
        assert srv.orch.statistics().requests_total == total  # no stream was started
        await client.send("response.create", response={"output_audio_format": "pcm16", "modalities": ["audio", "text"],
                                                       "max_output_tokens": "inf", "metadata": {"k": "v"}})
        assert (await client.until("response.created", timeout_s=CLOSE_TIMEOUT_S))[-1]["type"] == "response.created"
        await client.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and not srv.sessions and idle(srv.orch),
                     CLOSE_TIMEOUT_S)


async def test_a_stream_the_server_aborts_ends_the_session_with_an_error(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=b64(voice(5, 0.16)))
        await frames(client, 1)
        (session,) = srv.sessions
        assert session.stream is not None
        srv.orch.abort(session.stream.request_id)  # what the orchestrator does to an overflowing stream
        events = await client.until("error", timeout_s=CLOSE_TIMEOUT_S)
        done = [e for e in events if e["type"] == "response.done"]
        assert done and done[-1]["response"]["status"] == "failed", events[-3:]
        assert events[-1]["error"]["code"] == "request_aborted", events[-1]
        assert await closed_with(client) == 1011
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and not srv.sessions and idle(srv.orch),
                     CLOSE_TIMEOUT_S)
    await eventually(lambda: idle(srv.orch), CLOSE_TIMEOUT_S)


async def test_slots_a_frame_cannot_step_in_time_are_dropped_and_the_session_limit_follows(tiny_moshi: Path) -> None:
    # No real step fits a millionth of a frame: the engine keeps one slot, the least it can.
    stages = [{"stage_id": 0, "max_num_seqs": 3, "engine_extras": {"frame_budget": 1e-6}}]
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages) as small, aiohttp.ClientSession() as http:
        assert small.orch.workers[0][0].capacity == 1
        sdk = AsyncOpenAI(api_key=small.key, base_url=f"{small.url}/v1", max_retries=0)
        listed = (await sdk.models.retrieve("moshi")).model_extra
        assert listed["session_limit"] == 1 and "full_duplex" in listed["features"]
        first = await connect(small, http)
        ws = await http.ws_connect(small.url + "/v1/realtime?model=moshi", headers=small.headers, autoclose=False)
        refused = Client(ws)
        event = await refused.recv()
        assert event["error"]["code"] == "session_limit_reached" and "serves 1 sessions" in event["error"]["message"]
        assert await closed_with(refused) == 1013
        await first.send("input_audio_buffer.append", audio=b64(voice(5, 0.16)))
        audio, _, _ = await frames(first, 2)  # the slot kept serves
        assert len(audio) == 2
        async with http.get(small.url + "/metrics", headers=small.headers) as resp:
            assert "omni_duplex_session_limit 1.0" in (await resp.text()).splitlines()
        await first.ws.close()


async def test_a_frame_budget_that_is_no_share_of_a_frame_fails_start_naming_it(tiny_moshi: Path) -> None:
    from omni_actors.errors import StartupError
    from omni_actors.orchestrator.core import Orchestrator
    from tests.conftest import make_deploy

    orch = Orchestrator(make_deploy("moshi", model=str(tiny_moshi), stages=[
        {"stage_id": 0, "max_num_seqs": 1, "engine_extras": {"frame_budget": "fast"}}]))
    with pytest.raises(StartupError) as err:
        await orch.start()
    assert "engine_extras.frame_budget: 'fast'" in str(err.value)
    assert orch.runtime is not None and not orch.runtime.path.exists()
