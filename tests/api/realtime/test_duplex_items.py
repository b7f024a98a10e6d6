"""A duplex response's items are conversation items: retrieved, truncated (live and after cancel), bounded.

Tiny Moshi behind a real server; real WebSocket clients (aiohttp and the openai SDK).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from omni_actors.api.realtime.audio import WIRE_RATE
from omni_actors.api.realtime.conversation import Part, truncate
from omni_actors.api.realtime.duplex_items import ITEMS_KEPT, TIMED_PIECES, TRANSCRIPT_CHARS, hear
from tests.api.realtime.conftest import Client, RtServer, b64, of_type, pcm, serve_rt
from tests.api.realtime.test_duplex import AUDIO_EVENTS, TEXT_EVENTS, connect, frames, voice

FRAME_MS = 80


@pytest.fixture(scope="module")
async def srv(tiny_moshi: Path) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": 2, "engine_extras": {"frame_budget": 0}}]
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages) as server:
        yield server


def audio_ms(events: list[dict[str, Any]], item_id: str) -> int:
    """Milliseconds of the item's audio in these events' deltas (the server counts per delta alike)."""
    return sum(len(pcm(e["delta"])) * 1000 // WIRE_RATE for e in events
               if e["type"] in AUDIO_EVENTS and e["item_id"] == item_id)


def transcript(events: list[dict[str, Any]], item_id: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] in TEXT_EVENTS and e["item_id"] == item_id)


async def answer(client: Client, type: str, **fields: Any) -> dict[str, Any]:
    """Send a client event; the server's answer to it (the first event of `done` types or an error)."""
    eid = await client.send(type, **fields)
    done = {"conversation.item.retrieve": "conversation.item.retrieved",
            "conversation.item.truncate": "conversation.item.truncated",
            "conversation.item.delete": "conversation.item.deleted"}[type]
    while True:
        event = await client.recv()
        if event["type"] == done or (event["type"] == "error" and event["error"]["event_id"] == eid):
            return event


async def cancel(client: Client) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """response.cancel: the events up to response.done, and its response."""
    await client.send("response.cancel")
    seen = await client.until("response.done")
    return seen, seen[-1]["response"]


async def test_a_live_item_is_retrieved_truncated_and_kept_after_cancel(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=b64(voice(11, 0.5)))
        _, _, seen = await frames(client, 1)
        item_id = next(e for e in seen if e["type"] in AUDIO_EVENTS)["item_id"]
        added = of_type(seen, "response.output_item.added")[0]
        assert added["item"]["id"] == item_id
        created = of_type(seen, "conversation.item.created")
        assert [e["item"]["id"] for e in created] == [item_id]  # announced into the conversation, as on other pipelines

        got = await answer(client, "conversation.item.retrieve", item_id=item_id)  # while the response is live
        assert got["type"] == "conversation.item.retrieved", got
        item = got["item"]
        assert (item["id"], item["role"], item["status"]) == (item_id, "assistant", "in_progress")
        assert item["content"][0]["type"] == "audio"
        live_transcript = item["content"][0]["transcript"]

        # Barge-in on a live item: the audio generated so far is dropped from it (audio_end_ms 0), the
        # model goes on and later frames are the item's audio from there.
        cut = await answer(client, "conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=0)
        assert cut["type"] == "conversation.item.truncated", cut
        assert (cut["item_id"], cut["content_index"], cut["audio_end_ms"]) == (item_id, 0, 0)
        mark = len(client.seen)
        await frames(client, 3)
        before_done, response = await cancel(client)
        after = client.seen[mark:]
        kept_ms = audio_ms(after, item_id)
        assert kept_ms >= 3 * FRAME_MS and audio_ms(client.seen, item_id) > kept_ms
        assert response["status"] == "cancelled" and [o["id"] for o in response["output"]] == [item_id]
        done_item = response["output"][0]
        assert done_item["status"] == "incomplete"
        assert transcript(client.seen, item_id).startswith(live_transcript)  # what it held was what was sent
        assert transcript(after, item_id).endswith(done_item["content"][0]["transcript"])

        got = await answer(client, "conversation.item.retrieve", item_id=item_id)  # after the cancel
        assert got["type"] == "conversation.item.retrieved", got
        assert got["item"] == done_item
        over = await answer(client, "conversation.item.truncate", item_id=item_id, content_index=0,
                            audio_end_ms=kept_ms + FRAME_MS)
        assert over["type"] == "error" and over["error"]["param"] == "audio_end_ms", over  # the live cut held
        assert str(kept_ms) in over["error"]["message"]
        cut = await answer(client, "conversation.item.truncate", item_id=item_id, content_index=0,
                           audio_end_ms=kept_ms // 2)
        assert cut["type"] == "conversation.item.truncated", cut
        got = await answer(client, "conversation.item.retrieve", item_id=item_id)
        assert done_item["content"][0]["transcript"].strip().startswith(got["item"]["content"][0]["transcript"])
        assert not of_type(before_done, "error")
        await client.ws.close()


async def test_openai_sdk_ga_client_retrieves_and_truncates_the_item_it_hears(srv: RtServer) -> None:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    client = AsyncOpenAI(api_key=srv.key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)
    async with client.realtime.connect(model="moshi") as conn:
        await conn.session.update(session={"type": "realtime"})
        await conn.input_audio_buffer.append(audio=b64(voice(12, 0.5)))
        item_id, heard, answers = None, 0, []
        async for event in conn:
            if event.type == "response.output_audio.delta":
                if item_id is None:
                    item_id = event.item_id
                    await conn.conversation.item.retrieve(item_id=item_id)
                heard += len(pcm(event.delta)) * 1000 // WIRE_RATE
            elif event.type in ("conversation.item.retrieved", "error"):
                answers.append(event)
                await conn.response.cancel()
            elif event.type == "response.done":
                break
        assert item_id is not None and [a.type for a in answers] == ["conversation.item.retrieved"], answers
        assert answers[0].item.id == item_id
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=heard // 2)
        truncated = await anext(e async for e in conn if e.type in ("conversation.item.truncated", "error"))
        assert truncated.type == "conversation.item.truncated", truncated
        assert (truncated.item_id, truncated.audio_end_ms) == (item_id, heard // 2)


async def test_only_the_last_items_are_kept(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        ids = []
        for i in range(ITEMS_KEPT + 1):  # each response: the user speaks, the model answers, the client cancels
            await client.send("input_audio_buffer.append", audio=b64(voice(100 + i, 0.1)))
            _, _, seen = await frames(client, 1)
            ids.append(next(e for e in seen if e["type"] in AUDIO_EVENTS)["item_id"])
            await cancel(client)
        assert len(set(ids)) == ITEMS_KEPT + 1
        deleted = [e["item_id"] for e in of_type(client.seen, "conversation.item.deleted")]
        assert deleted == ids[:1]
        gone = await answer(client, "conversation.item.retrieve", item_id=ids[0])
        assert gone["type"] == "error" and gone["error"]["code"] == "item_not_found"
        for item_id in (ids[1], ids[-1]):
            got = await answer(client, "conversation.item.retrieve", item_id=item_id)
            assert got["type"] == "conversation.item.retrieved" and got["item"]["id"] == item_id
        (session,) = [s for s in srv.sessions if s.conversation.get(ids[-1]) is not None]
        assert [i.id for i in session.conversation.items] == ids[1:]
        await client.ws.close()


def test_a_long_live_item_keeps_a_bounded_transcript_and_truncates_near_its_end() -> None:
    part = Part("audio", transcript="")
    for n in range(20 * TRANSCRIPT_CHARS):  # hours of frames, each with a word
        hear(part, FRAME_MS, f" w{n}")
    assert part.audio_ms == 20 * TRANSCRIPT_CHARS * FRAME_MS
    assert len(part.transcript or "") <= TRANSCRIPT_CHARS and len(part.segments) <= TIMED_PIECES
    assert part.transcript == "".join(piece for _, piece in part.segments)
    last = 20 * TRANSCRIPT_CHARS - 1
    assert part.transcript.endswith(f" w{last - 1} w{last}")
    truncate(part, part.audio_ms - 2 * FRAME_MS + 1)  # heard up to 1 ms into the last frame but one
    assert part.transcript.endswith(f" w{last - 1}")


async def test_deleting_the_live_item_ends_its_response_first(srv: RtServer) -> None:
    # the model went on streaming audio and transcript deltas into a deleted item, then its done events
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=b64(voice(11, 0.5)))
        _, _, seen = await frames(client, 1)
        item_id = next(e for e in seen if e["type"] in AUDIO_EVENTS)["item_id"]
        deleted = await answer(client, "conversation.item.delete", item_id=item_id)
        assert deleted["type"] == "conversation.item.deleted", deleted
        at = client.seen.index(deleted)
        before = client.seen[:at]
        done = of_type(before, "response.done")
        assert done and done[-1]["response"]["status"] == "cancelled", [e["type"] for e in before[-8:]]
        await client.send("input_audio_buffer.append", audio=b64(voice(11, 0.5)))  # the model keeps listening
        await frames(client, 2)
        after = client.seen[at + 1:]
        assert not [e for e in after if e.get("item_id") == item_id or e.get("item", {}).get("id") == item_id]
        got = await answer(client, "conversation.item.retrieve", item_id=item_id)
        assert got["type"] == "error" and got["error"]["code"] == "item_not_found", got
        await client.ws.close()
