"""OpenAI's Conversations API: `client.conversations.*` and `client.conversations.items.*`, and what a response does with one.

    POST   /v1/conversations                               {items?, metadata?} -> a conversation
    GET    /v1/conversations/{id}                          the conversation (POST {metadata}: new metadata)
    DELETE /v1/conversations/{id}                          -> conversation.deleted (its items go too)
    POST   /v1/conversations/{id}/items                    {items} -> a list of the items added
    GET    /v1/conversations/{id}/items                    a page (?after, limit 1-100, order asc|desc: desc)
    GET    /v1/conversations/{id}/items/{item_id}          one item (DELETE: removed; answers the conversation)

Items are the Responses API's input items (a message, a function call, its output), read as a
response reads them (responses_inputs.read_turn, then the chat inputs they make, media and
uploads included), so a bad one is a 400 naming it (`items[2].content[0].image_url`) when it is
added, not when a response uses it; at most MAX_ITEMS_ADDED at a time. Each is stored with an id
(its own, or a new one where it has none or its conversation has it already).

`POST /v1/responses` with `conversation` ("conv_..." or {"id": ...}; `context`) runs with the
conversation's items before its input (as `previous_response_id` runs with its chain, which it
cannot be sent with) and answers `conversation: {id}`; once the response has completed (or
ended incomplete) its input items and output items are added to the conversation
(responses_answer.Answer.finish; a failed or cancelled response adds nothing). State lives in
SQLite (api/conversations_store.py), beside the stored responses.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, get_args

import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.chat_inputs import build_chat_inputs, file_ids
from omni_actors.api.chat_schemas import ChatMessage
from omni_actors.api.conversations_store import ConversationStore
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.files import file_bytes
from omni_actors.api.paging import newest_first, page_limit
from omni_actors.api.responses_inputs import image_file_ids, part_param, read_turn, renamed
from omni_actors.api.responses_schemas import Includable, InputItem, InputItemList, ResponseRequest
from omni_actors.api.responses_store import RESPONSES_KEY
from omni_actors.api.schemas import Metadata, RequestStruct, read_body
from omni_actors.api.tools import check_tool_messages

ROUTE = "/v1/conversations"
MAX_ITEMS_ADDED = 20
"""Most items one request adds (OpenAI's limit)."""
DEFAULT_PAGE, MAX_PAGE = 20, 100
INCLUDABLE = frozenset(get_args(Includable))
"""The `include` values a list of items accepts (none changes what it answers: responses_schemas.Includable)."""
Items = Annotated[list[InputItem], Meta(max_length=MAX_ITEMS_ADDED)]


class ConversationCreate(RequestStruct):
    items: Items | None = None
    metadata: Metadata | None = None


class ConversationUpdate(RequestStruct):
    metadata: Metadata | None
    """Replaces the conversation's metadata (null: none)."""


class ItemsCreate(RequestStruct):
    items: Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_ITEMS_ADDED)]


class Conversation(Struct, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class ConversationDeleted(Struct):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


def conversations(request: web.Request) -> ConversationStore:
    """The conversations of the data directory that keeps this app's responses (api/responses.py's store)."""
    given = request.app.get(RESPONSES_KEY)
    return ConversationStore(given.store if given is not None else None)


def _not_found(cid: str, param: str = "conversation_id") -> ApiError:
    return ApiError(404, f"conversation {cid!r} not found", param, "not_found")


def _json(body: Any) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _conversation(store: ConversationStore, cid: str) -> Conversation:
    found = store.get(cid)
    if found is None:
        raise _not_found(cid)
    return Conversation(id=cid, created_at=found[0], metadata=found[1])


async def checked(request: web.Request, items: list[InputItem], param: str = "items",
                  tail: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Items as stored (with ids), once read as a response reads its input (a 400 naming what it cannot),
    after `tail` (ConversationStore.tail: the function calls and outputs the conversation ends with): a
    function call's output that answers no open call, or an item while calls are still unanswered, would
    make every later response in the conversation a 400, so it is refused here."""
    req = ResponseRequest(model="", input=items)
    try:
        files = {fid: _data_url(await file_bytes(request, fid, where)) for fid, where in image_file_ids(req)}
        earlier = read_turn(ResponseRequest(model="", input=msgspec.convert(tail, list[InputItem])),
                            []).conversation if tail else []
        turn = read_turn(req, earlier, files)
        try:
            messages = msgspec.convert(turn.messages, list[ChatMessage])
        except msgspec.ValidationError as err:
            raise bad_request(f"{param} cannot be read as a conversation: {err}", param) from None
        # (the item, its call_id for a result's; a fault in the stored tail names the whole list)
        check_tool_messages(messages, lambda i, field: param if turn.where[i] < 0 else (
            f"{param}[{turn.where[i]}]" + (".call_id" if field == "tool_call_id" else "")))
        namer = part_param(turn.where, req)
        uploads = {fid: await file_bytes(request, fid, where) for fid, where in file_ids(messages, namer)}
        if any(not isinstance(m.content, str | None) for m in messages):  # (media: decoded as a response would)
            await off_loop(build_chat_inputs, messages, namer, uploads)
    except ApiError as err:
        raise renamed(err, "input[", f"{param}[") from None
    return turn.items


def _data_url(image: bytes) -> str:
    return "data:image;base64," + base64.b64encode(image).decode()


async def context(request: web.Request, req: ResponseRequest) -> tuple[str, list[dict[str, Any]]] | None:
    """A response's `conversation`: (its id, its items as chat messages, to go before the input); None
    without one. A 404 for one that is not stored here."""
    ref = req.conversation
    if ref is None:
        return None
    if isinstance(ref, dict):
        if set(ref) != {"id"} or not isinstance(ref["id"], str) or not ref["id"]:
            raise bad_request('conversation must be a conversation id or {"id": "conv_..."}', "conversation")
        ref = ref["id"]
    if not ref:  # ("" is no conversation's id: not the field left out, which is null or absent)
        raise bad_request('conversation must be a conversation id or {"id": "conv_..."}', "conversation")
    if req.previous_response_id is not None:
        raise bad_request("Mutually exclusive parameters: send one of `previous_response_id` and `conversation`",
                          "conversation", "mutually_exclusive_parameters")
    store = conversations(request)
    if store.get(ref) is None:
        raise _not_found(ref, "conversation")
    try:
        earlier = ResponseRequest(model="", input=msgspec.convert(store.items(ref), list[InputItem]))
    except msgspec.ValidationError as err:  # (stored by this module, read back: not the client's doing)
        raise ApiError(500, f"conversation {ref!r} has an item this server cannot read: {err}", "conversation",
                       "internal_error") from None
    files = {fid: _data_url(await file_bytes(request, fid, "conversation")) for fid, _ in image_file_ids(earlier)}
    return ref, read_turn(earlier, [], files).conversation


async def create_conversation(request: web.Request) -> web.Response:
    body = await read_body(request, ConversationCreate)
    store = conversations(request)
    items = await checked(request, body.items or [])
    cid, created = store.create(dict(body.metadata or {}), items)
    return _json(Conversation(id=cid, created_at=created, metadata=dict(body.metadata or {})))


async def get_conversation(request: web.Request) -> web.Response:
    return _json(_conversation(conversations(request), request.match_info["conversation_id"]))


async def update_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    body = await read_body(request, ConversationUpdate)
    store = conversations(request)
    if not store.set_metadata(cid, dict(body.metadata or {})):
        raise _not_found(cid)
    return _json(_conversation(store, cid))


async def delete_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    if not conversations(request).delete(cid):
        raise _not_found(cid)
    return _json(ConversationDeleted(cid))


def check_include_query(request: web.Request) -> None:
    """`include` (repeated, or `include[]`): each one of OpenAI's values; none changes the items answered."""
    for i, value in enumerate([*request.query.getall("include", []), *request.query.getall("include[]", [])]):
        if value not in INCLUDABLE:
            raise bad_request(f"include[{i}] must be one of {', '.join(sorted(INCLUDABLE))}", "include",
                              "invalid_value")


def _page(items: list[dict[str, Any]], has_more: bool) -> web.Response:
    return _json(InputItemList(items, items[0]["id"] if items else None, items[-1]["id"] if items else None,
                               has_more=has_more))


async def add_items(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    check_include_query(request)
    body = await read_body(request, ItemsCreate)
    store = conversations(request)
    if store.get(cid) is None:
        raise _not_found(cid)
    return _page(store.append(cid, await checked(request, body.items, tail=store.tail(cid))), False)


async def list_items(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    q = request.query
    limit = page_limit(q, DEFAULT_PAGE, MAX_PAGE)
    newest = newest_first(q)
    check_include_query(request)
    store = conversations(request)
    if store.get(cid) is None:
        raise _not_found(cid)
    try:
        items, more = store.page(cid, q.get("after") or None, limit, newest)
    except KeyError:
        raise bad_request(f"after {q['after']!r} is not an item of this conversation", "after") from None
    return _page(items, more)


async def get_item(request: web.Request) -> web.Response:
    cid, item_id = request.match_info["conversation_id"], request.match_info["item_id"]
    check_include_query(request)
    store = conversations(request)
    if store.get(cid) is None:
        raise _not_found(cid)
    if (item := store.item(cid, item_id)) is None:
        raise ApiError(404, f"item {item_id!r} not found in conversation {cid!r}", "item_id", "not_found")
    return _json(item)


async def delete_item(request: web.Request) -> web.Response:
    cid, item_id = request.match_info["conversation_id"], request.match_info["item_id"]
    store = conversations(request)
    found = _conversation(store, cid)
    if not store.delete_item(cid, item_id):
        raise ApiError(404, f"item {item_id!r} not found in conversation {cid!r}", "item_id", "not_found")
    return _json(found)


def add_routes(app: web.Application) -> None:
    """Every Conversations API route (responses.add_routes adds them)."""
    r, one, items = app.router, ROUTE + "/{conversation_id}", ROUTE + "/{conversation_id}/items"
    r.add_post(ROUTE, create_conversation)
    r.add_get(one, get_conversation)
    r.add_post(one, update_conversation)
    r.add_delete(one, delete_conversation)
    r.add_post(items, add_items)
    r.add_get(items, list_items)
    r.add_get(items + "/{item_id}", get_item)
    r.add_delete(items + "/{item_id}", delete_item)

