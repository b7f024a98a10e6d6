"""The data directory's SQLite store: tables survive a reopen, transactions are atomic."""

from __future__ import annotations

import sqlite3

import pytest

from omni_actors.store import Store

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
