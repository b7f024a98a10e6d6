"""The data directory's SQLite store: tables survive a reopen, transactions are atomic; a row's owner is a
process, not a pid."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from omni_actors.store import PID_BITS, Store, owned_elsewhere, owner_token

DDL = ("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, body TEXT NOT NULL)",)


def test_rows_survive_a_reopen(tmp_path):
    store = Store(tmp_path)
    store.ensure("notes", DDL)
    assert store.execute("INSERT INTO notes VALUES (?, ?)", ("a", "one")) == 1
    store.close()
    again = Store(tmp_path)
    again.ensure("notes", DDL)
    assert [tuple(r) for r in again.query("SELECT id, body FROM notes")] == [("a", "one")]
    assert again.files("videos").is_dir()
    again.close()


def test_a_failed_transaction_changes_nothing(tmp_path):
    store = Store(tmp_path)
    store.ensure("notes", DDL)
    with pytest.raises(sqlite3.IntegrityError):
        store.transaction([
            ("INSERT INTO notes VALUES (?, ?)", ("b", "two")),
            ("INSERT INTO notes VALUES (?, ?)", ("b", "dup")),
        ])
    assert store.query("SELECT * FROM notes") == []
    store.close()


def test_columns_added_later_reach_an_old_database_once(tmp_path):
    from omni_actors.api.videos_store import ADDED, VideoStore

    old = Store(tmp_path)  # a data directory from before the remix columns
    old.execute("CREATE TABLE video_jobs (id TEXT PRIMARY KEY, model TEXT NOT NULL, prompt TEXT, size TEXT NOT NULL, "
                "seconds TEXT NOT NULL, status TEXT NOT NULL, progress INTEGER NOT NULL DEFAULT 0, created_at "
                "INTEGER NOT NULL, completed_at INTEGER, error_code TEXT, error_message TEXT, error_param TEXT, "
                "owner_pid INTEGER NOT NULL, has_audio INTEGER NOT NULL DEFAULT 0)")
    old.execute("INSERT INTO video_jobs (id, model, prompt, size, seconds, status, created_at, owner_pid) "
                "VALUES ('v1', 'm', 'p', '32x32', '1', 'completed', 1, 1)")
    old.close()
    for _ in range(2):  # the second open finds the columns there
        store = Store(tmp_path)
        jobs = VideoStore(store)
        names = {r["name"] for r in store.query("PRAGMA table_info(video_jobs)")}
        assert set(ADDED) <= names
        row = jobs.get("v1")
        assert row is not None and (row.request, row.seed, row.remixed_from) == (None, None, None)
        store.close()


def test_a_row_owner_is_a_live_process_and_not_one_that_reused_its_pid() -> None:
    """owner_token is pid + start time: a live other process owns its rows; a gone one, this one,
    and a process that took a gone owner's pid do not; a bare pid (a row from before the tokens)
    is judged by the pid alone."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        token = (started << PID_BITS) | child.pid
        assert owned_elsewhere(token) and owned_elsewhere(child.pid)
        assert not owned_elsewhere(((started + 1) << PID_BITS) | child.pid)  # the pid, another process
        assert not owned_elsewhere(owner_token()) and not owned_elsewhere(None)
    finally:
        child.communicate(b"")
    assert not owned_elsewhere(token) and not owned_elsewhere(child.pid)


def test_commits_do_not_wait_on_the_disk_and_survive_a_reopen(tmp_path):
    """WAL with synchronous=NORMAL (1): a commit is not an fsync on the caller's (the event loop's) time, and
    what was committed is there for the next process (before 2026-12-05 FULL, 2: ~4 ms a commit)."""
    store = Store(tmp_path)
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.ensure("t", ["CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)"])
    store.transaction([("INSERT INTO t (k) VALUES (?)", (str(i),)) for i in range(3)])
    store.close()
    again = Store(tmp_path)
    again.ensure("t", ["CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)"])
    assert [r[0] for r in again.query("SELECT k FROM t ORDER BY k")] == ["0", "1", "2"]
    again.close()
