"""Uploaded files (OpenAI's Files API) in the data directory's SQLite store (store.py).

    files(id "file-...", filename, purpose, bytes, created_at, expires_at, file, deleted_at)
    file_cursors(id, seq)    where files dropped from `files` stood (their rowid), so `after` may name one

Each file's bytes live beside the database under `files("uploads")`, written before
its row and removed after it, so a crash leaves at worst an orphan file, never a row
without its bytes (an upload whose bytes or row the disk or the store refuses removes its bytes); opening the store (a server's first use of it) removes orphans older than
ORPHAN_AGE_S (a younger one may be another process's upload between its two writes).
A file past its `expires_at` is gone: every read skips it, and each upload and listing
removes the expired files' bytes (no timer runs).

A deleted or expired file's row stays as a tombstone (`deleted_at` set, its bytes gone) for
TOMBSTONE_S: a listing's `after` cursor names the last file of the page before, and a client that
deletes the files of each page as it pages (`for f in client.files.list(): client.files.delete(f.id)`)
sends the id of a file it has just deleted. Every read skips tombstones; each upload and listing
drops the old ones, keeping only their place in `file_cursors` (as /v1/videos and the voice consents
keep theirs), so an `after` that names any file that ever was places its page, and one that names
none is an error (the route's 400).
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from omni_actors.store import Store, get_store

FEATURE = "uploads"
DDL = (
    "CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL, "
    "bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER, file TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS file_cursors (id TEXT PRIMARY KEY, seq INTEGER NOT NULL)",
)
_COLUMNS = "id, filename, purpose, bytes, created_at, expires_at"
_LIVE = "deleted_at IS NULL AND (expires_at IS NULL OR expires_at > ?)"
ADDED = {"deleted_at": "INTEGER"}
"""Columns added after the table's first release (Store.add_columns); NULL: not deleted."""
TOMBSTONE_S = 24 * 3600
"""How long a deleted or expired file's row stays to place a listing's `after` cursor."""
ORPHAN_AGE_S = 600
"""An upload's bytes without a row, this old, are a crash's leftovers (see the module docstring)."""


@dataclass(frozen=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None


class FileStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)
        self.store.add_columns("files", ADDED)
        self.dir: Path = self.store.files(FEATURE)
        self.orphans_removed = self.sweep()

    def sweep(self, now: float | None = None) -> int:
        """Remove upload files that no live row names and that are older than ORPHAN_AGE_S; how many."""
        known = {r[0] for r in self.store.query("SELECT file FROM files WHERE deleted_at IS NULL")}
        cutoff = (time.time() if now is None else now) - ORPHAN_AGE_S
        gone = 0
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.startswith("file-") and entry.name not in known and entry.is_file() \
                        and entry.stat().st_mtime < cutoff:
                    Path(entry.path).unlink(missing_ok=True)
                    gone += 1
        return gone

    def add(self, filename: str, purpose: str, data: bytes, expires_after_s: int | None = None,
            now: int | None = None) -> StoredFile:
        """Keep `data`; blocking file I/O, so call it off the loop. `now` (default: the clock) is
        the creation time `expires_after_s` counts from."""
        self.purge()
        fid = f"file-{secrets.token_hex(12)}"
        try:
            (self.dir / fid).write_bytes(data)
        except BaseException:  # (a disk full part way: no partial bytes stay)
            (self.dir / fid).unlink(missing_ok=True)
            raise
        created = int(time.time()) if now is None else now
        expires = None if expires_after_s is None else created + expires_after_s
        # rowid past every dropped file's too, so a cursor left by one never hides a newer file
        try:
            self.store.execute(
                "INSERT INTO files (rowid, id, filename, purpose, bytes, created_at, expires_at, file) VALUES (1 + "
                "MAX(COALESCE((SELECT MAX(rowid) FROM files), 0), COALESCE((SELECT MAX(seq) FROM file_cursors), 0)), "
                "?, ?, ?, ?, ?, ?, ?)", (fid, filename, purpose, len(data), created, expires, fid))
        except BaseException:  # (the store refused the row, e.g. a disk full or a lock held past its timeout)
            (self.dir / fid).unlink(missing_ok=True)
            raise
        return StoredFile(fid, filename, purpose, len(data), created, expires)

    def get(self, fid: str) -> StoredFile | None:
        row = self.store.query_one(f"SELECT {_COLUMNS} FROM files WHERE id = ? AND {_LIVE}",
                                   (fid, int(time.time())))
        return StoredFile(*row) if row else None

    def content(self, fid: str) -> tuple[StoredFile, bytes] | None:
        """A live file and its bytes (None if there is none); blocking file I/O: call it off the loop."""
        found = self.get(fid)
        if found is None:
            return None
        try:
            return found, (self.dir / fid).read_bytes()
        except FileNotFoundError:  # deleted meanwhile
            return None

    def page(self, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> tuple[list[StoredFile], bool]:
        """Live files (of `purpose` if given) in creation order after the file `after` (a live, deleted or
        expired one); (page, has_more). KeyError if `after` names no file that ever was."""
        self.purge()
        op, order = ("<", "DESC") if newest_first else (">", "ASC")
        anchor = None if after is None else self.store.cursor("files", "file_cursors", after)
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM files WHERE {_LIVE} AND (? IS NULL OR purpose = ?) AND "
            f"(? IS NULL OR rowid {op} ?) ORDER BY rowid {order} LIMIT ?",
            (int(time.time()), purpose, purpose, anchor, anchor, limit + 1))
        found = [StoredFile(*r) for r in rows]
        return found[:limit], len(found) > limit

    def delete(self, fid: str, now: int | None = None) -> bool:
        """Remove a live file's bytes; its row stays a tombstone (see the module docstring). `now` (default:
        the clock) is the deletion time the tombstone's TOMBSTONE_S counts from."""
        now = int(time.time()) if now is None else now
        if not self.store.execute(f"UPDATE files SET deleted_at = ? WHERE id = ? AND {_LIVE}", (now, fid, now)):
            return False
        (self.dir / fid).unlink(missing_ok=True)
        return True

    def purge(self) -> int:
        """Remove the expired files' bytes (their rows become tombstones) and drop the tombstones older than
        TOMBSTONE_S, keeping their places as cursors; return how many files expired."""
        now = int(time.time())
        gone = [r[0] for r in self.store.query(
            "SELECT id FROM files WHERE deleted_at IS NULL AND expires_at IS NOT NULL AND expires_at <= ?", (now,))]
        for fid in gone:
            if self.store.execute("UPDATE files SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL", (now, fid)):
                (self.dir / fid).unlink(missing_ok=True)
        old = (now - TOMBSTONE_S,)
        if self.store.query_one("SELECT 1 FROM files WHERE deleted_at <= ? LIMIT 1", old) is None:
            return len(gone)  # (no write, so no wait on another process's write lock)
        self.store.transaction([
            ("INSERT OR IGNORE INTO file_cursors SELECT id, rowid FROM files WHERE deleted_at <= ?", old),
            ("DELETE FROM files WHERE deleted_at <= ?", old)])
        return len(gone)
