"""/v1/files with the unmodified openai SDK: upload, list (paged), retrieve, content, delete, expiry, a
restart; and a file used by id in /v1/responses (an `input_image` or `input_file` part). Videos read by file_id are in
tests/api/test_video_edits_i2v.py."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from PIL import Image

from omni_actors.api.file_store import ORPHAN_AGE_S, TOMBSTONE_S, FileStore
from omni_actors.store import DB_NAME, Store
from tests.api.conftest import Server, make_deploy, serve_deploy

KEY = "files-test-key"


@contextlib.asynccontextmanager
async def serve_files(data: Path) -> AsyncIterator[Server]:
    """The synthetic pipeline served with its files stored under `data` (a server's data dir)."""
    async with serve_deploy(make_deploy("synthetic", server={"api_keys": [KEY]}), KEY, data) as srv:
        yield srv


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
async def srv(data: Path) -> AsyncIterator[Server]:
    async with serve_files(data) as s:
        yield s


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


async def test_a_file_is_uploaded_listed_read_and_deleted(srv: Server, data: Path) -> None:
    client = srv.client()
    png = _png()
    made = await client.files.create(file=("cat.png", png, "image/png"), purpose="vision")
    assert made.id.startswith("file-") and (made.filename, made.bytes, made.purpose) == ("cat.png", len(png), "vision")
    assert made.status == "processed" and made.expires_at is None and made.created_at <= time.time() + 1
    assert (await client.files.retrieve(made.id)).filename == "cat.png"
    assert (await client.files.content(made.id)).read() == png
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.get(f"{srv.url}/v1/files/{made.id}/content") as r:
        assert r.content_type == "image/png"
    ids = [f.id async for f in client.files.list(purpose="vision")]
    assert made.id in ids
    assert made.id not in [f.id async for f in client.files.list(purpose="batch")]
    assert (await client.files.delete(made.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await client.files.content(made.id)
    assert not list((data / "files" / "uploads").glob(made.id + "*"))  # its bytes went with it


async def test_pages_follow_creation_order_either_way(srv: Server) -> None:
    client = srv.client()
    made = [(await client.files.create(file=(f"{i}.txt", b"x" * i, "text/plain"), purpose="evals")).id
            for i in range(1, 5)]
    oldest_first = [f.id async for f in client.files.list(purpose="evals", order="asc", limit=1)]
    assert oldest_first == made  # one a page: the SDK follows `after` while has_more
    page = await client.files.list(purpose="evals", order="desc", limit=3)
    assert [f.id for f in page.data] == made[::-1][:3] and page.has_more
    rest = await client.files.list(purpose="evals", order="desc", limit=3, after=page.data[-1].id)
    assert [f.id for f in rest.data] == made[:1] and not rest.has_more


async def test_an_expired_file_is_gone_and_its_bytes_removed(srv: Server, data: Path) -> None:
    client = srv.client()
    kept = await client.files.create(file=("a.txt", b"abc", "text/plain"), purpose="user_data",
                                     expires_after={"anchor": "created_at", "seconds": 3600})
    assert kept.expires_at == kept.created_at + 3600
    store = Store(data)  # another connection to the server's database, as a second process would have
    try:
        old = FileStore(store).add("old.txt", "user_data", b"old", expires_after_s=3600, now=int(time.time()) - 4000)
    finally:
        store.close()
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(old.id)
    assert old.id not in [f.id async for f in client.files.list()]
    assert not (data / "files" / "uploads" / old.id).exists()
    assert (await client.files.retrieve(kept.id)).id == kept.id


async def test_files_survive_a_restart_and_a_crash_s_leftovers_do_not(srv: Server, data: Path) -> None:
    made = await srv.client().files.create(file=("keep.bin", b"\x00\x01\x02", "application/octet-stream"),
                                           purpose="assistants")
    uploads = data / "files" / "uploads"
    old, young = uploads / "file-0ld0rphan", uploads / "file-y0ungupl0ad"  # bytes whose row never came
    for path in (old, young):
        path.write_bytes(b"partial")
    aged = time.time() - ORPHAN_AGE_S - 60
    os.utime(old, (aged, aged))
    async with serve_files(data) as again:
        client = again.client()
        assert not old.exists() and young.exists()  # another process's upload may sit between its writes
        assert (await client.files.retrieve(made.id)).filename == "keep.bin"
        assert (await client.files.content(made.id)).read() == b"\x00\x01\x02"
        assert (await client.files.delete(made.id)).deleted


@pytest.mark.parametrize(("form", "param"), [
    pytest.param({"purpose": "vision"}, "file", id="no-file"),
    pytest.param({"purpose": "pictures", "file": b"x"}, "purpose", id="unknown-purpose"),
    pytest.param({"file": b"x"}, "purpose", id="no-purpose"),
    pytest.param({"purpose": "vision", "file": b"x", "expires_after[anchor]": "created_at",
                  "expires_after[seconds]": "10"}, "expires_after.seconds", id="expiry-too-soon"),
    pytest.param({"purpose": "vision", "file": b"x", "expires_after[anchor]": "last_active_at",
                  "expires_after[seconds]": "3600"}, "expires_after.anchor", id="expiry-anchor"),
    pytest.param({"purpose": "vision", "file": b"x", "colour": "red"}, "colour", id="unknown-field"),
])  # fmt: skip
async def test_bad_uploads_are_400s_naming_the_field(srv: Server, form: dict, param: str) -> None:
    body = aiohttp.FormData(default_to_multipart=True)
    for name, value in form.items():
        if isinstance(value, bytes):
            body.add_field(name, value, filename="f.bin")
        else:
            body.add_field(name, value)
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(srv.url + "/v1/files", data=body) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == param


@pytest.mark.parametrize(("query", "param"), [
    pytest.param("limit=0", "limit", id="limit-0"),
    pytest.param("limit=x", "limit", id="limit-nan"),
    pytest.param("order=up", "order", id="order"),
])
async def test_bad_list_queries_are_400s(srv: Server, query: str, param: str) -> None:
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.get(f"{srv.url}/v1/files?{query}") as r:
        assert r.status == 400 and (await r.json())["error"]["param"] == param


async def test_a_json_upload_is_a_415_and_an_unknown_id_a_404(srv: Server) -> None:
    async with aiohttp.ClientSession(headers=srv.headers) as s:
        async with s.post(srv.url + "/v1/files", json={"purpose": "vision"}) as r:
            assert r.status == 415
        async with s.delete(srv.url + "/v1/files/file-nothere") as r:
            assert r.status == 404 and (await r.json())["error"]["param"] == "file_id"


async def test_a_response_reads_an_image_by_file_id(srv: Server) -> None:
    client = srv.client()
    image = await client.files.create(file=("cat.png", _png(), "image/png"), purpose="vision")
    text = await client.files.create(file=("notes.txt", b"not an image", "text/plain"), purpose="vision")

    def ask(file_id: str):
        return client.responses.create(model="synthetic", max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "what is this"}, {"type": "input_image", "file_id": file_id}]}])

    answer = await ask(image.id)
    assert answer.status == "completed" and answer.output_text == "what is"
    with pytest.raises(openai.BadRequestError) as bad:  # its bytes were read and are no image
        await ask(text.id)
    assert bad.value.body["param"].startswith("input[0].content[1]") and "image" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as missing:
        await ask("file-nothere")
    assert missing.value.body["param"] == "input[0].content[1].file_id"


def _wav() -> bytes:
    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(1600, np.float32), 16000, format="WAV")
    return buf.getvalue()


async def test_a_chat_reads_an_uploaded_image_or_audio_as_a_file_part(srv: Server) -> None:
    client = srv.client()
    image = await client.files.create(file=("cat.png", _png(), "image/png"), purpose="vision")
    audio = await client.files.create(file=("hum.wav", _wav(), "audio/wav"), purpose="user_data")
    text = await client.files.create(file=("notes.txt", b"not an image", "text/plain"), purpose="user_data")

    def ask(file: dict):
        return client.chat.completions.create(model="synthetic", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "file", "file": file}]}])

    inline = "data:image/png;base64," + base64.b64encode(_png()).decode()
    for file in ({"file_id": image.id}, {"file_id": audio.id}, {"file_data": inline, "filename": "cat.png"}):
        answer = await ask(file)
        assert answer.choices[0].message.content == "what is", file
    for file, param in (({"file_id": text.id}, "messages[0].content[1].file"),  # read, and neither kind
                        ({"file_id": "file-nothere"}, "messages[0].content[1].file.file_id"),
                        ({"filename": "x.png"}, "messages[0].content[1].file")):
        with pytest.raises(openai.BadRequestError) as bad:
            await ask(file)
        assert bad.value.body["param"] == param, bad.value.body


async def test_a_response_reads_an_input_file_by_id_or_inline(srv: Server) -> None:
    """Responses' `input_file`: an upload's file_id or inline file_data, image or audio alike; a
    file_url, a text file and an unknown id are 400s naming the part's own fields."""
    client = srv.client()
    image = await client.files.create(file=("cat.png", _png(), "image/png"), purpose="user_data")
    audio = await client.files.create(file=("hum.wav", _wav(), "audio/wav"), purpose="user_data")
    text = await client.files.create(file=("notes.txt", b"not an image", "text/plain"), purpose="user_data")

    def ask(part: dict):
        return client.responses.create(model="synthetic", max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "what is this"}, {"type": "input_file", **part}]}])

    inline = "data:audio/wav;base64," + base64.b64encode(_wav()).decode()
    for part in ({"file_id": image.id}, {"file_id": audio.id}, {"file_data": inline, "filename": "hum.wav"}):
        answer = await ask(part)
        assert answer.status == "completed" and answer.output_text == "what is", part
    for part, param in (({"file_id": text.id}, "input[0].content[1]"),  # read, and neither kind
                        ({"file_id": "file-nothere"}, "input[0].content[1].file_id"),
                        ({"file_url": "https://example.com/a.png"}, "input[0].content[1].file_url"),
                        ({"filename": "x.png"}, "input[0].content[1]")):
        with pytest.raises(openai.BadRequestError) as bad:
            await ask(part)
        assert bad.value.body["param"] == param, bad.value.body


async def test_deleting_each_page_as_it_is_read_deletes_every_file(srv: Server) -> None:
    client = srv.client()
    made = [(await client.files.create(file=(f"{i}.jsonl", b"{}", "application/jsonl"), purpose="fine-tune")).id
            for i in range(5)]
    gone = []
    async for f in client.files.list(purpose="fine-tune", limit=2):  # the next page is `after` a deleted file
        gone.append((await client.files.delete(f.id)).id)
    assert gone == made[::-1]
    assert [f.id async for f in client.files.list(purpose="fine-tune")] == []


async def test_a_file_s_content_is_a_download_never_a_page(srv: Server) -> None:
    made = await srv.client().files.create(file=('x"\r\nSet-Cookie: a=b.html', b"<script>alert(1)</script>",
                                                 "text/html"), purpose="user_data")
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.get(f"{srv.url}/v1/files/{made.id}/content") as r:
        assert r.status == 200 and await r.read() == b"<script>alert(1)</script>"
        assert r.headers["Content-Disposition"].startswith("attachment; filename*=UTF-8''")
        assert r.headers["X-Content-Type-Options"] == "nosniff" and "Set-Cookie" not in r.headers


async def test_an_upload_that_is_no_image_is_a_400_naming_the_file_id_that_sent_it(srv: Server) -> None:
    client = srv.client()
    text = await client.files.create(file=("notes.txt", b"not an image", "text/plain"), purpose="vision")
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="synthetic", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"}, {"type": "input_image", "file_id": text.id}]}])
    assert bad.value.body["param"] == "input[0].content[1].file_id", bad.value.body
    assert bad.value.body["code"] == "invalid_image"


async def test_a_list_after_an_unknown_id_is_a_400_and_after_a_deleted_one_goes_on(srv: Server, data: Path) -> None:
    """`after` as /v1/videos and the voice consents take it: a deleted file's id places the page, even once
    its tombstone is older than TOMBSTONE_S (and a newer upload never lands on its place); an id that never
    was is a 400 naming `after`, not an empty page."""
    client = srv.client()
    a, b, c = [(await client.files.create(file=(f"{i}.jsonl", b"{}", "application/jsonl"), purpose="batch")).id
               for i in range(3)]
    await client.files.delete(a)
    store = Store(data)  # c deleted a day and more ago: its row is dropped by the next listing
    try:
        assert FileStore(store).delete(c, now=int(time.time()) - TOMBSTONE_S - 60)
    finally:
        store.close()
    assert [f.id async for f in client.files.list(purpose="batch")] == [b]
    e = (await client.files.create(file=("e.jsonl", b"{}", "application/jsonl"), purpose="batch")).id
    assert [f.id for f in (await client.files.list(purpose="batch", order="asc", after=a)).data] == [b, e]
    assert [f.id for f in (await client.files.list(purpose="batch", order="asc", after=c)).data] == [e]
    assert [f.id for f in (await client.files.list(purpose="batch", order="desc", after=c)).data] == [b]
    with pytest.raises(openai.BadRequestError) as bad:
        await client.files.list(after="file-nothere")
    assert bad.value.body["param"] == "after" and "file-nothere" in bad.value.body["message"]


async def test_a_list_of_a_purpose_no_file_can_have_is_a_400_naming_it(srv: Server) -> None:
    """`purpose` takes any purpose an OpenAI file may carry (FileObject's, the upload ones among them);
    a typo is a 400 listing them, not an empty page."""
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as bad:
        await client.files.list(purpose="fine_tune")
    assert bad.value.body["param"] == "purpose"
    assert all(p in bad.value.body["message"] for p in ("fine-tune", "batch_output", "evals"))
    assert (await client.files.list(purpose="fine-tune-results")).data == []  # OpenAI's own; none here


async def test_reading_files_answers_while_another_process_holds_the_write_lock(srv: Server, data: Path) -> None:
    """A listing writes only when a file expired or a tombstone aged out, so another process's long write
    (another server on the same data dir) never makes a GET wait on it or fail with `database is locked`."""
    client = srv.client()
    made = await client.files.create(file=("w.txt", b"w", "text/plain"), purpose="assistants")
    assert made.id in [f.id async for f in client.files.list(purpose="assistants")]  # (any purge done)
    other = sqlite3.connect(data / DB_NAME, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert made.id in [f.id async for f in client.files.list(purpose="assistants")]
        assert (await client.files.retrieve(made.id)).id == made.id
        assert (await client.files.content(made.id)).read() == b"w"
        other.execute("ROLLBACK")
    finally:
        other.close()
