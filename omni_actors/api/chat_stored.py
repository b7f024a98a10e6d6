"""Stored chat completions: what `store: true` keeps, and OpenAI's routes that read, update and delete it.

    GET    /v1/chat/completions                          list (?after, limit 1-100 (20), order asc|desc (asc),
                                                         model, metadata[key]=value)
    GET    /v1/chat/completions/{completion_id}          one (with its `metadata`)
    POST   /v1/chat/completions/{completion_id}          {"metadata": {...} | null}: replace its metadata
    DELETE /v1/chat/completions/{completion_id}          {id, object "chat.completion.deleted", deleted}
    GET    /v1/chat/completions/{completion_id}/messages its request messages (?after, limit, order)

A completion is kept (chat_store.py, SQLite in the data directory: it survives a restart) when its
request said `store: true` (OpenAI's default is false) and it finished: a failed or aborted one,
streamed or not, is not. A streamed one is kept as the whole completion its chunks made. An audio
answer keeps its id and transcript, not its audio (`data` is ""); a request message keeps its text
and image parts, an audio part its format only and a file part its `file_id` and `filename` (no
bytes). Messages have ids `<completion id>-<index>`; a part list's text parts joined are its `content`,
the parts `content_parts`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec
from aiohttp import web
from msgspec import Struct

from omni_actors.api.chat_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    FilePart,
    InputAudioPart,
    TextPart,
)
from omni_actors.api.chat_store import ChatStore
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.paging import in_memory_page, newest_first, page_limit
from omni_actors.api.schemas import MAX_METADATA, Metadata, RequestStruct, read_body

ROUTE = "/v1/chat/completions"
DEFAULT_PAGE, MAX_PAGE = 20, 100
CHAT_STORE_KEY = web.AppKey("chat_store", ChatStore)


class StoredChatCompletion(ChatCompletion):
    """A stored completion as it is read back: the answer, with the metadata it was stored (or updated) with."""

    metadata: dict[str, str] = {}


class ChatCompletionList(Struct):
    data: list[StoredChatCompletion]
    first_id: str | None
    last_id: str | None
    has_more: bool = False
    object: Literal["list"] = "list"


class ChatMessageList(Struct):
    data: list[dict[str, Any]]
    """Each {id, role, content, name, content_parts, and the message's tool_calls, tool_call_id, refusal, audio}."""
    first_id: str | None
    last_id: str | None
    has_more: bool = False
    object: Literal["list"] = "list"


class ChatCompletionDeleted(Struct):
    id: str
    object: Literal["chat.completion.deleted"] = "chat.completion.deleted"
    deleted: bool = True


class ChatCompletionUpdate(RequestStruct):
    metadata: Metadata | None
    """The completion's new metadata, replacing its old (null: none)."""


def chat_store(app: web.Application) -> ChatStore:
    """The app's store if it was given one; else the database its stored responses use (one data
    directory holds both); else the process's (the data directory's, store.py)."""
    from omni_actors.api.responses import (
        RESPONSES_KEY,  # (here: responses.py imports chat.py, which imports this)
    )

    if (given := app.get(CHAT_STORE_KEY)) is not None:
        return given
    responses = app.get(RESPONSES_KEY)
    return ChatStore(responses.store if responses is not None else None)


def keeper(request: web.Request, req: ChatCompletionRequest) -> Callable[[ChatCompletion], None] | None:
    """What stores the request's finished completion (None: `store` is not true, so nothing is kept)."""
    if not req.store:
        return None
    store, metadata = chat_store(request.app), dict(req.metadata or {})

    def keep(completion: ChatCompletion) -> None:
        store.add(completion.id, completion.created, completion.model, metadata, _without_audio(completion),
                  [_message(f"{completion.id}-{i}", m) for i, m in enumerate(req.messages)])

    return keep


def _without_audio(completion: ChatCompletion) -> dict[str, Any]:
    body = msgspec.to_builtins(completion)
    for choice in body["choices"]:
        if (audio := choice["message"].get("audio")) is not None:
            audio["data"] = ""
    return body


def _message(mid: str, m: ChatMessage) -> dict[str, Any]:
    """A request message as the messages list gives it (no audio or file bytes)."""
    content, parts = m.content, None
    if isinstance(m.content, list):
        parts = [_part(p) for p in m.content]
        texts = [p.text for p in m.content if isinstance(p, TextPart)]
        content = "\n".join(texts) if texts else None
    out: dict[str, Any] = {"id": mid, "role": m.role, "content": content, "name": m.name, "content_parts": parts}
    sent = msgspec.to_builtins(m)  # (the fields the client sent)
    out.update({k: sent[k] for k in ("tool_call_id", "refusal") if k in sent})
    if m.tool_calls is not None:  # (each with its `type`, a default the request struct omits when encoded)
        out["tool_calls"] = [{"id": t.id, "type": t.type, "function": msgspec.to_builtins(t.function)}
                             for t in m.tool_calls]
    if m.audio is not None:
        out["audio"] = {"id": m.audio.id}
    return out


def _part(part: Any) -> dict[str, Any]:
    match part:
        case InputAudioPart(input_audio=audio):
            return {"type": "input_audio", "input_audio": {"format": audio.format}}
        case FilePart(file=ref):
            return {"type": "file", "file": msgspec.to_builtins(msgspec.structs.replace(ref, file_data=None))}
    return msgspec.to_builtins(part)


def _not_stored(cid: str) -> ApiError:
    return ApiError(404, f"chat completion {cid!r} is not stored here (only one created with store=true is)",
                    None, "not_found")  # (param null: a path's id, as an unknown route's 404 names none)


def _order(query: Mapping[str, str]) -> bool:
    """Newest first? `order` "asc" (the default, as OpenAI's for these lists) or "desc"; a 400 otherwise."""
    return newest_first({"order": query.get("order", "asc")})


def _metadata_filter(query: Mapping[str, str]) -> dict[str, str]:
    """`metadata[key]=value` pairs (how the SDK writes `metadata={...}` in a query)."""
    pairs = {k[len("metadata["):-1]: v for k, v in query.items() if k.startswith("metadata[") and k.endswith("]")}
    if len(pairs) > MAX_METADATA:
        raise bad_request(f"metadata: at most {MAX_METADATA} pairs to filter by", "metadata")
    return pairs


async def list_completions(request: web.Request) -> web.Response:
    q = request.query
    limit, desc = page_limit(q, DEFAULT_PAGE, MAX_PAGE), _order(q)
    after = q.get("after") or None
    try:
        bodies, more = chat_store(request.app).page(after, limit, desc, q.get("model") or None, _metadata_filter(q))
    except KeyError:
        raise bad_request(f"after {after!r} is not a stored chat completion", "after") from None
    page = [msgspec.json.decode(b, type=StoredChatCompletion) for b in bodies]
    body = ChatCompletionList(page, page[0].id if page else None, page[-1].id if page else None, more)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def get_completion(request: web.Request) -> web.Response:
    cid = request.match_info["completion_id"]
    if (body := chat_store(request.app).body(cid)) is None:
        raise _not_stored(cid)
    return web.Response(body=body, content_type="application/json")


async def update_completion(request: web.Request) -> web.Response:
    cid = request.match_info["completion_id"]
    update = await read_body(request, ChatCompletionUpdate)
    if (body := chat_store(request.app).set_metadata(cid, update.metadata or {})) is None:
        raise _not_stored(cid)
    return web.Response(body=body, content_type="application/json")


async def delete_completion(request: web.Request) -> web.Response:
    cid = request.match_info["completion_id"]
    if not chat_store(request.app).delete(cid):
        raise _not_stored(cid)
    return web.Response(body=msgspec.json.encode(ChatCompletionDeleted(cid)), content_type="application/json")


async def list_messages(request: web.Request) -> web.Response:
    cid = request.match_info["completion_id"]
    if (messages := chat_store(request.app).messages(cid)) is None:
        raise _not_stored(cid)
    q = request.query
    page, first, last, more = in_memory_page(messages, q, _order(q), DEFAULT_PAGE, MAX_PAGE,
                                             "a message of this chat completion")
    body = ChatMessageList(page, first, last, has_more=more)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get(ROUTE, list_completions)
    r.add_get(ROUTE + "/{completion_id}", get_completion)
    r.add_post(ROUTE + "/{completion_id}", update_completion)
    r.add_delete(ROUTE + "/{completion_id}", delete_completion)
    r.add_get(ROUTE + "/{completion_id}/messages", list_messages)
