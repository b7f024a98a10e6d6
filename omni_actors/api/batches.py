"""The Batch API, /v1/batches, as the openai SDK's `client.batches` calls it.

    POST /v1/batches                    {input_file_id, endpoint, completion_window: "24h", metadata?,
                                        output_expires_after?: {anchor: "created_at", seconds 3600-2592000}}
    GET  /v1/batches                    ?after=&limit= (1-100, default 20), newest first
    GET  /v1/batches/{batch_id}
    POST /v1/batches/{batch_id}/cancel  -> `cancelling`, then `cancelled` with the results so far

The input file is an upload of purpose `batch` (files.py): one JSONL request a line, read and checked
when the batch is created (batches_input.py); a file with bad lines makes a `failed` batch whose
`errors` name each line, as OpenAI's does. `endpoint` is one of OpenAI's batch endpoints that this
server serves with a JSON body (ENDPOINTS; /v1/completions once its route is served). Each line then
runs through that route of this server (batches_runner.py), and the batch's `output_file_id` and
`error_file_id` name uploads of purpose `batch_output` (read with `client.files.content`). Batches
live in the data directory's SQLite store (batches_store.py): a restarted server carries on with
the lines not yet answered, and ends a batch whose end was cut short with the same two files
(batches_output.py).
"""

from __future__ import annotations

import secrets
import time

import msgspec
from aiohttp import web

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.batches_input import read_input
from omni_actors.api.batches_runner import BatchRunner
from omni_actors.api.batches_schemas import (
    Batch,
    BatchCreate,
    BatchErrors,
    BatchPage,
    RequestCounts,
)
from omni_actors.api.batches_store import UNFINISHED, BatchStore
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.file_store import FileStore
from omni_actors.api.files import FILES_KEY, MAX_EXPIRY_S, MIN_EXPIRY_S, stored
from omni_actors.api.not_served import not_served
from omni_actors.api.paging import page_limit
from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.api.schemas import read_body
from omni_actors.settings import settings
from omni_actors.store import DB_NAME

RUNNER_KEY = web.AppKey("batch_runner", BatchRunner)
ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/moderations",
             "/v1/images/generations")
"""OpenAI's batch endpoints that take a JSON body (its others, /v1/images/edits and /v1/videos, take
uploads); a batch may name one only where this server serves it."""
COMPLETION_WINDOW_S = 24 * 3600
DEFAULT_PAGE, MAX_PAGE = 20, 100
CANCELLABLE = ("validating", "in_progress")


def _json(body: msgspec.Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _missing(bid: str) -> ApiError:
    return ApiError(404, f"batch {bid!r} does not exist", "batch_id", "not_found")


def served(app: web.Application, path: str) -> bool:
    """Whether the app answers POST `path` with a route of its own (not a not_served 404)."""
    return any(r.method == "POST" and r.resource is not None and r.resource.canonical == path
               and r.handler is not not_served for r in app.router.routes())


async def create_batch(request: web.Request) -> web.Response:
    req = await read_body(request, BatchCreate)
    assert isinstance(req, BatchCreate)
    app = request.app
    if req.endpoint not in ENDPOINTS:
        raise bad_request(f"endpoint {req.endpoint!r} is not a batch endpoint; one of {list(ENDPOINTS)}", "endpoint")
    if not served(app, req.endpoint):
        raise bad_request(f"endpoint {req.endpoint!r}: this server does not serve POST {req.endpoint}", "endpoint",
                          "unsupported_endpoint")
    expiry = req.output_expires_after.seconds if req.output_expires_after else None
    if expiry is not None and not MIN_EXPIRY_S <= expiry <= MAX_EXPIRY_S:
        raise bad_request(f"output_expires_after.seconds must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}",
                          "output_expires_after.seconds")
    fid = req.input_file_id
    got = await stored(app, FileStore.content, fid) if fid.startswith("file-") else None
    if got is None:
        raise bad_request(f"input_file_id: file {fid!r} does not exist (upload it with POST /v1/files, purpose "
                          "`batch`)", "input_file_id", "file_not_found")
    if got[0].purpose != "batch":
        raise bad_request(f"input_file_id: file {fid!r} has purpose {got[0].purpose!r}; a batch's input is uploaded "
                          "with purpose `batch`", "input_file_id")
    read = await off_loop(read_input, got[1], req.endpoint, set(app[PIPELINES_KEY].by_name))
    now = int(time.time())
    batch = Batch(f"batch_{secrets.token_hex(12)}", req.endpoint, fid, req.completion_window, "validating", now,
                  now + COMPLETION_WINDOW_S, RequestCounts(total=len(read.lines)), read.model, req.metadata)
    if read.errors:
        batch = msgspec.structs.replace(batch, status="failed", failed_at=now, errors=BatchErrors(read.errors),
                                        request_counts=RequestCounts(total=0))
    runner = app[RUNNER_KEY]
    store = await runner.batch_store()
    await off_loop(store.add, batch, [] if read.errors else read.lines, expiry)
    if batch.status == "validating" and not runner.closing:
        runner.start(batch.id)
    return _json(batch)


async def list_batches(request: web.Request) -> web.Response:
    q = request.query
    limit, after = page_limit(q, DEFAULT_PAGE, MAX_PAGE), q.get("after") or None
    store = await request.app[RUNNER_KEY].batch_store()
    try:
        page, more = await off_loop(store.page, after, limit)
    except KeyError:
        raise bad_request(f"after: no batch with id {after!r}", "after") from None
    return _json(BatchPage(page, more, page[0].id if page else None, page[-1].id if page else None))


async def _found(request: web.Request) -> tuple[BatchRunner, BatchStore, Batch]:
    """The runner, the store and the batch the path names (a 404 if none has its id)."""
    bid = request.match_info["batch_id"]
    runner = request.app[RUNNER_KEY]
    store = await runner.batch_store()
    if (batch := await off_loop(store.get, bid)) is None:
        raise _missing(bid)
    return runner, store, batch


async def get_batch(request: web.Request) -> web.Response:
    runner, store, batch = await _found(request)
    bid = batch.id
    if batch.status in UNFINISHED:  # one a gone server left: carried on here
        await runner.adopt(bid, await off_loop(store.owner, bid))
    return _json(batch)


async def cancel_batch(request: web.Request) -> web.Response:
    runner, store, batch = await _found(request)
    bid = batch.id
    if batch.status in CANCELLABLE:
        cancelling = msgspec.structs.replace(batch, status="cancelling", cancelling_at=int(time.time()))
        if await off_loop(store.move, cancelling, CANCELLABLE):
            runner.cancel(bid)
            await runner.adopt(bid, await off_loop(store.owner, bid))  # (no server runs it: this one ends it)
            return _json(cancelling)
        batch = await off_loop(store.get, bid) or batch  # it moved on meanwhile
    if batch.status in ("cancelling", "cancelled"):
        return _json(batch)
    raise ApiError(409, f"batch {bid!r} is {batch.status}: only a validating or in-progress batch can be cancelled",
                   "batch_id", "batch_not_cancellable")


def add_routes(app: web.Application) -> None:
    """Every batch route (one line in app.py), and the runner's start-up (unfinished batches taken up) and
    shutdown (lines in flight put down for the next server)."""
    runner = app[RUNNER_KEY] = BatchRunner(app)

    async def start(app: web.Application) -> None:
        # (a server given no data directory of its own, as some tests build, opens none that does not exist)
        if FILES_KEY in app or (settings().state_dir / DB_NAME).exists():
            await runner.resume()

    async def stop(_app: web.Application) -> None:
        await runner.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    r = app.router
    r.add_post("/v1/batches", create_batch)
    r.add_get("/v1/batches", list_batches)
    r.add_get("/v1/batches/{batch_id}", get_batch)
    r.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
