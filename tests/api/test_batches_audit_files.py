"""Uploads (the Files API that batches read and write): one whose name is not UTF-8 is a 400 naming `file`,
and one the store refuses leaves no bytes behind."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import openai
import pytest

from omni_actors.store import DB_NAME
from tests.api.conftest import post
from tests.api.test_batches import chat_line, serve_batches, upload

REFUSAL = "database or disk is full (test)"


async def test_an_upload_whose_row_the_store_refuses_leaves_no_bytes(tmp_path: Path) -> None:
    uploads = tmp_path / "files" / "uploads"
    async with serve_batches(tmp_path) as srv:
        client = srv.client()
        kept = await upload(client, [chat_line("a", "x")])
        with contextlib.closing(sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)) as db:
            db.execute(f"CREATE TRIGGER refuse_file BEFORE INSERT ON files BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END")
            try:
                with pytest.raises(openai.InternalServerError):
                    await upload(client, [chat_line("b", "y")])
            finally:
                db.execute("DROP TRIGGER refuse_file")
        assert sorted(p.name for p in uploads.iterdir()) == [kept]  # (no orphan bytes of the refused upload)
        assert [f.id async for f in client.files.list()] == [kept]
        again = await upload(client, [chat_line("b", "y")])
        assert sorted(p.name for p in uploads.iterdir()) == sorted([kept, again])


async def test_an_upload_whose_name_is_not_utf8_is_a_400_naming_the_file(tmp_path: Path) -> None:
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\n").encode() + (
        b'Content-Disposition: form-data; name="file"; filename="\xff\xfe.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n{}\r\n") + f"--{boundary}--\r\n".encode()
    async with serve_batches(tmp_path) as srv:
        status, answer = await post(srv, "/v1/files", data=body,
                                    headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert status == 400, answer
        assert answer["error"]["param"] == "file" and "UTF-8" in answer["error"]["message"], answer
        assert not list((tmp_path / "files" / "uploads").iterdir())
        assert (await srv.client().files.list()).data == []
