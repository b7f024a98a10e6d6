"""Stored chat completions (`store: true`) in the data directory's SQLite store (store.py).

    chat_completions(id "chatcmpl-...", created, model, metadata, body, messages)
    chat_completion_cursors(id, seq, created)   where deleted completions stood, so `after` may name one
    chat_completion_metadata(key, value, seq)   each completion's metadata pairs (seq: its rowid), so a list
                                                filtered by metadata reads the matches, not every row

`body` is the completion as answered, with its `metadata` (JSON; an audio answer's `data` is empty:
no audio is kept, its transcript is); `messages` the request's messages as the messages list gives
them (a JSON array). A list is in the order the completions were stored (their rowid). Completions
are kept RETENTION_S (30 days, as OpenAI keeps them): each insert also drops older rows, so the
table is bounded without a sweeper.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from omni_actors.store import Store, get_store

FEATURE = "chat_completions"
DDL = (
    "CREATE TABLE IF NOT EXISTS chat_completions (id TEXT PRIMARY KEY, created INTEGER NOT NULL, "
    "model TEXT NOT NULL, metadata TEXT NOT NULL, body TEXT NOT NULL, messages TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS chat_completions_created ON chat_completions (created)",
    # Where deleted completions stood in the list (their rowid): a client paging with `after` = one it just
    # deleted (the SDK's auto-paging while deleting each) goes on from there rather than a 400.
    "CREATE TABLE IF NOT EXISTS chat_completion_cursors (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, "
    "created INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chat_completion_metadata (key TEXT NOT NULL, value TEXT NOT NULL, "
    "seq INTEGER NOT NULL, PRIMARY KEY (key, value, seq)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS chat_completion_metadata_seq ON chat_completion_metadata (seq)",
    # Completions stored before this table (or by a server without it): their pairs, once (the newest
    # indexed completion's rowid bounds the scan, so a later start reads only rows past it).
    "INSERT OR IGNORE INTO chat_completion_metadata (key, value, seq) SELECT m.key, m.value, c.rowid "
    "FROM chat_completions AS c, json_each(c.metadata) AS m "
    "WHERE c.rowid > COALESCE((SELECT MAX(seq) FROM chat_completion_metadata), 0)",
)
RETENTION_S = 30 * 24 * 3600


class ChatStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)

    def add(self, cid: str, created: int, model: str, metadata: Mapping[str, str], body: dict[str, Any],
            messages: list[dict[str, Any]]) -> None:
        """Store a finished completion (`body` without its metadata: added here) and its request messages."""
        cut = int(time.time()) - RETENTION_S
        self.store.transaction([
            # rowid past every deleted completion's too, so a cursor left by one never hides a newer one
            ("INSERT INTO chat_completions (rowid, id, created, model, metadata, body, messages) VALUES (1 + MAX("
             "COALESCE((SELECT MAX(rowid) FROM chat_completions), 0), "
             "COALESCE((SELECT MAX(seq) FROM chat_completion_cursors), 0)), ?, ?, ?, ?, ?, ?)",
             (cid, created, model, json.dumps(dict(metadata)), json.dumps({**body, "metadata": dict(metadata)}),
              json.dumps(messages))),
            ("INSERT INTO chat_completion_metadata (key, value, seq) SELECT key, value, last_insert_rowid() "
             "FROM json_each(?)", (json.dumps(dict(metadata)),)),
            ("DELETE FROM chat_completion_metadata WHERE seq IN (SELECT rowid FROM chat_completions "
             "WHERE created < ?)", (cut,)),
            ("DELETE FROM chat_completions WHERE created < ?", (cut,)),
            ("DELETE FROM chat_completion_cursors WHERE created < ?", (cut,)),
        ])

    def body(self, cid: str) -> bytes | None:
        row = self.store.query_one("SELECT body FROM chat_completions WHERE id = ?", (cid,))
        return row[0].encode() if row else None

    def messages(self, cid: str) -> list[dict[str, Any]] | None:
        row = self.store.query_one("SELECT messages FROM chat_completions WHERE id = ?", (cid,))
        return json.loads(row[0]) if row else None

    def set_metadata(self, cid: str, metadata: Mapping[str, str]) -> bytes | None:
        """Replace a stored completion's metadata; its new body (None if it is not stored)."""
        text = json.dumps(dict(metadata))
        row = self.store.query_one("SELECT rowid FROM chat_completions WHERE id = ?", (cid,))
        if row is None:
            return None
        self.store.transaction([
            ("UPDATE chat_completions SET metadata = ?, body = json_set(body, '$.metadata', json(?)) "
             "WHERE rowid = ?", (text, text, row[0])),
            ("DELETE FROM chat_completion_metadata WHERE seq = ?", (row[0],)),
            ("INSERT INTO chat_completion_metadata (key, value, seq) SELECT key, value, ? FROM json_each(?) "
             "WHERE EXISTS (SELECT 1 FROM chat_completions WHERE rowid = ?)", (row[0], text, row[0])),
        ])
        return self.body(cid)

    def delete(self, cid: str) -> bool:
        row = self.store.query_one("SELECT rowid, created FROM chat_completions WHERE id = ?", (cid,))
        if row is None:
            return False
        self.store.transaction([
            ("DELETE FROM chat_completions WHERE id = ?", (cid,)),
            ("DELETE FROM chat_completion_metadata WHERE seq = ?", (row[0],)),
            ("INSERT OR IGNORE INTO chat_completion_cursors (id, seq, created) VALUES (?, ?, ?)",
             (cid, row[0], row[1])),
        ])
        return True

    def page(self, after: str | None, limit: int, newest_first: bool, model: str | None = None,
             metadata: Mapping[str, str] | None = None) -> tuple[list[bytes], bool]:
        """Stored completions (bodies) after `after` (a live or a deleted one), of `model` and with every
        `metadata` pair if given; (page, has_more). KeyError if `after` names no completion that ever was."""
        where, params = [], []
        if after is not None:
            where.append("rowid < ?" if newest_first else "rowid > ?")
            params.append(self.store.cursor("chat_completions", "chat_completion_cursors", after))
        if model is not None:
            where.append("model = ?")
            params.append(model)
        for key, value in (metadata or {}).items():  # (the index's matches, not a read of every row's JSON)
            where.append("rowid IN (SELECT seq FROM chat_completion_metadata WHERE key = ? AND value = ?)")
            params += [key, value]
        rows = self.store.query(
            f"SELECT body FROM chat_completions {'WHERE ' + ' AND '.join(where) if where else ''} "
            f"ORDER BY rowid {'DESC' if newest_first else 'ASC'} LIMIT ?", (*params, limit + 1))
        return [r[0].encode() for r in rows[:limit]], len(rows) > limit
