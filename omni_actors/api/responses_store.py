"""Stored responses (`store: true`, the default) in the data directory's SQLite store (store.py).

    responses(id "resp_...", created_at, model, body, conversation, items, status, owner_pid)

`body` is the response object as answered (JSON); `conversation` the chat-shaped messages a
later request continues with `previous_response_id` (this input and the answer, without the
instructions); `items` this request's input items as `input_items` lists them. All JSON text.
A client may come back for any of them after a restart; `DELETE /v1/responses/{id}` removes one.
Responses are kept RETENTION_S (30 days, as OpenAI keeps them): each insert also drops the rows
older than that, so the table is bounded without a sweeper. A background response's row is
written when it is queued and rewritten as it moves on (`status` mirrors the body's); `owner_pid`
is the server running it (store.owner_token: its pid and start time), so one a gone server left
unfinished reads as failed, even once another process has its pid. `events` is a
streamed background response's event stream (a JSON array, `[]` while it runs: the server
running it keeps them in memory, api/responses_events.py), written once it ends, so a client can
read it again after a restart; NULL for a response that was not streamed in the background. A
streamed foreground response's row is written `in_progress` as its stream begins and replaced at its end.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api.responses_schemas import Response
from omni_actors.store import Store, get_store, owner_token

FEATURE = "responses"
DDL = (
    "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, "
    "model TEXT NOT NULL, body TEXT NOT NULL, conversation TEXT NOT NULL, items TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at)",
)
RETENTION_S = 30 * 24 * 3600
ADDED = {"status": "TEXT", "owner_pid": "INTEGER", "events": "TEXT"}
"""Columns added after the table's first release (Store.add_columns); NULL status: completed before."""
UNFINISHED = ("queued", "in_progress")


class ResponseStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)
        self.store.add_columns("responses", ADDED)

    def add(self, response: Response, conversation: list[dict[str, Any]], items: list[dict[str, Any]],
            events: bytes | None = None, replace: bool = False) -> bool:
        """Store a response (again, for a background one moving on: its `events` stay as they are
        unless given). A background response's end (or, with `replace`, a streamed one's, stored as it
        began) only replaces its unfinished row: one deleted (or cancelled) meanwhile, by any server on
        this data directory, stays so (and False says so)."""
        if (response.background or replace) and response.status not in UNFINISHED:
            return self.store.execute(
                "UPDATE responses SET body = ?, conversation = ?, items = ?, status = ? WHERE id = ? "
                "AND status IN (?, ?)", (msgspec.json.encode(response).decode(), json.dumps(conversation),
                                         json.dumps(items), response.status, response.id, *UNFINISHED)) > 0
        self.store.transaction([
            ("INSERT INTO responses (id, created_at, model, body, conversation, items, status, owner_pid, events) "
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body, "
             "conversation = excluded.conversation, items = excluded.items, status = excluded.status, "
             "owner_pid = excluded.owner_pid, events = COALESCE(excluded.events, events)",
             (response.id, response.created_at, response.model, msgspec.json.encode(response).decode(),
              json.dumps(conversation), json.dumps(items), response.status, owner_token(),
              None if events is None else events.decode())),
            ("DELETE FROM responses WHERE created_at < ?", (int(time.time()) - RETENTION_S,)),
        ])
        return True

    def update(self, response: Response) -> bool:
        """A stored response's new body while it is unfinished (False once it is not, or gone)."""
        return self.store.execute(
            "UPDATE responses SET body = ?, status = ? WHERE id = ? AND status IN (?, ?)",
            (msgspec.json.encode(response).decode(), response.status, response.id, *UNFINISHED),
        ) > 0

    def status(self, rid: str) -> tuple[str | None, int | None] | None:
        """(status, owner pid) of a stored response; None when it is not stored."""
        row = self.store.query_one("SELECT status, owner_pid FROM responses WHERE id = ?", (rid,))
        return (row[0], row[1]) if row else None

    def body(self, rid: str) -> bytes | None:
        row = self.store.query_one("SELECT body FROM responses WHERE id = ?", (rid,))
        return row[0].encode() if row else None

    def conversation(self, rid: str) -> list[dict[str, Any]] | None:
        row = self.store.query_one("SELECT conversation FROM responses WHERE id = ?", (rid,))
        return json.loads(row[0]) if row else None

    def items(self, rid: str) -> list[dict[str, Any]] | None:
        row = self.store.query_one("SELECT items FROM responses WHERE id = ?", (rid,))
        return json.loads(row[0]) if row else None

    def set_events(self, rid: str, events: bytes) -> None:
        """A streamed background response's whole event stream (a JSON array), once it has ended."""
        self.store.execute("UPDATE responses SET events = ? WHERE id = ?", (events.decode(), rid))

    def events(self, rid: str) -> bytes | None:
        """The stored event stream (JSON array); None: not a streamed background response (or not stored)."""
        row = self.store.query_one("SELECT events FROM responses WHERE id = ?", (rid,))
        return row[0].encode() if row and row[0] is not None else None

    def delete(self, rid: str) -> bool:
        return self.store.execute("DELETE FROM responses WHERE id = ?", (rid,)) > 0


RESPONSES_KEY = web.AppKey("response_store", ResponseStore)
"""An app's own store (the tests' data directories); without one, the process's (store.py)."""
