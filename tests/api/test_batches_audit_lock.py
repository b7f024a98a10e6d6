"""Batches while another process holds the data directory's SQLite write lock (a second server on the
same data directory, a backup): the batch's store calls wait for it off the event loop, so the server
keeps answering and no line is lost or run twice."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import aiohttp

from omni_actors.api.batches import RUNNER_KEY
from omni_actors.store import DB_NAME
from tests.api.conftest import eventually, idle
from tests.api.test_batches import (
    CHAT,
    SLOW_STEP_MS,
    chat_line,
    ended,
    lines_of,
    reached,
    serve_batches,
    upload,
)

SLOW_LINE_TOKENS = 100
"""The line's tokens at SLOW_STEP_MS each (1 s): the lock is taken while it runs."""
LINE_WAIT_S = 20.0
"""Longest the test waits for the line's answer (its result then waits up to the store's 10 s busy timeout)."""


async def test_a_line_ending_while_another_process_holds_the_write_lock_stalls_no_client(tmp_path: Path) -> None:
    async with serve_batches(tmp_path, SLOW_STEP_MS) as srv:
        client = srv.client()
        runner = srv.http.runner.app[RUNNER_KEY]  # type: ignore[union-attr]
        made = await client.batches.create(
            input_file_id=await upload(client, [chat_line("a", "red", max_tokens=SLOW_LINE_TOKENS)]), endpoint=CHAT,
            completion_window="24h")
        await eventually(lambda: runner.statistics().lines_in_flight == 1)
        with contextlib.closing(sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # (the line is running: its status checks are behind it)
            try:
                # the line is answered; its result waits for the lock in a thread, and the loop serves on
                await eventually(lambda: srv.orch.statistics().requests_total == 1 and idle(srv.orch), LINE_WAIT_S)
                async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/v1/models",
                                                                     headers=srv.headers) as resp:
                    assert resp.status == 200
                stats = runner.statistics()
                assert (stats.lines_in_flight, stats.unstored_lines) == (1, 0), stats  # (not failed, not kept)
            finally:
                other.execute("ROLLBACK")
        done = await reached(client, made.id, ended)
        assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 1, 0), done
        (out,) = await lines_of(client, done.output_file_id)
        assert out["custom_id"] == "a" and out["response"]["status_code"] == 200
        assert srv.orch.statistics().requests_total == 1  # the line ran once
        await eventually(lambda: idle(srv.orch))
