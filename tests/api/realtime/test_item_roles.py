"""A message item's content parts must fit its role, as each dialect names them (conversation.py PARTS_BY_ROLE).

OpenAI refuses a part that does not fit the role (an assistant's `input_text`, a user's `output_text`, a
system message's audio) with an `invalid_request_error` naming the part's `type`; the item is not added.
GA names the assistant's parts `output_text` / `output_audio`; beta names them `text` (and renders `audio`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.api.realtime.conftest import RtServer, b64, connect, silence

GA = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
BETA = {"turn_detection": None}


def message(role: str, *parts: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": list(parts), **({"id": id} if id else {})}


def text(kind: str) -> dict[str, Any]:
    return {"type": kind, "text": "hi"}


REFUSED = [  # (session, item, the part refused)
    (BETA, message("assistant", text("input_text")), 0),
    (BETA, message("user", text("input_text"), text("text")), 1),
    (BETA, message("user", text("output_text")), 0),
    (BETA, message("user", {"type": "audio", "transcript": "hi"}), 0),
    (BETA, message("system", {"type": "input_audio", "audio": b64(silence(0.1))}), 0),
    (GA, message("assistant", text("text")), 0),  # (GA names it output_text)
    (GA, message("assistant", {"type": "audio", "transcript": "hi"}), 0),
    (GA, message("user", text("output_text")), 0),
    (GA, message("system", text("output_text")), 0),
    (GA, message("user", {"type": "input_image", "image_url": "data:image/png;base64,AA=="}), 0),  # (not served)
]


@pytest.mark.parametrize(("session", "item", "index"), REFUSED)
async def test_a_part_that_does_not_fit_the_role_is_refused(srv: RtServer, session: dict, item: dict,
                                                            index: int) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, **session)
        await c.send("conversation.item.create", item={**item, "id": "bad"}, event_id="create")
        events = await c.until("error")
        err = events[-1]["error"]
        assert (err["type"], err["code"], err["param"], err["event_id"]) == (
            "invalid_request_error", "invalid_value", f"item.content[{index}].type", "create"), err
        assert f"a {item['role']} message" in err["message"], err
        assert [e["type"] for e in events] == ["error"]  # nothing announced
        await c.send("conversation.item.retrieve", item_id="bad")
        assert (await c.until("error"))[-1]["error"]["code"] == "item_not_found"  # nothing added
        await c.ws.close()


@pytest.mark.parametrize(("session", "assistant"), [(BETA, "text"), (BETA, "output_text"), (GA, "output_text")])
async def test_parts_that_fit_are_taken(srv: RtServer, session: dict, assistant: str) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, **session)
        for i, item in enumerate([message("system", text("input_text")), message("assistant", text(assistant)),
                                  message("user", text("input_text"), {"type": "input_audio",
                                                                       "audio": b64(silence(0.1))})]):
            await c.send("conversation.item.create", item=item)
            created = (await c.until("conversation.item.added" if session is GA else "conversation.item.created"))
            created = created[-1]["item"]
            assert created["role"] == item["role"], (i, created)
        assert not [e for e in c.seen if e["type"] == "error"]
        await c.ws.close()


async def test_response_input_parts_are_checked_where_they_stand(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, **GA)
        await c.send("response.create", event_id="oob", response={"conversation": "none", "input": [
            message("user", text("input_text")), message("assistant", text("input_text"))]})
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("response.input[1].content[0].type", "oob"), err
        assert not [e for e in c.seen if e["type"] == "response.created"]
        await c.ws.close()
