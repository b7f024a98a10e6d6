"""A conversation item's life over /v1/realtime: deleted while a response streams into it, and the sizes of the
ids and names a client gives its items (each refused with an `error` naming the field, the session kept)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from omni_actors.api.realtime.client_events import MAX_ID_CHARS
from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import (
    Client,
    RtServer,
    assistant_deploy,
    b64,
    connect,
    of_type,
    padded,
    serve_rt,
    speak,
)

TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tell me a story"}]}
DELTAS = ("response.audio.delta", "response.output_audio.delta", "response.text.delta", "response.output_text.delta",
          "response.audio_transcript.delta", "response.output_audio_transcript.delta")


def _names(event: dict[str, Any], item_id: str) -> bool:
    """Whether `event` is about item `item_id` (its `item_id`, or the item it carries)."""
    item = event.get("item")
    return event.get("item_id") == item_id or (isinstance(item, dict) and item.get("id") == item_id)


async def _until_both(c: Client, first: str, second: str) -> list[dict[str, Any]]:
    """Events until both `first` and `second` have come, in whichever order."""
    events: list[dict[str, Any]] = []
    while not (of_type(events, first) and of_type(events, second)):
        events.append(await c.recv())
    return events


@pytest.mark.parametrize("dialect", ["beta", "ga"])
async def test_deleting_the_item_a_response_streams_into_stops_the_response(srv: RtServer, dialect: str) -> None:
    async with aiohttp.ClientSession() as http:
        session: dict[str, Any] = {"type": "realtime"} if dialect == "ga" else {}
        c = await connect(srv, http, turn_detection=None, **session)
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.added" if dialect == "ga" else "conversation.item.created")
        await c.send("response.create")
        streaming = await c.until("response.output_item.added")
        item_id = streaming[-1]["item"]["id"]
        while (await c.recv())["type"] not in DELTAS:  # the answer is streaming into it
            pass
        await c.send("conversation.item.delete", item_id=item_id)
        events = await _until_both(c, "conversation.item.deleted", "response.done")
        deleted = next(i for i, e in enumerate(events) if e["type"] == "conversation.item.deleted")
        assert events[deleted]["item_id"] == item_id
        after = [e["type"] for e in events[deleted + 1:] if _names(e, item_id)]
        assert after == [], after  # no delta, no (GA) conversation.item.done after the delete
        done = of_type(events, "response.done")[0]["response"]
        assert done["status"] == "cancelled", done
        assert done["status_details"]["reason"] == "client_cancelled"
        assert not of_type(events, "error")
        # the session goes on: the item is gone, the next response answers without it
        await c.send("conversation.item.retrieve", item_id=item_id, event_id="gone")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["event_id"]) == ("item_not_found", "gone"), err
        await c.send("response.create")
        assert (await c.until("response.done"))[-1]["response"]["status"] == "completed"
        await c.ws.close()


LONG_ID = "i" * (MAX_ID_CHARS + 1)


@pytest.mark.parametrize(("event", "param"), [
    pytest.param({"type": "conversation.item.create", "item": {**TEXT_ITEM, "id": LONG_ID}}, "item.id", id="id"),
    pytest.param({"type": "conversation.item.create", "item": TEXT_ITEM, "previous_item_id": LONG_ID},
                 "previous_item_id", id="previous_item_id"),
    pytest.param({"type": "conversation.item.create", "item": {"type": "function_call", "call_id": LONG_ID,
                                                               "name": "f", "arguments": "{}"}},
                 "item.call_id", id="call_id"),
    pytest.param({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": LONG_ID,
                                                               "output": "{}"}},
                 "item.call_id", id="output-call_id"),
    pytest.param({"type": "conversation.item.create", "item": {"type": "function_call", "call_id": "c",
                                                               "name": "f" * 65, "arguments": "{}"}},
                 "item.name", id="name"),
    pytest.param({"type": "conversation.item.retrieve", "item_id": LONG_ID}, "item_id", id="retrieve"),
    pytest.param({"type": "conversation.item.delete", "item_id": LONG_ID}, "item_id", id="delete"),
    pytest.param({"type": "conversation.item.truncate", "item_id": LONG_ID, "audio_end_ms": 0}, "item_id",
                 id="truncate"),
    pytest.param({"type": "response.create", "response": {"input": [{"type": "item_reference", "id": LONG_ID}]}},
                 "response.input[0].id", id="item_reference"),
])
async def test_item_ids_and_names_are_bounded(srv: RtServer, event: dict[str, Any], param: str) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.ws.send_json({**event, "event_id": "long"})
        err = (await c.until("error"))[-1]["error"]
        assert (err["type"], err["code"], err["param"], err["event_id"]) == (
            "invalid_request_error", "string_above_max_length", param, "long"), err
        # at the limit is fine, and the session lives on
        at_limit = "i" * MAX_ID_CHARS
        await c.send("conversation.item.create", item={**TEXT_ITEM, "id": at_limit})
        assert (await c.until("conversation.item.created"))[-1]["item"]["id"] == at_limit
        await c.send("conversation.item.delete", item_id=at_limit)
        assert (await c.until("conversation.item.deleted"))[-1]["item_id"] == at_limit
        assert len(of_type(c.seen, "error")) == 1
        await c.ws.close()


async def test_a_function_call_name_is_a_function_name(srv: RtServer) -> None:
    """The rule function tools' names follow (schemas.FunctionName): at most 64 of letters, digits, `_`, `-`."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        item = {"type": "function_call", "call_id": "call_1", "arguments": "{}"}
        await c.send("conversation.item.create", item={**item, "name": "no spaces"}, event_id="bad")
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("item.name", "bad"), err
        await c.send("conversation.item.create", item={**item, "name": "get_weather-" + "x" * 52})
        assert (await c.until("conversation.item.created"))[-1]["item"]["name"] == "get_weather-" + "x" * 52
        await c.ws.close()


@pytest.mark.slow
async def test_an_out_of_band_response_does_not_transcribe_the_users_audio_again(tmp_path: Path) -> None:
    """The conversation's response transcribes the user's untranscribed audio item; an out-of-band response
    without `input`, beside it, reads the same conversation: it hears that audio, but it is the item's
    transcript once (one `.completed`, the item's transcript unchanged), not twice."""
    deploy = assistant_deploy()
    question = padded(speak("What is the capital of France?", tmp_path), 0.3, 0.5)
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": b64(question)}]}
    async with serve_rt(deploy=deploy) as srv, aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, input_audio_transcription={"model": "whisper-1"})
        await c.send("conversation.item.create", item=item)
        item_id = (await c.until("conversation.item.created"))[-1]["item"]["id"]
        await c.send("response.create", response={"modalities": ["text"], "max_output_tokens": 8})
        await c.until("response.created")
        await c.send("response.create", response={"conversation": "none", "modalities": ["text"],
                                                  "max_output_tokens": 8})
        events = [*(await c.until("response.created")), *(await c.until("response.done", timeout_s=120))]
        if len(of_type(events, "response.done")) < 2:
            events += await c.until("response.done", timeout_s=120)
        completed = [e for e in of_type(events, "conversation.item.input_audio_transcription.completed")
                     if e["item_id"] == item_id]
        assert len(completed) == 1, completed
        deltas = [e["delta"] for e in of_type(events, "conversation.item.input_audio_transcription.delta")
                  if e["item_id"] == item_id]
        assert "".join(deltas) == completed[0]["transcript"]
        await c.send("conversation.item.retrieve", item_id=item_id)
        got = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert got["content"][0]["transcript"] == completed[0]["transcript"]
        await c.ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=30)
