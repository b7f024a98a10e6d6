"""A list of stored chat completions filtered by metadata reads the matching rows through their index, not
every row's JSON (chat_store.py; before 2026-12-05 a filter read all rows on the event loop: ~30 ms at
10,000, ~300 ms at 100,000), and completions stored before the index existed are found by it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from omni_actors.api.chat_store import ChatStore
from omni_actors.store import Store

ROWS = 5000
MAX_STEPS = 20_000
"""SQLite VM instructions a filtered page may run: reading every row's metadata would take millions."""


def _body(cid: str) -> dict:
    return {"id": cid, "object": "chat.completion", "created": 0, "model": "m", "choices": []}


def test_a_metadata_filter_reads_the_matches_only(tmp_path: Path) -> None:
    store = Store(tmp_path)
    chats = ChatStore(store)
    for i in range(200):
        chats.add(f"c{i}", int(time.time()), "m", {"bucket": str(i % 100)}, _body(f"c{i}"), [])
    now = int(time.time())
    store.transaction([("INSERT INTO chat_completions (id, created, model, metadata, body, messages) VALUES "
                        "(?, ?, 'm', ?, ?, '[]')", (f"c{i}", now, json.dumps({"bucket": str(i % 100)}),
                                                   json.dumps(_body(f"c{i}")))) for i in range(200, ROWS)])
    store.close()  # (rows written as a server without the index wrote them: the next open indexes them)
    store = Store(tmp_path)
    chats = ChatStore(store)
    steps = [0]

    def count() -> int:
        steps[0] += 100
        return 0

    store._db.set_progress_handler(count, 100)
    none, more = chats.page(None, 20, False, metadata={"bucket": "none"})
    assert (none, more) == ([], False) and steps[0] < MAX_STEPS, steps
    steps[0] = 0
    page, more = chats.page(None, 20, False, metadata={"bucket": "7"})
    assert [json.loads(b)["id"] for b in page] == [f"c{i}" for i in range(7, 2007, 100)] and more
    assert steps[0] < MAX_STEPS, steps
    assert chats.set_metadata("c7", {"bucket": "x"}) is not None and chats.delete("c107")
    page, _ = chats.page(None, 3, False, metadata={"bucket": "7"})
    assert [json.loads(b)["id"] for b in page] == ["c207", "c307", "c407"]
    assert [json.loads(b)["id"] for b in chats.page(None, 5, False, metadata={"bucket": "x"})[0]] == ["c7"]
    store.close()
