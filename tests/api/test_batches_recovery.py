"""A batch's recovery from what goes wrong around it: a store that refuses a line's result, an end cut short
between writing the files and marking the batch done, a restart that resumes it while the models load; its
output written line by line in bounded memory; its lines in flight set by the deploy.

Real servers on the synthetic pipeline, read with the unmodified openai SDK; the store's failures are made
by SQLite itself (a trigger put in the real database file aborts the write it names).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from omni_actors.api.batches import RUNNER_KEY
from omni_actors.api.batches_output import write_outputs
from omni_actors.api.batches_schemas import Batch, RequestCounts
from omni_actors.api.batches_store import RESULTS_CHUNK, BatchStore
from omni_actors.api.file_store import FileStore
from omni_actors.api.loading import LOADING_KEY, Loading
from omni_actors.config.deploy import ServerConfig
from omni_actors.errors import ConfigError
from omni_actors.store import DB_NAME, Store
from tests.api.conftest import eventually, idle, make_deploy, serve_deploy
from tests.api.test_batches import (
    CHAT,
    KEY,
    chat_line,
    ended,
    lines_of,
    reached,
    serve_batches,
    upload,
)

WAIT_S = 10.0
"""Longest a test waits for the runner to reach a state."""
REFUSED = "refused"
"""The custom_id of the line whose result the store refuses."""
BIG_LINES, BIG_LINE_BYTES = 1200, 8192
"""A batch whose results are ~10 MB in all."""
WRITE_PEAK_BYTES = 32 * RESULTS_CHUNK * 1024
"""Most memory writing its files may take: a few chunks of results (about 4 chunks of those lines), not all."""
HAS_LOADING_READY = hasattr(Loading(), "ready")
HAS_LINES_SETTING = "batch_lines_in_flight" in ServerConfig.__struct_fields__


@contextlib.contextmanager
def trigger(data: Path, name: str, sql: str) -> Iterator[None]:
    """A trigger in the server's real database for the block (what it aborts, SQLite refuses)."""
    with contextlib.closing(sqlite3.connect(data / DB_NAME)) as db:
        db.execute(f"CREATE TRIGGER {name} {sql}")
        db.commit()
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER {name}")
            db.commit()


def batch_files(data: Path, bid: str) -> list[tuple[str, str]]:
    """(id, filename) of every file row made for the batch (live or not), oldest first."""
    with contextlib.closing(sqlite3.connect(data / DB_NAME)) as db:
        return db.execute("SELECT id, filename FROM files WHERE filename LIKE ? ORDER BY rowid",
                          (f"{bid}_%",)).fetchall()


@pytest.mark.parametrize("refuses", ["the-answer", "the-answer-and-its-error"])
async def test_a_line_whose_result_the_store_refuses_fails_with_an_internal_error(tmp_path: Path,
                                                                                 refuses: str) -> None:
    """The store refuses a line's result (SQLite aborts it): the line is failed with an internal_error naming
    why (stored in its place, or kept until the batch ends when the store refuses that too), in the error
    file, and the batch completes with the others."""
    when = "NEW.custom_id = 'refused'" + (" AND NEW.ok = 1" if refuses == "the-answer" else "")
    async with serve_batches(tmp_path) as srv:
        client = srv.client()
        lines = [chat_line("a", "red", max_tokens=1), chat_line(REFUSED, "green", max_tokens=1),
                 chat_line("b", "blue", max_tokens=1)]
        fid = await upload(client, lines)
        with trigger(tmp_path, "refuse_line", f"BEFORE UPDATE OF result ON batch_lines WHEN {when} BEGIN "
                     "SELECT RAISE(ABORT, 'database or disk is full (test)'); END"):
            made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
            done = await reached(client, made.id, ended)
        assert done.status == "completed", done
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 1), done.request_counts
        out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
        assert [x["custom_id"] for x in out] == ["a", "b"]
        (failed,) = err
        assert failed["custom_id"] == REFUSED and failed["response"] is None, failed
        assert failed["error"]["code"] == "internal_error", failed
        assert "database or disk is full (test)" in failed["error"]["message"], failed
        assert srv.http.runner.app[RUNNER_KEY].statistics().unstored_lines == 0  # type: ignore[union-attr]
        await eventually(lambda: idle(srv.orch))


async def test_a_batch_cut_short_while_ending_ends_once_with_one_output_file(tmp_path: Path) -> None:
    """The server stops between writing a batch's files and marking it done (here SQLite refuses its end, as
    a killed server never writes it): the next server ends it with the same two files, not a second pair."""
    lines = [chat_line("a", "red", max_tokens=1), chat_line("bad", "x", max_tokens=-1),
             chat_line("b", "blue", max_tokens=1)]
    async with serve_batches(tmp_path) as first:
        client = first.client()
        runner = first.http.runner.app[RUNNER_KEY]  # type: ignore[union-attr]
        fid = await upload(client, lines)
        with trigger(tmp_path, "no_end", "BEFORE UPDATE OF status ON batches WHEN NEW.status IN ('completed', "
                     "'failed') BEGIN SELECT RAISE(ABORT, 'the server stopped here (test)'); END"):
            made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
            await eventually(lambda: not runner.tasks, WAIT_S)
            assert (await client.batches.retrieve(made.id)).status == "finalizing"
        assert batch_files(tmp_path, made.id) == []  # (no file is live before the batch ends)
        await eventually(lambda: idle(first.orch))
    async with serve_batches(tmp_path) as second:
        client = second.client()
        done = await reached(client, made.id, ended)
        assert done.status == "completed", done
        rows = batch_files(tmp_path, made.id)
        assert rows == [(done.output_file_id, f"{made.id}_output.jsonl"),
                        (done.error_file_id, f"{made.id}_error.jsonl")], rows
        listed = [f.id async for f in client.files.list(purpose="batch_output")]
        assert sorted(listed) == sorted([done.output_file_id, done.error_file_id])
        out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
        assert [x["custom_id"] for x in out] == ["a", "b"] and [x["custom_id"] for x in err] == ["bad"]
        assert second.orch.statistics().requests_total == 0  # (no line ran again)


def test_the_files_are_written_line_by_line_in_bounded_memory(tmp_path: Path) -> None:
    """~10 MB of results written to the output and error files in input order while holding a few chunks of
    lines at most; the files are not live until the batch's end runs their rows."""
    store = Store(tmp_path)
    try:
        files, batches = FileStore(store), BatchStore(store)
        now = int(time.time())
        batch = Batch(f"batch_{secrets.token_hex(12)}", CHAT, "file-x", "24h", "finalizing", now, now + 3600,
                      RequestCounts(total=BIG_LINES))
        batches.add(batch, [(f"r{i}", "{}") for i in range(BIG_LINES)])
        pad = "x" * BIG_LINE_BYTES
        for i in range(BIG_LINES):
            ok = i % 3 != 0
            body = {"usage": {"prompt_tokens": 1, "completion_tokens": 2}, "pad": pad} if ok else {"pad": pad}
            batches.record(batch.id, i, json.dumps({"id": f"l{i}", "custom_id": f"r{i}", "error": None,
                                                    "response": {"status_code": 200 if ok else 400,
                                                                 "body": body}}).encode(), ok)
        tracemalloc.start()
        try:
            written = write_outputs(files, batches, batch, None, {})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < WRITE_PEAK_BYTES, peak
        assert written.output_file_id is not None and written.error_file_id is not None
        assert files.get(written.output_file_id) is None  # (its row is the batch end's to write)
        batches.move(msgspec.structs.replace(batch, status="completed"), ("finalizing",), drop_lines=True,
                     also=written.rows)
        got = files.content(written.output_file_id)
        assert got is not None and got[0].purpose == "batch_output"
        out = [json.loads(x)["custom_id"] for x in got[1].splitlines()]
        assert out == [f"r{i}" for i in range(BIG_LINES) if i % 3 != 0]
        errors = files.content(written.error_file_id)
        assert errors is not None
        assert [json.loads(x)["custom_id"] for x in errors[1].splitlines()] == [f"r{i}" for i in range(0, BIG_LINES, 3)]
        assert written.usage.output_tokens == 2 * len(out) and written.usage.input_tokens == len(out)
    finally:
        store.close()


@pytest.mark.skipif(not HAS_LOADING_READY, reason="needs api/loading.py's `Loading.ready` event (see the report)")
async def test_a_resumed_batch_waits_for_the_models_instead_of_meeting_503s(tmp_path: Path) -> None:
    """A batch taken up while the server loads its models sends no line until they are loaded (no 503
    "loading" answers, no Retry-After wait), then runs every line."""
    async with serve_batches(tmp_path) as srv:
        app = srv.http.runner.app  # type: ignore[union-attr]
        runner, loading = app[RUNNER_KEY], app[LOADING_KEY]
        store = await runner.batch_store()
        now = int(time.time())
        batch = Batch(f"batch_{secrets.token_hex(12)}", CHAT, "file-x", "24h", "in_progress", now, now + 3600,
                      RequestCounts(total=2), "synthetic")
        loading.begin()  # (as omni-run does before its workers load)
        lines = [chat_line(f"r{i}", f"w{i}", max_tokens=1) for i in range(2)]
        store.add(batch, [(x["custom_id"], json.dumps(x["body"])) for x in lines])
        await runner.resume()
        await eventually(lambda: runner.statistics().waiting_for_models == 1, WAIT_S)
        assert runner.statistics().lines_in_flight == 0 and srv.orch.statistics().requests_total == 0
        loading.end()
        client = srv.client()
        done = await reached(client, batch.id, ended)
        assert (done.status, done.request_counts.completed) == ("completed", 2), done
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/metrics") as resp:
            metrics = await resp.text()
        assert 'code="loading"' not in metrics, "a resumed line met a 503 while the models loaded"
        await eventually(lambda: idle(srv.orch))


@pytest.mark.skipif(not HAS_LINES_SETTING, reason="needs config/deploy.py's `server.batch_lines_in_flight`")
async def test_lines_in_flight_is_the_deploys_setting(tmp_path: Path) -> None:
    for bad in (0, 257):
        with pytest.raises(ConfigError, match=r"server\.batch_lines_in_flight"):
            make_deploy("synthetic", server={"batch_lines_in_flight": bad})
    deploy = make_deploy("synthetic", server={"api_keys": [KEY], "batch_lines_in_flight": 2})
    async with serve_deploy(deploy, KEY, tmp_path) as srv:
        assert srv.http.runner.app[RUNNER_KEY].lines_in_flight == 2  # type: ignore[union-attr]
        client = srv.client()
        fid = await upload(client, [chat_line(f"r{i}", f"w{i}", max_tokens=1) for i in range(3)])
        made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
        assert (await reached(client, made.id, ended)).request_counts.completed == 3
        await eventually(lambda: idle(srv.orch))


@pytest.mark.skipif(not HAS_LOADING_READY, reason="needs api/loading.py's `Loading.ready` event (see the report)")
async def test_a_server_stopped_while_loading_leaves_a_waiting_batch_for_the_next(tmp_path: Path) -> None:
    """A server stopped before its models loaded ends its waiting batch's task at once (nothing left
    running), the batch still `in_progress`, with no line run."""
    async with serve_batches(tmp_path) as srv:
        app = srv.http.runner.app  # type: ignore[union-attr]
        runner = app[RUNNER_KEY]
        store = await runner.batch_store()
        now = int(time.time())
        batch = Batch(f"batch_{secrets.token_hex(12)}", CHAT, "file-x", "24h", "in_progress", now, now + 3600,
                      RequestCounts(total=1), "synthetic")
        app[LOADING_KEY].begin()
        store.add(batch, [("r0", json.dumps(chat_line("r0", "w0")["body"]))])
        await runner.resume()
        await eventually(lambda: runner.statistics().waiting_for_models == 1, WAIT_S)
    assert not runner.tasks and runner.statistics().waiting_for_models == 0
    with contextlib.closing(sqlite3.connect(tmp_path / DB_NAME)) as db:
        assert db.execute("SELECT status, completed + failed FROM batches WHERE id = ?",
                          (batch.id,)).fetchone() == ("in_progress", 0)
