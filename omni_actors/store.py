"""The data directory's SQLite database: state a client may come back for (jobs, voices, consents).

One file, `<OMNI_DATA_DIR>/state/state.sqlite3`, opened once per process in WAL mode. Each
feature owns its tables: it declares them with `Store.ensure(name, ddl)` (idempotent
`CREATE TABLE IF NOT EXISTS ...` statements) and keeps its queries in its own module;
this module knows no feature. Payload files (videos, voice clips) live beside the
database under `Store.files(feature)`, written by their owner. Values are plain
SQLite types or JSON text: nothing is pickled.

Queries are short and local, so callers on the event loop run them inline; a feature
that writes large files does that off the loop itself.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omni_actors import logs
from omni_actors.settings import settings

log = logs.get(__name__)

DB_NAME = "state.sqlite3"
BUSY_TIMEOUT_S = 10.0
"""How long a write waits for another process's write lock before failing."""


class Store:
    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir).expanduser()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.root / DB_NAME
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # A commit is durable across a crash of this process without waiting on the disk (WAL + NORMAL:
        # only a power loss may drop the last commits, never corrupt the file). FULL waited ~4 ms a commit
        # here, on the event loop: a batch line, a stored chat, a conversation append each paid it
        # (scripts/bench_state.py: batches 0.71x direct calls with FULL, 1.68x with NORMAL).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._ensured: set[str] = set()

    def ensure(self, name: str, ddl: Iterable[str]) -> None:
        """Create a feature's tables/indexes once per process (statements must be idempotent)."""
        if name in self._ensured:
            return
        with self._lock:
            for stmt in ddl:
                self._db.execute(stmt)
            self._ensured.add(name)

    def add_columns(self, table: str, columns: dict[str, str]) -> None:
        """Columns a feature added after its table was first made (name -> SQL type), added to a
        database that lacks them; rows from before read NULL there."""
        with self._lock:
            have = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, decl in columns.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one write; return the number of rows it changed."""
        with self._lock:
            return self._db.execute(sql, params).rowcount

    def transaction(self, statements: Iterable[tuple[str, Sequence[Any] | dict[str, Any]]]) -> None:
        """Run several writes atomically."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def cursor(self, table: str, cursors: str, item_id: str) -> int:
        """Where a list's item `item_id` stands (for `after` paging): its rowid in `table`, or the place a
        deleted one left in `cursors` (id, seq). KeyError if no item had that id."""
        row = (self.query_one(f"SELECT rowid FROM {table} WHERE id = ?", (item_id,))
               or self.query_one(f"SELECT seq FROM {cursors} WHERE id = ?", (item_id,)))
        if row is None:
            raise KeyError(item_id)
        return int(row[0])

    def files(self, feature: str) -> Path:
        """A private folder for a feature's payload files (created on first use)."""
        path = self.root / "files" / feature
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def close(self) -> None:
        with self._lock:
            self._db.close()


PID_BITS = 22
"""Linux pids are below 2**22 (pid_max's ceiling); an owner token keeps the pid in these bits."""


def _started(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22); None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])  # (the name may hold spaces: split after it)


def owner_token() -> int:
    """This process as a row's owner: its start time and pid in one integer, so a later process
    that reuses the pid is not taken for the owner (the pid alone where /proc is missing)."""
    pid = os.getpid()
    return ((_started(pid) or 0) << PID_BITS) | pid


def owned_elsewhere(owner: int | None) -> bool:
    """Whether a row's owner (the server running a job or a response: an `owner_token`, or a bare
    pid from before them) is another process that still runs; False for this process (whose own
    work it tracks itself), a gone one, or one whose pid a newer process has taken."""
    if owner is None or owner == owner_token():
        return False
    pid, started = owner & ((1 << PID_BITS) - 1), owner >> PID_BITS
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not started or _started(pid) in (None, started)


_STORE: Store | None = None
_STORE_LOCK = threading.Lock()


def get_store() -> Store:
    """The process's store in the settings' state directory (opened on first use)."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None:
            _STORE = Store(settings().state_dir)
            log.info("store.opened", path=str(_STORE.path))
        return _STORE


def close_store() -> None:
    """Close the process's store (at shutdown); a later get_store() opens it again."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is not None:
            _STORE.close()
            _STORE = None
