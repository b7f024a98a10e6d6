"""Out-of-band responses (`response.conversation: "none"`): beside the conversation's, several at once, bounded.

OpenAI lets a client classify or moderate with out-of-band responses while the conversation's answer
is being made: each event names its own `response_id`, `metadata` is echoed, nothing is added to the
conversation, and `response.cancel` with a `response_id` stops that one only.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from openai import AsyncOpenAI

from omni_actors.api.realtime.handler import MAX_RESPONSES
from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import Client, RtServer, connect, of_type

LONG_TOKENS = 2000
"""At the synthetic thinker's 20 ms a step: 40 s, far longer than any test waits; such a response is
still running when the events sent after it are answered, and is ended by response.cancel."""


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def out_of_band(text: str, tokens: int, **extra: Any) -> dict[str, Any]:
    return {"conversation": "none", "modalities": ["text"], "max_output_tokens": tokens, "input": [user(text)],
            **extra}


def texts(events: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in events:
        if e.type == "response.output_text.delta":
            out[e.response_id] = out.get(e.response_id, "") + e.delta
    return out


async def test_out_of_band_responses_run_beside_the_conversations(srv: RtServer) -> None:
    client = AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=srv.key, max_retries=0)
    async with client.realtime.connect(model="synthetic") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item=user("red green"))  # type: ignore[arg-type]
        await conn.response.create(response={"max_output_tokens": LONG_TOKENS}, event_id="talk")
        await conn.response.create(response=out_of_band("blue", 2, metadata={"topic": "colour"}),  # type: ignore[arg-type]
                                   event_id="classify")
        await conn.response.create(response=out_of_band("one two", 3, metadata={"topic": "count"}),  # type: ignore[arg-type]
                                   event_id="moderate")
        events, created, done = [], [], {}
        async for event in conn:
            assert event.type != "error", event
            events.append(event)
            if event.type == "response.created":
                created.append(event.response)
            elif event.type == "response.done":
                done[event.response.id] = event.response
                if len(done) == 2:
                    break
        talk, first, second = created
        assert talk.conversation_id is not None and talk.id not in done  # the conversation's answer runs on
        assert {first.id, second.id} == set(done) and len({talk.id, first.id, second.id}) == 3
        assert [done[r.id].metadata for r in (first, second)] == [{"topic": "colour"}, {"topic": "count"}]
        assert all(done[r.id].conversation_id is None for r in (first, second))
        assert [done[r.id].status for r in (first, second)] == ["incomplete"] * 2  # (their max_output_tokens)
        said = texts(events)
        assert (said[first.id], said[second.id]) == ("blue blue", "one two one"), said
        assert said[talk.id].startswith("red green"), said  # (each delta names its own response)
        added = [e.item.id for e in events if e.type == "conversation.item.added"]
        oob_items = [o.id for r in (first, second) for o in done[r.id].output or []]
        assert len(oob_items) == 2 and not set(oob_items) & set(added), (oob_items, added)
        await conn.response.cancel(response_id=talk.id)
        async for event in conn:
            if event.type == "response.done":
                break
        assert (event.response.id, event.response.status) == (talk.id, "cancelled")
        await conn.conversation.item.retrieve(item_id=oob_items[0], event_id="gone")
        error = await anext(e async for e in conn if e.type in ("error", "conversation.item.retrieved"))
        assert error.type == "error" and (error.error.code, error.error.event_id) == ("item_not_found", "gone")
    await eventually(lambda: idle(srv.orch))


async def _created(c: Client, n: int) -> list[str]:
    """The ids of the next `n` responses created (no error before them)."""
    ids = []
    while len(ids) < n:
        event = await c.recv()
        assert event["type"] != "error", event
        if event["type"] == "response.created":
            ids.append(event["response"]["id"])
    return ids


async def test_responses_are_capped_and_cancelled_by_id(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        for i in range(MAX_RESPONSES):
            await c.send("response.create", response=out_of_band(f"long {i}", LONG_TOKENS))
        ids = await _created(c, MAX_RESPONSES)
        await c.send("response.create", response=out_of_band("one too many", 2), event_id="over")
        await c.send("response.create", event_id="talk")  # (the conversation's counts against the cap too)
        errors = [(await c.until("error"))[-1]["error"] for _ in range(2)]
        assert [(e["code"], e["event_id"]) for e in errors] == [
            ("response_limit_reached", "over"), ("response_limit_reached", "talk")], errors
        await c.send("response.cancel", event_id="none")  # no id: the conversation's, and it has none
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["event_id"]) == ("response_cancel_not_active", "none"), err
        await c.send("response.cancel", response_id="resp_nope", event_id="nope")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["param"], err["event_id"]) == ("response_cancel_not_active", "response_id", "nope")
        await c.send("response.cancel", response_id=ids[1])
        done = (await c.until("response.done"))[-1]["response"]
        assert (done["id"], done["status"], done["status_details"]["reason"]) == (ids[1], "cancelled",
                                                                                    "client_cancelled")
        for i, metadata in enumerate([{"k": {"nested": 1}}, {f"k{n}": "v" for n in range(17)}]):  # OpenAI's bounds
            await c.send("response.create", response=out_of_band("bad", 2, metadata=metadata), event_id=f"meta{i}")
            err = (await c.until("error"))[-1]["error"]
            assert err["param"].startswith("response.metadata") and err["event_id"] == f"meta{i}", err
        await c.send("response.create", response=out_of_band("room again", 2, metadata={"k": "v"}))
        (fresh,) = await _created(c, 1)
        events = await c.until("response.done")
        assert events[-1]["response"]["id"] == fresh and events[-1]["response"]["metadata"] == {"k": "v"}
        assert not of_type(c.seen, "response.done")[:-1][1:], "only the cancelled and the fresh one ended"
        await c.ws.close()  # the three still running are aborted in every stage
    await eventually(lambda: idle(srv.orch))
    assert not srv.sessions
