"""A write that finds the data directory's SQLite lock held past the store's busy timeout (another server on
the same data directory, a backup) is a 503 `store_busy` with Retry-After, not a 500 `internal_error`: the
client is told to retry, and the log has one warning, not a traceback."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from omni_actors import store
from tests.api.test_batches import serve_batches

SHORT_BUSY_S = 0.3
"""The store's busy timeout here (10 s by default), so that the held lock outlasts it at once."""


async def test_a_write_behind_another_process_lock_is_a_503_to_retry(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", SHORT_BUSY_S)
    async with serve_batches(tmp_path) as srv:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", b'{"a": 1}\n', filename="in.jsonl", content_type="application/jsonl")
        with contextlib.closing(sqlite3.connect(tmp_path / store.DB_NAME, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            try:
                async with aiohttp.ClientSession() as http, http.post(f"{srv.url}/v1/files", data=form,
                                                                     headers=srv.headers) as resp:
                    body = await resp.json()
            finally:
                other.execute("ROLLBACK")
        assert resp.status == 503, body
        assert body["error"]["code"] == "store_busy" and resp.headers["Retry-After"] == "1", body
        again = await srv.client().files.create(file=("in.jsonl", b'{"a": 1}\n'), purpose="batch")
        assert again.id  # the lock gone, the same upload is taken
        assert [p.name for p in tmp_path.rglob("file-*")] == [again.id]  # (the refused upload left no bytes)
