"""Realtime robustness: bad events get `error` and the session lives; vanished clients leave nothing."""

from __future__ import annotations

import asyncio
import base64
import os
import signal

import aiohttp
import numpy as np

from omni_actors.api.realtime.audio import WIRE_RATE
from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import STAGES, b64, connect, of_type, serve_rt, silence
from tests.api.realtime.conftest import RtServer as Server
from tests.conftest import shm_files

MIB = 1024 * 1024


async def test_bad_events_get_errors_and_the_session_lives(srv: Server) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        cases = [  # (event, expected code, expected param)
            ({"type": "no.such.event"}, "invalid_event", "type"),
            ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_value", "audio"),
            ({"type": "input_audio_buffer.append", "audio": 12}, "invalid_type", "audio"),
            ({"type": "conversation.item.truncate", "item_id": "x"}, "missing_required_parameter", "audio_end_ms"),
            ({"type": "session.update", "session": {"turn_detection": {"threshold": "high"}}},
             "invalid_type", "session.turn_detection.threshold"),
            ({"type": "session.update", "session": {"input_audio_format": "mp3"}},
             "invalid_value", "session.input_audio_format"),
            ({"type": "conversation.item.retrieve", "item_id": "item_missing"}, "item_not_found", "item_id"),
            ({"type": "conversation.item.create", "item": {"type": "message", "role": "user"},
              "previous_item_id": "nope"}, "item_not_found", "previous_item_id"),
            ({"type": "response.cancel"}, "response_cancel_not_active", None),
        ]
        for i, (event, code, param) in enumerate(cases):
            await c.ws.send_json({**event, "event_id": f"bad{i}"})
            err = (await c.until("error"))[-1]["error"]
            assert (err["code"], err["param"], err["event_id"]) == (code, param, f"bad{i}"), (event, err)
        await c.ws.send_str("{not json")
        assert (await c.until("error"))[-1]["error"]["code"] == "invalid_json"
        # too large: an error naming the event, not a closed socket
        await c.ws.send_json({"type": "input_audio_buffer.append", "event_id": "huge", "audio": "A" * (16 * MIB)})
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["event_id"]) == ("event_too_large", "huge")
        # the largest allowed append (15 MiB) is accepted
        samples = (15 * MIB - 200) // 4 * 3 // 2
        big = base64.b64encode(np.zeros(samples, "<i2").tobytes()).decode()
        await c.send("input_audio_buffer.append", audio=big)
        await c.send("input_audio_buffer.clear")
        events = await c.until("input_audio_buffer.cleared", timeout_s=30)
        assert not of_type(events, "error")
        # and the session still answers
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "still here"}]})
        await c.send("response.create")
        assert (await c.until("response.done"))[-1]["response"]["status"] == "completed"
        await c.ws.close()


async def test_a_conversations_text_is_bounded_by_the_rest_body_limit(srv: Server) -> None:
    """Text items cannot grow one session's memory without end: past server.max_body_mb of text (what one
    REST request may carry) an item is refused; deleting items makes room."""
    third = int(srv.orch.deploy.server.max_body_mb * 1024 * 1024) // 3 + 1  # three of them pass the limit
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)

        async def add(i: int) -> dict:
            await c.send("conversation.item.create", event_id=f"big{i}", item={
                "id": f"item_big{i}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "x" * third}]})
            return await c.recv(30)

        assert [(await add(i))["type"] for i in range(2)] == ["conversation.item.created"] * 2
        err = (await add(2))["error"]
        assert (err["code"], err["param"], err["event_id"]) == ("text_limit_exceeded", "item", "big2"), err
        await c.send("conversation.item.delete", item_id="item_big0")
        await c.until("conversation.item.deleted")
        assert (await add(2))["type"] == "conversation.item.created"
        await c.ws.close()


async def test_vanished_client_mid_response_leaves_nothing(srv: Server) -> None:
    shm_before = shm_files(srv.orch.run_prefix)
    tasks_before = len(asyncio.all_tasks())
    cancelled = srv.stats().responses.get("cancelled", 0)
    http = aiohttp.ClientSession()
    c = await connect(srv, http, turn_detection=None)
    await c.send("conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "long one"}]})
    await c.send("response.create", response={"max_output_tokens": 200})
    await c.until("response.audio.delta")
    assert srv.orch.statistics().requests_in_flight == 1
    await http.close()  # drop the TCP connection: no close frame, the client just vanishes
    await eventually(lambda: idle(srv.orch) and not srv.orch.runs)
    stats = srv.orch.statistics()
    assert stats.requests_aborted >= 1 and stats.leases_held == 0
    await eventually(lambda: not srv.sessions)
    await eventually(lambda: srv.stats().responses.get("cancelled", 0) == cancelled + 1)  # the one cut short
    await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before)
    assert shm_files(srv.orch.run_prefix) == shm_before


async def test_cancel_by_client(srv: Server) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.append(silence(0.2))
        await c.send("input_audio_buffer.commit")
        await c.send("response.create", response={"max_output_tokens": 100})
        created = (await c.until("response.created"))[-1]["response"]
        await c.until("response.audio.delta")
        await c.send("response.cancel", response_id=created["id"])
        done = (await c.until("response.done"))[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert done["output"][0]["status"] == "incomplete"
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_worker_death_fails_the_response_not_the_session(srv: Server) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x y"}]})
        await c.send("response.create", response={"max_output_tokens": 200})
        await c.until("response.audio.delta")
        talker = srv.orch.workers[1][0]
        os.kill(talker.pid, signal.SIGKILL)
        done = (await c.until("response.done"))[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "worker_died"
        await srv.orch.wait_healthy(30)  # the orchestrator restarts it; the same session goes on
        await c.send("response.create")
        assert (await c.until("response.done"))[-1]["response"]["status"] == "completed"
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_audio_held_per_session_is_capped() -> None:
    async with serve_rt("synthetic", stages=STAGES, server={"realtime_max_audio_s": 2.0}) as srv, \
            aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.append(silence(1.5), chunk_s=0.5)
        await c.send("input_audio_buffer.append", audio=b64(silence(1.0)), event_id="over")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["param"], err["event_id"]) == ("audio_limit_exceeded", "audio", "over")
        assert "realtime_max_audio_s" in err["message"]
        await c.send("input_audio_buffer.commit")  # the refused second left no trace: 1.5 s committed
        item_id = (await c.until("input_audio_buffer.committed"))[-1]["item_id"]
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        held = len(base64.b64decode(item["content"][0]["audio"])) / 2 / WIRE_RATE
        assert abs(held - 1.5) < 0.01
        # conversation audio counts too; deleting the item makes room again
        big = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": b64(silence(1.0))}]}
        await c.send("conversation.item.create", item=big, event_id="item-over")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["event_id"]) == ("audio_limit_exceeded", "item-over")
        await c.send("conversation.item.delete", item_id=item_id)
        await c.until("conversation.item.deleted")
        await c.send("conversation.item.create", item=big)
        events = await c.until("conversation.item.created")
        assert not of_type(events, "error")
        await c.ws.close()
