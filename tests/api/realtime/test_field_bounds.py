"""Sizes a client may send are bounded, the same in REST and realtime, and a client's mistake is typed as one.

One synthetic server: chat fields over REST (a 400 naming the field) and the same
fields in realtime `session.update` / `response.create` (an `error` event naming
it, the session kept); a response the stage refuses for the client's values
(absurd `max_response_output_tokens`) fails as invalid_request_error.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import aiohttp
import pytest

from omni_actors import settings as settings_mod
from omni_actors.api.realtime.audio import WIRE_RATE
from omni_actors.api.schemas import MAX_INSTRUCTIONS_CHARS, MAX_NAME_CHARS, MAX_TOOLS
from tests.api.conftest import post
from tests.api.realtime.conftest import RtServer, connect

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "a b"}]
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
CHAT_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"audio": {"voice": "v" * (MAX_NAME_CHARS + 1)}}, "audio.voice", id="huge-voice"),
    pytest.param({"user": "u" * 100_000}, "user", id="huge-user"),
    pytest.param({"stop": ["a", "b", "c", "d", "e"]}, "stop", id="five-stops"),
    pytest.param({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", id="17-metadata-pairs"),
    pytest.param({"model": "m" * 10_000}, "model", id="huge-model"),
    pytest.param({"tools": [CHAT_TOOL] * (MAX_TOOLS + 1)}, "tools", id="too-many-tools"),
])
async def test_chat_string_and_list_sizes_are_bounded(srv: RtServer, fields: dict[str, Any], param: str) -> None:
    before = srv.orch.statistics().requests_total
    status, body = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, **fields})
    assert status == 400 and body["error"]["param"] == param, body
    assert srv.orch.statistics().requests_total == before


@pytest.mark.parametrize(("fields", "param"), [
    pytest.param({"tools": [CHAT_TOOL]}, "tools", id="tools"),
    pytest.param({"tools": [CHAT_TOOL], "tool_choice": "required"}, "tools", id="tools-required"),
])
async def test_chat_tools_are_refused_by_name_not_ignored(srv: RtServer, fields: dict[str, Any], param: str) -> None:
    """No synthetic stage calls tools: accepting them and never calling one would be a silent lie."""
    status, body = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, **fields})
    assert (status, body["error"]["param"], body["error"]["code"]) == (400, param, "unsupported_parameter"), body
    assert "call tools" in body["error"]["message"]
    status, body = await post(srv, CHAT, {"model": "synthetic", "messages": MSG, "tool_choice": "none",
                                          "max_tokens": 2})
    assert status == 200, body


@pytest.mark.parametrize(("session", "param"), [
    pytest.param({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "session.instructions", id="instructions"),
    pytest.param({"tools": [TOOL] * (MAX_TOOLS + 1)}, "session.tools", id="tools"),
    pytest.param({"voice": "v" * (MAX_NAME_CHARS + 1)}, "session.voice", id="voice"),
])
async def test_realtime_session_sizes_are_bounded(srv: RtServer, session: dict[str, Any], param: str) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        eid = await c.send("session.update", session=session)
        err = (await c.until("error"))[-1]["error"]
        assert (err["type"], err["param"], err["event_id"]) == ("invalid_request_error", param, eid), err
        # at the limit is fine, and the session lives on
        await c.send("session.update", session={"instructions": "x" * MAX_INSTRUCTIONS_CHARS})
        assert (await c.until("session.updated"))[-1]["session"]["instructions"] == "x" * MAX_INSTRUCTIONS_CHARS
        await c.ws.close()


async def test_a_response_the_stage_refuses_is_the_clients_error(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
        await c.send("response.create", response={"modalities": ["text"], "max_response_output_tokens": 2**31 - 1})
        done = (await c.until("response.done"))[-1]["response"]
        assert done["status"] == "failed", done
        assert done["status_details"]["error"]["type"] == "invalid_request_error", done
        assert done["status_details"]["error"]["code"] == "rejected_by_stage", done  # the code REST answers with
        # the session still answers an ordinary response
        await c.send("response.create", response={"modalities": ["text"], "max_response_output_tokens": 2})
        assert (await c.until("response.done"))[-1]["response"]["status"] in ("completed", "incomplete")
        await c.ws.close()


async def test_realtime_audio_item_over_the_input_limit_is_refused_before_decoding(
        srv: RtServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_mod, "_settings", dataclasses.replace(settings_mod.settings(), max_input_audio_s=0.5))
    one_second = base64.b64encode(bytes(2 * WIRE_RATE)).decode()
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        eid = await c.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": one_second}]})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("item.content[0].audio", eid), err
        assert "max_input_audio_s" in err["message"]
        await c.ws.close()
