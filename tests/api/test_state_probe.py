"""An outside tester's sweep of the stored-state routes (batches, conversations, stored chat completions, text
completions, realtime client secrets): ids of one kind on another's route, NUL and non-ASCII ids, paging edges,
malformed bodies, oversized metadata, and concurrent writers. Each answer is an OpenAI-style 4xx body naming
what is wrong (never a 500 or a hang), and concurrent cancels and updates leave one consistent state.

Raw aiohttp for what the SDK would not send and for concurrent writers; the unmodified openai SDK reads back.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.api.conftest import Server, eventually, idle, make_deploy, serve_deploy
from tests.api.test_batches import BATCH_WAIT_S, chat_line, ended, reached, upload

KEY = "state-probe-key"
STEP_MS = 5
"""The text stage's time a token: a batch of LINES lines runs for seconds, so a cancel finds it running."""
LINES = 40
BIG = "x" * (1 << 20)
"""A 1 MB metadata value (OpenAI's limit is 512 characters)."""
FOREIGN = "conv_0123456789abcdef"
"""A conversation's id, used where a batch, a completion or an item is named."""


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    deploy = make_deploy("synthetic", server={"api_keys": [KEY]}, stages=[
        {"stage_id": 0, "engine_extras": {"step_delay_ms": STEP_MS}}])
    with tempfile.TemporaryDirectory(prefix="omni-state-probe-") as data:
        async with serve_deploy(deploy, KEY, Path(data)) as s:
            yield s
            await eventually(lambda: idle(s.orch), BATCH_WAIT_S)


async def _call(srv: Server, method: str, path: str, body: Any = None, raw: bytes | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
    headers = {**srv.headers, "Content-Type": content_type}
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    async with aiohttp.ClientSession() as http, http.request(method, srv.url + path, data=data,
                                                             headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


CREATE = {"input_file_id": "file-missing", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
REFUSED = [  # (method, path, body, status, param)
    ("GET", f"/v1/batches/{FOREIGN}", None, 404, "batch_id"),
    ("POST", f"/v1/batches/{FOREIGN}/cancel", None, 404, "batch_id"),
    ("GET", "/v1/batches/%00%F0%9F%98%80", None, 404, "batch_id"),
    ("GET", f"/v1/batches?after={FOREIGN}", None, 400, "after"),
    ("GET", "/v1/batches?limit=0", None, 400, "limit"),
    ("GET", "/v1/batches?limit=101", None, 400, "limit"),
    ("POST", "/v1/batches", {**CREATE, "metadata": {"k": BIG}}, 400, "metadata[...]"),
    ("POST", "/v1/batches", {**CREATE, "input_file_id": FOREIGN}, 400, "input_file_id"),
    ("POST", "/v1/batches", {**CREATE, "output_expires_after": {"anchor": "created_at", "seconds": 2 ** 70}}, 400,
     "output_expires_after.seconds"),
    ("GET", "/v1/conversations/batch_0123", None, 404, "conversation_id"),
    ("GET", "/v1/conversations/%00/items", None, 404, "conversation_id"),
    ("POST", "/v1/conversations", {"metadata": {"k": BIG}}, 400, "metadata[...]"),
    ("POST", "/v1/conversations", {"items": [{"role": "user", "content": "x", "id": "x" * 100_000}]}, 400,
     "items[0].id"),
    ("GET", "/v1/chat/completions?after=batch_0123", None, 400, "after"),
    ("GET", "/v1/chat/completions?order=ASC", None, 400, "order"),
    ("GET", f"/v1/chat/completions/{FOREIGN}/messages?limit=101", None, 404, None),
    ("POST", f"/v1/chat/completions/{FOREIGN}", {"metadata": {"k": "v"}}, 404, None),
    ("POST", "/v1/completions", {"model": "synthetic", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"model": "synthetic", "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"model": "synthetic", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400,
     "stop"),
    ("POST", "/v1/completions", {"model": "synthetic", "prompt": [[]]}, 400, "prompt[0]"),
    ("POST", "/v1/realtime/client_secrets", {"session": {"type": "transcription"}}, 400, "session.type"),
    ("POST", "/v1/realtime/client_secrets", {"expires_after": {"seconds": 5}}, 400, "expires_after.seconds"),
]


async def test_mistakes_on_every_stored_state_route_are_openai_style_4xx(srv: Server) -> None:
    for method, path, body, status, param in REFUSED:
        got, answer = await _call(srv, method, path, body)
        assert got == status, (method, path, answer)
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, (path, error)
        assert error["type"] == "invalid_request_error" and "Traceback" not in error["message"], error
    for path in ("/v1/batches", "/v1/conversations", "/v1/realtime/client_secrets", "/v1/completions"):
        for raw in (b"{not json", b"[]", b"\xff\xfe", b'{"metadata": {"k": "\\ud800"}}'):
            got, answer = await _call(srv, "POST", path, raw=raw)
            assert got == 400 and answer["error"]["type"] == "invalid_request_error", (path, raw, answer)


async def test_concurrent_cancels_of_one_batch_agree_and_it_ends_cancelled(srv: Server) -> None:
    client = srv.client()
    fid = await upload(client, [chat_line(f"c{i}", "word " * 40) for i in range(LINES)])
    made = await client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
    answers = await asyncio.gather(*(client.batches.cancel(made.id) for _ in range(4)))
    assert {a.status for a in answers} <= {"cancelling", "cancelled"}, answers
    done = await reached(client, made.id, ended)
    assert done.status == "cancelled" and done.request_counts.completed < LINES, done
    again = await client.batches.cancel(made.id)  # (cancelling an ended-by-cancel batch answers it as it is)
    assert again.status == "cancelled"


async def test_concurrent_writers_of_one_conversation_leave_every_item_and_one_metadata(srv: Server) -> None:
    client = srv.client()
    conv = await client.conversations.create()
    path = f"/v1/conversations/{conv.id}"
    answers = await asyncio.gather(
        *(_call(srv, "POST", path + "/items", {"items": [{"role": "user", "content": f"m{i}"}]}) for i in range(10)),
        *(_call(srv, "POST", path, {"metadata": {"writer": str(i)}}) for i in range(10)))
    assert [status for status, _ in answers] == [200] * 20, answers
    items = [i async for i in client.conversations.items.list(conv.id, limit=3)]
    assert sorted(i.content[0].text for i in items) == sorted(f"m{i}" for i in range(10))
    assert len({i.id for i in items}) == 10
    assert (await client.conversations.retrieve(conv.id)).metadata["writer"] in {str(i) for i in range(10)}
