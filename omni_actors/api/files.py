"""Uploaded files, OpenAI's Files API as the SDK calls it, and their use by id in requests.

    POST   /v1/files                   multipart: file, purpose, [expires_after[anchor]
                                       "created_at", expires_after[seconds] 3600-2592000]
    GET    /v1/files                   ?purpose=&after=&limit= (1-10000, default 10000)&order= (desc)
    GET    /v1/files/{file_id}
    GET    /v1/files/{file_id}/content the bytes as uploaded, as an attachment (a browser saves them)
    DELETE /v1/files/{file_id}

A file is kept as uploaded (file_store.py: SQLite rows, bytes beside them) and survives a
restart; one with `expires_after` is gone once it expires. What reads files by id:
`input_reference: {"file_id"}` on /v1/videos and /v1/videos/edits, `input_image`
parts' `file_id` in /v1/responses and `file` parts in /v1/chat/completions (`file_bytes`,
for those routes). Nothing here looks
inside a file: a request that uses one as an image decodes it there, a 400 naming that
request's field if it is not one.
"""

from __future__ import annotations

import mimetypes
from typing import Literal
from urllib.parse import quote

import msgspec
from aiohttp import web
from msgspec import Struct

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.file_store import FileStore, StoredFile
from omni_actors.api.multipart import read_form
from omni_actors.api.paging import newest_first, page_limit

FILES_KEY = web.AppKey("file_store", FileStore)
"""The app's file store (set by tests to a private data dir; else the process's store)."""
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
"""OpenAI's purposes: each is accepted and kept; only what a request reads by id matters here."""
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


def file_store(app: web.Application) -> FileStore:
    """The app's store if it was given one, else the process's (opened on first use)."""
    given = app.get(FILES_KEY)
    if given is not None:
        return given
    if not _DEFAULT:
        _DEFAULT.append(FileStore())
    return _DEFAULT[0]


async def file_bytes(request: web.Request, file_id: str, param: str) -> bytes:
    """The bytes of file `file_id` for a request that names it in `param`; a 400 naming `param` if
    there is no such file (OpenAI answers a missing file in a request body that way)."""
    got = await off_loop(file_store(request.app).content, file_id) if file_id.startswith("file-") else None
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
    expiry = _expiry(fields)
    made = await off_loop(file_store(request.app).add, filename, purpose, blobs["file"], expiry)
    return _json(_object(made))


async def list_files(request: web.Request) -> web.Response:
    q = request.query
    limit, newest = page_limit(q, DEFAULT_PAGE, MAX_PAGE), newest_first(q)
    page, more = file_store(request.app).page(q.get("purpose") or None, q.get("after") or None, limit, newest)
    data = [_object(f) for f in page]
    return _json(FilePage(data, more, data[0].id if data else None, data[-1].id if data else None))


async def get_file(request: web.Request) -> web.Response:
    fid = request.match_info["file_id"]
    found = file_store(request.app).get(fid)
    if found is None:
        raise _missing(fid)
    return _json(_object(found))


async def file_content(request: web.Request) -> web.Response:
    fid = request.match_info["file_id"]
    got = await off_loop(file_store(request.app).content, fid)
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
    if not await off_loop(file_store(request.app).delete, fid):
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
