"""Conversations (`/v1/conversations`) in the data directory's SQLite store (store.py), beside the stored responses.

    conversations(id "conv_...", created_at, metadata)
    conversation_items(seq, conversation_id, id, item)     seq: the items' order (across conversations)

`metadata` is a JSON object of strings; `item` an item as the conversation's item routes answer it
(JSON text: a message, a function call or its output, each with its `id`), NULL once the item is
deleted: its row stays so that a page's `after` may still name it, and its content is gone. Deleting
a conversation deletes its items (a foreign key, ON DELETE CASCADE). Conversations are kept until
deleted, as OpenAI keeps them; a client may come back for one after a restart.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from omni_actors.store import Store, get_store

FEATURE = "conversations"
DDL = (
    "CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, "
    "metadata TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS conversation_items (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE, id TEXT NOT NULL, item TEXT)",
    "CREATE INDEX IF NOT EXISTS conversation_items_by_id ON conversation_items (conversation_id, id)",
    # (a conversation's items in order, read from either end without sorting the whole conversation)
    "CREATE INDEX IF NOT EXISTS conversation_items_in_order ON conversation_items (conversation_id, seq)",
)
TAIL_CHUNK = 64
"""Items read at a time, from a conversation's end back to its last message (ConversationStore.tail)."""
ID_CHUNK = 500
"""Ids looked up in one query (SQLite's bound parameters are limited)."""


class ConversationStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)

    def create(self, metadata: dict[str, str], items: list[dict[str, Any]]) -> tuple[str, int]:
        """A new conversation with its first items: (its id, its created_at)."""
        cid, now = f"conv_{uuid.uuid4().hex}", int(time.time())
        self.store.transaction([
            ("INSERT INTO conversations (id, created_at, metadata) VALUES (?, ?, ?)", (cid, now, json.dumps(metadata))),
            *self._inserts(cid, _unique_ids(items, set())),
        ])
        return cid, now

    def get(self, cid: str) -> tuple[int, dict[str, str]] | None:
        """(created_at, metadata) of a conversation; None when there is none."""
        row = self.store.query_one("SELECT created_at, metadata FROM conversations WHERE id = ?", (cid,))
        return (row[0], json.loads(row[1])) if row else None

    def set_metadata(self, cid: str, metadata: dict[str, str]) -> bool:
        return self.store.execute("UPDATE conversations SET metadata = ? WHERE id = ?",
                                  (json.dumps(metadata), cid)) > 0

    def delete(self, cid: str) -> bool:
        return self.store.execute("DELETE FROM conversations WHERE id = ?", (cid,)) > 0

    def item_ids(self, cid: str, ids: list[str]) -> set[str]:
        """Which of `ids` the conversation has (the deleted items' too: an id is used once in a conversation)."""
        taken: set[str] = set()
        for start in range(0, len(ids), ID_CHUNK):  # (one indexed lookup per id, not the whole conversation)
            part = ids[start:start + ID_CHUNK]
            rows = self.store.query("SELECT id FROM conversation_items WHERE conversation_id = ? AND id IN "
                                    f"({','.join('?' * len(part))})", (cid, *part))
            taken.update(r[0] for r in rows)
        return taken

    def append(self, cid: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add items at the conversation's end (an id already in it is replaced by a new one); what was
        added, as stored. Nothing is added to a conversation deleted meanwhile."""
        added = _unique_ids(items, self.item_ids(cid, [i["id"] for i in items]))
        self.store.transaction(self._inserts(cid, added))
        return added

    def _inserts(self, cid: str, items: list[dict[str, Any]]) -> list[tuple[str, tuple[Any, ...]]]:
        return [("INSERT INTO conversation_items (conversation_id, id, item) SELECT ?, ?, ? "
                 "WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?)", (cid, i["id"], json.dumps(i), cid))
                for i in items]

    def items(self, cid: str) -> list[dict[str, Any]]:
        """Every item of the conversation, oldest first."""
        rows = self.store.query("SELECT item FROM conversation_items WHERE conversation_id = ? AND item IS NOT NULL "
                                "ORDER BY seq", (cid,))
        return [json.loads(r[0]) for r in rows]

    def tail(self, cid: str) -> list[dict[str, Any]]:
        """The function calls and outputs after the conversation's last message (what a next item pairs with),
        read from the end TAIL_CHUNK at a time: the items before that message are never read."""
        found: list[dict[str, Any]] = []
        before = None
        while True:
            rows = self.store.query("SELECT seq, item FROM conversation_items WHERE conversation_id = ? AND item IS "
                                    "NOT NULL AND (? IS NULL OR seq < ?) ORDER BY seq DESC LIMIT ?",
                                    (cid, before, before, TAIL_CHUNK))
            for row in rows:
                item = json.loads(row[1])
                if item.get("type", "message") == "message":
                    return found[::-1]
                found.append(item)
            if len(rows) < TAIL_CHUNK:
                return found[::-1]
            before = rows[-1][0]

    def page(self, cid: str, after: str | None, limit: int, newest_first: bool) -> tuple[list[dict[str, Any]], bool]:
        """A page of the conversation's items (at most `limit`, after the item `after`) and whether more
        follow. KeyError: `after` was never an item of this conversation."""
        where, args = "conversation_id = ? AND item IS NOT NULL", [cid]
        if after is not None:
            row = self.store.query_one("SELECT seq FROM conversation_items WHERE conversation_id = ? AND id = ?",
                                       (cid, after))
            if row is None:
                raise KeyError(after)
            where += " AND seq < ?" if newest_first else " AND seq > ?"
            args.append(row[0])
        rows = self.store.query(f"SELECT item FROM conversation_items WHERE {where} ORDER BY seq "
                                f"{'DESC' if newest_first else 'ASC'} LIMIT ?", (*args, limit + 1))
        return [json.loads(r[0]) for r in rows[:limit]], len(rows) > limit

    def item(self, cid: str, item_id: str) -> dict[str, Any] | None:
        row = self.store.query_one("SELECT item FROM conversation_items WHERE conversation_id = ? AND id = ? "
                                   "AND item IS NOT NULL", (cid, item_id))
        return json.loads(row[0]) if row else None

    def delete_item(self, cid: str, item_id: str) -> bool:
        """Forget an item's content (its place stays for `after`); False if it is not there."""
        return self.store.execute("UPDATE conversation_items SET item = NULL WHERE conversation_id = ? AND id = ? "
                                  "AND item IS NOT NULL", (cid, item_id)) > 0


def _unique_ids(items: list[dict[str, Any]], taken: set[str]) -> list[dict[str, Any]]:
    """`items` with each id not in `taken` nor used before it in the list (one that is gets a new id)."""
    out = []
    for item in items:
        if item["id"] in taken:
            prefix = item["id"].split("_", 1)[0] if "_" in item["id"] else "item"
            item = {**item, "id": f"{prefix}_{uuid.uuid4().hex[:24]}"}
        taken.add(item["id"])
        out.append(item)
    return out
