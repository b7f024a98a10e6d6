"""Uploaded files, OpenAI's Files API as the SDK calls it, and their use by id in requests.

    POST   /v1/files                   multipart: file, purpose, [expires_after[anchor]
                                       "created_at", expires_after[seconds] 3600-2592000]
    GET    /v1/files                   ?purpose=&after=&limit= (1-10000, default 10000)&order= (desc);
                                       a 400 naming `after` for an id no file ever had (a deleted
                                       file's id places the page), or `purpose` for one no file can have
    GET    /v1/files/{file_id}
    GET    /v1/files/{file_id}/content the bytes as uploaded, as an attachment (a browser saves them)
    DELETE /v1/files/{file_id}

A file is kept as uploaded (file_store.py: SQLite rows, bytes beside them) and survives a
restart; one with `expires_after` is gone once it expires. Every store call runs in a thread
(`off_loop`): it reads files' bytes, and a listing or an upload that finds files expired writes
(and may wait on another process's write lock). What reads files by id:
`input_reference: {"file_id"}` on /v1/videos and /v1/videos/edits, `input_image`
parts' `file_id` in /v1/responses and `file` parts in /v1/chat/completions (`file_bytes`,
for those routes). Nothing here looks
inside a file: a request that uses one as an image decodes it there, a 400 naming that
request's field if it is not one.
"""

from __future__ import annotations

import mimetypes
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import msgspec
from aiohttp import web
from msgspec import Struct

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.file_store import FileStore, StoredFile
from omni_actors.api.multipart import is_utf8, read_form
from omni_actors.api.paging import newest_first, page_limit

FILES_KEY = web.AppKey("file_store", FileStore)
"""The app's file store (set by tests to a private data dir; else the process's store)."""
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
"""OpenAI's purposes: each is accepted and kept; only what a request reads by id matters here."""
LISTED_PURPOSES = (*PURPOSES, "assistants_output", "batch_output", "fine-tune-results")
"""What a listing's `purpose` may name: the SDK types it `str`, but an OpenAI file carries one of these
(its FileObject's purposes and the upload ones), so anything else is a typo, answered as a 400 rather
than as an empty page; those no upload here takes list nothing."""
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000
"""`expires_after[seconds]` bounds (an hour to 30 days, as OpenAI's)."""
MAX_FILENAME_CHARS = 512
DEFAULT_PAGE = MAX_PAGE = 10_000


class FileObject(Struct):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int | None = None
    status: Literal["processed"] = "processed"
    object: Literal["file"] = "file"


class FilePage(Struct):
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"


class FileDeleted(Struct):
    id: str
    deleted: bool = True
    object: Literal["file"] = "file"


_DEFAULT: list[FileStore] = []
_DEFAULT_LOCK = threading.Lock()
T = TypeVar("T")


def file_store(app: web.Application) -> FileStore:
    """The app's store if it was given one, else the process's (opened on first use); blocking."""
    given = app.get(FILES_KEY)
    if given is not None:
        return given
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(FileStore())
    return _DEFAULT[0]


async def stored(app: web.Application, method: Callable[..., T], *args: Any) -> T:
    """`method` (a FileStore method) of the app's store, run in a thread, as is opening the store."""
    return await off_loop(lambda: method(file_store(app), *args))


async def file_bytes(request: web.Request, file_id: str, param: str) -> bytes:
    """The bytes of file `file_id` for a request that names it in `param`; a 400 naming `param` if
    there is no such file (OpenAI answers a missing file in a request body that way)."""
    got = await stored(request.app, FileStore.content, file_id) if file_id.startswith("file-") else None
    if got is None:
        raise bad_request(f"{param}: file {file_id!r} does not exist (upload it with POST /v1/files)", param,
                          "file_not_found")
    return got[1]


def _json(body: Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _object(f: StoredFile) -> FileObject:
    return FileObject(f.id, f.bytes, f.created_at, f.filename, f.purpose, f.expires_at)


def _missing(fid: str) -> ApiError:
    return ApiError(404, f"file {fid!r} does not exist", "file_id", "not_found")


def _expiry(fields: dict[str, str]) -> int | None:
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise bad_request("expires_after.anchor must be `created_at`", "expires_after.anchor")
    try:
        value = int(seconds or "")
    except ValueError:
        value = 0
    if not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise bad_request(f"expires_after.seconds must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}",
                          "expires_after.seconds")
    return value


async def create_file(request: web.Request) -> web.Response:
    names: dict[str, str] = {}
    fields, blobs = await read_form(request, {"file"}, {"purpose", "expires_after[anchor]",
                                                        "expires_after[seconds]"}, names)
    if "file" not in blobs:
        raise bad_request("form field `file` is required", "file", "missing_required_parameter")
    purpose = fields.get("purpose", "")
    if purpose not in PURPOSES:
        raise bad_request(f"purpose {purpose!r} is not one of {list(PURPOSES)}", "purpose",
                          "missing_required_parameter" if not purpose else "invalid_value")
    filename = names.get("file") or "upload"
    if len(filename) > MAX_FILENAME_CHARS:
        raise bad_request(f"the file's name is longer than {MAX_FILENAME_CHARS} characters", "file")
    if not is_utf8(filename):  # (its bytes that are not are kept as lone surrogates, which no store can keep)
        raise bad_request(f"the file's name is not valid UTF-8: {ascii(filename)[:80]}", "file")
    expiry = _expiry(fields)
    made = await stored(request.app, FileStore.add, filename, purpose, blobs["file"], expiry)
    return _json(_object(made))


async def list_files(request: web.Request) -> web.Response:
    q = request.query
    limit, newest = page_limit(q, DEFAULT_PAGE, MAX_PAGE), newest_first(q)
    purpose, after = q.get("purpose") or None, q.get("after") or None
    if purpose is not None and purpose not in LISTED_PURPOSES:
        raise bad_request(f"purpose {purpose!r} is not one of {list(LISTED_PURPOSES)}", "purpose")
    try:
        page, more = await stored(request.app, FileStore.page, purpose, after, limit, newest)
    except KeyError:  # (an empty page before 2026-12-05; /v1/videos and the voice consents answer the same)
        raise bad_request(f"after: no file with id {after!r}", "after") from None
    data = [_object(f) for f in page]
    return _json(FilePage(data, more, data[0].id if data else None, data[-1].id if data else None))


async def get_file(request: web.Request) -> web.Response:
    fid = request.match_info["file_id"]
    found = await stored(request.app, FileStore.get, fid)
    if found is None:
        raise _missing(fid)
    return _json(_object(found))


async def file_content(request: web.Request) -> web.Response:
    fid = request.match_info["file_id"]
    got = await stored(request.app, FileStore.content, fid)
    if got is None:
        raise _missing(fid)
    found, data = got
    kind = mimetypes.guess_type(found.filename)[0] or "application/octet-stream"
    # A download, never a page: an uploaded .html or .svg must not run as this origin's (the playground's).
    return web.Response(body=data, content_type=kind, headers={
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(found.filename, safe='')}",
        "X-Content-Type-Options": "nosniff"})


async def delete_file(request: web.Request) -> web.Response:
    fid = request.match_info["file_id"]
    if not await stored(request.app, FileStore.delete, fid):
        raise _missing(fid)
    return _json(FileDeleted(fid))


def add_routes(app: web.Application) -> None:
    """Every file route (one line in app.py)."""
    r = app.router
    r.add_post("/v1/files", create_file)
    r.add_get("/v1/files", list_files)
    r.add_get("/v1/files/{file_id}", get_file)
    r.add_get("/v1/files/{file_id}/content", file_content)
    r.add_delete("/v1/files/{file_id}", delete_file)
