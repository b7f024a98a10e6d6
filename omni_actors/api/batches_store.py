"""Batches (OpenAI's Batch API) in the data directory's SQLite store (store.py): each batch and its lines.

    batches(id "batch_...", created_at, status, body, completed, failed, owner, output_expiry, output_files)
    batch_lines(batch_id, line, custom_id, body, result, ok)

`body` is the Batch object as answered (JSON text) but for `request_counts`, read from the
`completed` / `failed` columns (each line's end adds to one in the transaction that stores it).
`owner` is the server running the batch (store.owner_token), so a batch a gone server left
unfinished is taken up by the next server on this data directory (batches_runner.py). `output_expiry`
is how long its output and error files are kept (`output_expires_after.seconds`; NULL: always);
`output_files` the ids its output and error files get (JSON `[output, error]`), reserved before they are
written so a batch whose end was cut short writes the same two files again (batches_output.py).

A batch's lines are copied here when it is created (the request `body` as the input file had it,
JSON text), so the batch does not depend on its input file staying; each line's `result` (the
output file's line, JSON text; `ok` 1 for a 2xx answer) is stored as soon as the line ends, so a
restarted server runs only the lines without one. Once the batch ends its results are in its
output and error files and its lines are dropped, in the transaction that makes those files live.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec

from omni_actors.api.batches_schemas import Batch, RequestCounts
from omni_actors.store import Store, owner_token

FEATURE = "batches"
DDL = (
    "CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, status TEXT NOT NULL, "
    "body TEXT NOT NULL, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, owner INTEGER, "
    "output_expiry INTEGER)",
    "CREATE INDEX IF NOT EXISTS batches_status ON batches (status)",
    "CREATE TABLE IF NOT EXISTS batch_lines (batch_id TEXT NOT NULL, line INTEGER NOT NULL, "
    "custom_id TEXT NOT NULL, body TEXT NOT NULL, result TEXT, ok INTEGER, PRIMARY KEY (batch_id, line))",
)
ADDED = {"output_files": "TEXT"}
"""Columns added after the table's first release (Store.add_columns); NULL: no file id reserved yet."""
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
"""States a batch is still moved on from (by the server that owns it)."""
RESULTS_CHUNK = 64
"""Lines read at a time when a batch's results are written out (an image line may hold megabytes)."""


def _now() -> int:
    return int(time.time())


class BatchStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.store.ensure(FEATURE, DDL)
        self.store.add_columns("batches", ADDED)

    def add(self, batch: Batch, lines: Iterable[tuple[str, str]], output_expiry: int | None = None) -> None:
        """Store a new batch (owned by this process) and its lines: (custom_id, request body JSON)."""
        rows = [("INSERT INTO batch_lines (batch_id, line, custom_id, body) VALUES (?, ?, ?, ?)",
                 (batch.id, i, custom_id, body)) for i, (custom_id, body) in enumerate(lines)]
        self.store.transaction([
            ("INSERT INTO batches (id, created_at, status, body, owner, output_expiry) VALUES (?, ?, ?, ?, ?, ?)",
             (batch.id, batch.created_at, batch.status, msgspec.json.encode(batch).decode(), owner_token(),
              output_expiry)),
            *rows])

    def get(self, bid: str) -> Batch | None:
        row = self.store.query_one("SELECT body, completed, failed FROM batches WHERE id = ?", (bid,))
        return _batch(row) if row else None

    def output_expiry(self, bid: str) -> int | None:
        row = self.store.query_one("SELECT output_expiry FROM batches WHERE id = ?", (bid,))
        return row[0] if row else None

    def owner(self, bid: str) -> int | None:
        row = self.store.query_one("SELECT owner FROM batches WHERE id = ?", (bid,))
        return row[0] if row else None

    def page(self, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        """Batches newest first after the batch `after`; (page, has_more). KeyError if no batch had that id."""
        anchor = None
        if after is not None:
            row = self.store.query_one("SELECT rowid FROM batches WHERE id = ?", (after,))
            if row is None:
                raise KeyError(after)
            anchor = row[0]
        rows = self.store.query(
            "SELECT body, completed, failed FROM batches WHERE (? IS NULL OR rowid < ?) ORDER BY rowid DESC LIMIT ?",
            (anchor, anchor, limit + 1))
        found = [_batch(r) for r in rows]
        return found[:limit], len(found) > limit

    def output_files(self, bid: str) -> tuple[str, str]:
        """The ids of the batch's output and error files: reserved on the first call, the same ones after."""
        row = self.store.query_one("SELECT output_files FROM batches WHERE id = ?", (bid,))
        if row is not None and row[0]:
            out, err = json.loads(row[0])
            return out, err
        made = [f"file-{secrets.token_hex(12)}" for _ in range(2)]  # (FileStore's id form)
        self.store.execute("UPDATE batches SET output_files = ? WHERE id = ? AND output_files IS NULL",
                           (json.dumps(made), bid))
        row = self.store.query_one("SELECT output_files FROM batches WHERE id = ?", (bid,))
        out, err = json.loads(row[0]) if row is not None and row[0] else made
        return out, err

    def move(self, batch: Batch, expect: tuple[str, ...], drop_lines: bool = False,
             also: Sequence[tuple[str, Sequence[Any]]] = (), failed: int = 0) -> bool:
        """Store `batch` (its new status and times) if its stored status is one of `expect`; False if not
        (a cancel came meanwhile). `drop_lines`: it has ended; its lines go in the same transaction, with the
        statements `also` (its files' rows) and `failed` more failed lines (ones whose result was not stored)."""
        body = msgspec.json.encode(batch).decode()  # (its counts' completed / failed are read from the columns)
        marks = ",".join("?" * len(expect))
        if not drop_lines:
            return self.store.execute(f"UPDATE batches SET status = ?, body = ? WHERE id = ? AND status IN ({marks})",
                                      (batch.status, body, batch.id, *expect)) > 0
        if self.status(batch.id) not in expect:  # (only this batch's owner ends it: no race to lose here)
            return False
        self.store.transaction([
            *also,
            ("UPDATE batches SET status = ?, body = ?, failed = failed + ? WHERE id = ?",
             (batch.status, body, failed, batch.id)),
            ("DELETE FROM batch_lines WHERE batch_id = ?", (batch.id,))])
        return True

    def status(self, bid: str) -> str | None:
        row = self.store.query_one("SELECT status FROM batches WHERE id = ?", (bid,))
        return row[0] if row else None

    def claim(self, bid: str, was: int | None) -> bool:
        """Take an unfinished batch over from the owner `was` (a gone server); False if another took it first."""
        return self.store.execute("UPDATE batches SET owner = ? WHERE id = ? AND owner IS ?",
                                  (owner_token(), bid, was)) > 0

    def unfinished(self) -> list[tuple[str, int | None]]:
        """(id, owner) of every batch not yet ended, oldest first."""
        marks = ",".join("?" * len(UNFINISHED))
        rows = self.store.query(f"SELECT id, owner FROM batches WHERE status IN ({marks}) ORDER BY rowid",
                                UNFINISHED)
        return [(r[0], r[1]) for r in rows]

    def pending(self, bid: str) -> list[tuple[int, str, str]]:
        """(line, custom_id, body) of the lines without a result, in input order."""
        rows = self.store.query("SELECT line, custom_id, body FROM batch_lines WHERE batch_id = ? AND result IS NULL "
                                "ORDER BY line", (bid,))
        return [(r[0], r[1], r[2]) for r in rows]

    def has_pending(self, bid: str) -> bool:
        """Whether a line of the batch has no result yet."""
        return self.store.query_one("SELECT 1 FROM batch_lines WHERE batch_id = ? AND result IS NULL LIMIT 1",
                                    (bid,)) is not None

    def record(self, bid: str, line: int, result: bytes, ok: bool) -> None:
        """A line's result, and its count, in one transaction; a line that has one already is left as it is."""
        column = "completed" if ok else "failed"
        self.store.transaction([
            ("UPDATE batch_lines SET result = ?, ok = ? WHERE batch_id = ? AND line = ? AND result IS NULL",
             (result.decode(), int(ok), bid, line)),
            # changes(): the rows the statement before changed (0 when the line had its result already)
            (f"UPDATE batches SET {column} = {column} + changes() WHERE id = ?", (bid,))])

    def results(self, bid: str) -> Iterator[tuple[int, str, str | None, bool]]:
        """(line, custom_id, result or None, ok) of every line in input order, read RESULTS_CHUNK at a time."""
        last = -1
        while True:
            rows = self.store.query("SELECT line, custom_id, result, ok FROM batch_lines WHERE batch_id = ? AND "
                                    "line > ? ORDER BY line LIMIT ?", (bid, last, RESULTS_CHUNK))
            if not rows:
                return
            for r in rows:
                yield r[0], r[1], r[2], bool(r[3])
            last = rows[-1][0]


def _batch(row) -> Batch:
    found = msgspec.json.decode(row[0].encode(), type=Batch)
    total = found.request_counts.total if found.request_counts else 0
    return msgspec.structs.replace(found, request_counts=RequestCounts(total=total, completed=row[1], failed=row[2]))
