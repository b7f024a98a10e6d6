"""OpenAI's Responses API on any pipeline that writes text: `client.responses.create / retrieve / delete`.

    POST   /v1/responses                          a response (stream=true: `response.*` events)
    GET    /v1/responses/{id}                     a stored response
    DELETE /v1/responses/{id}
    GET    /v1/responses/{id}/input_items         its input items (?order=asc|desc, after, limit 1-100)
    POST   /v1/responses/{id}/cancel              stop a background response
    POST   /v1/responses/input_tokens, /compact   a 404 saying they are not served (api/not_served.py)

`background: true` answers `queued` at once and runs the response as a task the client polls
(api/responses_background.py); with `stream: true` too, the answer is the response's event stream,
which goes on without the client and can be read again or resumed with
`GET /v1/responses/{id}?stream=true&starting_after=N` (api/responses_events.py).

A request runs as a chat completion does (the same inputs, tools and guided decoding:
api/responses_inputs.py maps it): `input` (text or items: messages with text, image and audio
parts, earlier function calls and their outputs), `instructions`, `max_output_tokens`,
`temperature`, `top_p`, function `tools` with `tool_choice` (forced calls where the text stage
guides decoding, api/structured.py), `text.format` (json_object, json_schema), `truncation`
("auto": an input past the model's context loses its conversation's oldest items,
api/responses_truncation.py; else it is a 400, `context_length_exceeded`). The answer's
`output` is a `message` item (`output_text`) and/or `function_call` items; `status` is
"incomplete" (reason max_output_tokens) when the answer was cut short.

Stored state: with `store` (the default) the response, its input items and the conversation
so far go to SQLite (api/responses_store.py) and survive a restart; `previous_response_id`
continues that conversation (its instructions are not carried, as OpenAI does). Streamed:
`response.created`, `response.in_progress`, the output items with their
`response.output_text.delta` / `response.function_call_arguments.delta` events, then
`response.completed` (or `response.incomplete`; a run failing once the stream began: `response.failed`,
the response stored `failed` with its `error`); no `[DONE]`. A stored stream's response is stored
`in_progress` as it begins (retrievable by the id its first event gives; one its client leaves reads
`failed`, `client_disconnected`); only a background response can be cancelled. While tools are offered the text is
held until the answer is read for calls, as chat does. `max_tool_calls` keeps the answer's first
calls; the fields for features no model here has are read as chat reads them (`chat.check_unserved`;
accepted ones are echoed as OpenAI echoes them: `service_tier` "default", `reasoning.effort` null);
`prompt`, `context_management`, `logit_bias` and `moderation` are 400s naming them
(responses_inputs.NOT_SERVED). `conversation` runs the response in a conversation of the Conversations
API (api/conversations.py, whose routes add_routes adds too): its items go first, and this response's
input and output items join it once it completes. A response whose run fails once it has made output
(streamed or not) ends `failed` with its `error` and its items so far (`incomplete`), answered with 200
as OpenAI answers a model's failure; a failure before any output keeps its HTTP status.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api import conversations, sse
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.calls import drop_none, route_model
from omni_actors.api.chat import Tally, check_prewarm, check_unserved
from omni_actors.api.chat_inputs import build_chat_inputs, file_ids
from omni_actors.api.chat_schemas import ChatMessage
from omni_actors.api.errors import IN_BAND_ERROR, ApiError, bad_request, from_exception
from omni_actors.api.files import file_bytes
from omni_actors.api.paging import in_memory_page, newest_first
from omni_actors.api.responses_answer import Answer, answer_events, failure, response_error
from omni_actors.api.responses_background import RUNNING_HERE, Background, cancel_elsewhere, settled
from omni_actors.api.responses_events import replay
from omni_actors.api.responses_inputs import (
    check_include,
    check_not_served,
    check_unique_ids,
    image_file_ids,
    part_param,
    read_turn,
    renamed,
    response_format,
    stage_refusal,
)
from omni_actors.api.responses_schemas import (
    ConversationRef,
    InputItemList,
    ReasoningEcho,
    Response,
    ResponseDeleted,
    ResponseFailed,
    ResponseRequest,
)
from omni_actors.api.responses_store import RESPONSES_KEY, UNFINISHED, ResponseStore
from omni_actors.api.responses_truncation import FittingCall
from omni_actors.api.schemas import read_body
from omni_actors.api.structured import guided_params
from omni_actors.api.tools import (
    chat_shaped,
    chat_shaped_choice,
    check_tool_messages,
    check_tools,
    stage_tools,
    tools_refusal,
)
from omni_actors.errors import RequestError, RequestRejected
from omni_actors.orchestrator.outputs import TextOutput

ROUTE = "/v1/responses"
DEFAULT_PAGE, MAX_PAGE = 20, 100
BACKGROUND_KEY = web.AppKey("responses_background", Background)
LEFT = response_error("client_disconnected", "the client left the stream before the response ended; it was stopped")
"""A stored foreground response's error when its client left mid-stream (its run is aborted)."""


def _store(request: web.Request) -> ResponseStore:
    """The app's store if it was given one, else the process's (the data directory's, store.py)."""
    given = request.app.get(RESPONSES_KEY)
    return given if given is not None else ResponseStore()


async def create_response(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, ResponseRequest)
    # null reads as the field left out (OpenAI's reading): stream and background off, store on.
    req = msgspec.structs.replace(req, stream=bool(req.stream), store=req.store is not False,
                                  background=bool(req.background))
    if req.background and not req.store:
        raise bad_request("background: a background response must be stored (store: true)", "background")
    check_include(req)
    check_unique_ids(req)
    check_not_served(req)
    check_prewarm(req.prompt_cache_options)
    check_unserved(req.reasoning.effort if req.reasoning else None, req.text.verbosity if req.text else None,
                   req.top_logprobs, ("reasoning.effort", "text.verbosity", "top_logprobs"))
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    orch, model = route_model(request, req.model, {"text"})
    earlier: list[dict[str, Any]] = []
    if (joined := await conversations.context(request, req)) is not None:
        earlier = joined[1]  # (the conversation's items: its id is refused with previous_response_id)
    if req.previous_response_id is not None:
        found = _store(request).conversation(req.previous_response_id)
        if found is None:
            raise bad_request(f"previous response {req.previous_response_id!r} is not stored here",
                              "previous_response_id", "previous_response_not_found")
        settled(_store(request), req.previous_response_id, request.app[BACKGROUND_KEY])  # (a gone server's: failed)
        state = _store(request).status(req.previous_response_id)
        if state is not None and state[0] in UNFINISHED:
            raise bad_request(f"previous response {req.previous_response_id!r} is {state[0]}; continue it once "
                              "it has finished", "previous_response_id", "previous_response_unfinished")
        earlier = found
    files = {fid: "data:image;base64," + base64.b64encode(await file_bytes(request, fid, param)).decode()
             for fid, param in image_file_ids(req)}
    turn = read_turn(req, earlier, files)
    tools = None if req.tools is None else chat_shaped(req.tools)
    choice = chat_shaped_choice(req.tool_choice)
    if (refusal := tools_refusal(orch.pipeline, tools, choice, can_force=True)) is not None:
        raise bad_request(*refusal, "unsupported_parameter")
    await check_tools(tools, choice, lambda i: f"tools[{i}]")
    if isinstance(choice, dict) and not isinstance(choice.get("function"), dict):  # (chat's shape is taken too)
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                          "tool_choice")
    try:
        guided = guided_params(orch.pipeline, response_format(req), tools, choice,
                               False if req.max_tool_calls == 1 else req.parallel_tool_calls)
    except ApiError as err:
        raise renamed(renamed(err, "response_format", "text.format"), "tool_choice.function", "tool_choice")
    try:
        messages = msgspec.convert(turn.messages, list[ChatMessage])
    except msgspec.ValidationError as err:
        raise bad_request(f"input cannot be read as a conversation: {err}", "input") from None
    check_tool_messages(messages, lambda i, _: f"input[{turn.where[i]}]" if turn.where[i] >= 0 else "input")
    has_media = any(not isinstance(m.content, str | None) for m in messages)
    namer = part_param(turn.where, req, "previous_response_id" if joined is None else "conversation")
    uploads = {fid: await file_bytes(request, fid, where) for fid, where in file_ids(messages, namer)}
    inputs = (await off_loop(build_chat_inputs, messages, namer, uploads) if has_media
              else build_chat_inputs(messages, namer))
    if (shown := stage_tools(tools, choice)) is not None:
        inputs["tools"] = shown
    params = {**drop_none({"temperature": req.temperature, "top_p": req.top_p, "max_tokens": req.max_output_tokens,
                           "modalities": ["text"]}), **guided}
    base = Response(
        id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()), status="queued" if req.background else
        "in_progress", background=req.background, model=model, output=[],
        instructions=req.instructions, max_output_tokens=req.max_output_tokens, temperature=req.temperature,
        top_p=req.top_p, tools=req.tools or [], tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
        store=req.store, metadata=dict(req.metadata or {}), user=req.user, truncation=req.truncation or "disabled",
        text={"format": msgspec.to_builtins(req.text.format) if req.text and req.text.format else {"type": "text"},
              "verbosity": "medium"},
        reasoning=ReasoningEcho(summary=req.reasoning.summary) if req.reasoning else ReasoningEcho(),
        top_logprobs=req.top_logprobs or 0, max_tool_calls=req.max_tool_calls, prompt_cache_key=req.prompt_cache_key,
        prompt_cache_retention=req.prompt_cache_retention, safety_identifier=req.safety_identifier,
        conversation=None if joined is None else ConversationRef(joined[0]))
    answer = Answer(base, f"msg_{uuid.uuid4().hex[:24]}", turn.conversation,
                     turn.items if req.store else None, _store(request))
    answer.tally = Tally.of(params, req.max_tool_calls)
    answer.hold = shown is not None
    if joined is not None:  # its items and the answer's join the conversation once it completes
        answer.joins = (conversations.conversations(request), joined[0], turn.items)
    # "auto": refused for its context, the call goes again without the oldest items (never the instructions)
    keep = len(turn.messages) - len(turn.conversation) if req.truncation == "auto" else None
    if req.background:
        call = FittingCall(request.app, ROUTE, inputs, params, {"text"}, base.id, orch=orch, keep=keep)
        await call.__aenter__()  # admitted now: a full queue is the client's 429, not a failed response
        answer.store.add(base, turn.conversation, turn.items, events=b"[]" if req.stream else None)
        events = answer_events(call, answer, hold=shown is not None, queued=True) if req.stream else None
        log = request.app[BACKGROUND_KEY].start(call, answer, answer.store, events)
        if log is not None:  # the client reads the log; the response goes on if it leaves
            return await sse.respond(request, log.follow(-1), done=False, named=True)
        return web.Response(body=msgspec.json.encode(base), content_type="application/json")
    try:
        async with FittingCall(request, ROUTE, inputs, params, {"text"}, base.id, keep=keep) as call:
            if req.stream:
                await call.started()  # an error before the first output keeps its HTTP status
                events = answer_events(call, answer, hold=shown is not None)
                return await sse.respond(request, _ends_failed(request, answer, events), done=False, named=True)
            await call.started()  # an error before the first output keeps its HTTP status, as a stream's does
            try:
                async for chunk in call:
                    if isinstance(chunk.output, TextOutput):
                        answer.tally.add_text(chunk.output)
            except RequestError as err:  # failing once it made output: the response is answered (and stored)
                failed = answer.fail(failure(err, req.truncation))  # failed, as OpenAI answers a model's failure
                request[IN_BAND_ERROR] = from_exception(err).code or "none"  # (counted as a stream's is)
                return web.Response(body=msgspec.json.encode(failed), content_type="application/json")
    except RequestRejected as err:  # a stage's refusal names chat's field: say this API's
        raise stage_refusal(from_exception(err), req.truncation) from None
    return web.Response(body=msgspec.json.encode(answer.finish()), content_type="application/json")


async def _ends_failed(request: web.Request, answer: Answer,
                       events: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """A foreground stream's events; a run failing after its headers ends it with `response.failed` (the
    response stored failed, with its `error`), as OpenAI's stream ends, not with an in-band error. A stored
    response is stored `in_progress` as its stream begins (Answer.begin); one ended by its client's leaving
    reads failed (`client_disconnected`)."""
    number, rid = -1, answer.base.id
    answer.begin()
    RUNNING_HERE.add(rid)  # (its row is not taken for one a stopped server left: responses_background.settled)
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                number = event.sequence_number
                yield event
        except RequestError as err:
            failed = answer.fail(failure(err, answer.base.truncation))
            request[IN_BAND_ERROR] = from_exception(err).code or "none"  # (counted as sse.fail's are: our code)
            yield ResponseFailed(sequence_number=number + 1, response=failed)
        except Exception as err:  # a fault of this server's: its row says so (the connection boundary logs it)
            answer.fail(failure(err, answer.base.truncation))
            raise
        finally:
            RUNNING_HERE.discard(rid)
            if not answer.ended:  # the client left: its row says so, not in_progress
                answer.fail(LEFT)


def _not_stored(rid: str) -> ApiError:
    return ApiError(404, f"response {rid!r} is not stored here", "response_id", "not_found")


async def get_response(request: web.Request) -> web.StreamResponse:
    """A stored response; `?stream=true[&starting_after=N]`: a streamed background response's events
    (after number N), followed live while it runs here."""
    rid = request.match_info["response_id"]
    store, running = _store(request), request.app[BACKGROUND_KEY]
    streamed = _flag(request.query.get("stream"), "stream")
    after = _sequence(request.query.get("starting_after"))
    settled(store, rid, running)
    if (body := store.body(rid)) is None:
        raise _not_stored(rid)
    if not streamed:
        return web.Response(body=body, content_type="application/json")
    if (log := running.logs.get(rid)) is not None:
        return await sse.respond(request, log.follow(after), done=False, named=True)
    stored = store.events(rid)
    if stored is None:
        raise bad_request(f"response {rid} was not created with background: true and stream: true; its events "
                          "are not kept (GET it without stream)", "stream")
    state = store.status(rid)
    if stored == b"[]" and state is not None and state[0] in UNFINISHED:
        raise bad_request(f"response {rid} is being made by another server on this data directory; stream it "
                          "from that server", "stream")
    return await sse.respond(request, replay(stored, after, body), done=False, named=True)


def _flag(value: str | None, name: str) -> bool:
    """A query flag: true/false (any case, as Python's `str(True)` writes it) or 1/0; absent is false."""
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise bad_request(f"{name} must be true or false", name)


def _sequence(value: str | None) -> int:
    """`starting_after` (a sequence number, >= 0); absent: -1, from the first event."""
    if value is None:
        return -1
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise bad_request("starting_after must be a sequence number (an integer >= 0)", "starting_after")
    return number


async def cancel_response(request: web.Request) -> web.Response:
    """A queued or in-progress background response stops and reads `cancelled` (once more: the same)."""
    rid = request.match_info["response_id"]
    store, running = _store(request), request.app[BACKGROUND_KEY]
    found = store.body(rid)
    if found is None:
        raise _not_stored(rid)
    if not msgspec.json.decode(found, type=Response).background:
        raise bad_request(f"response {rid} was not created with background: true; only a background response can "
                          "be cancelled", "response_id", "invalid_state")
    if not await running.cancel(rid):
        settled(store, rid, running)  # (one a gone server left reads failed)
        cancel_elsewhere(store, rid)  # (another server on this data directory runs it: it stops it)
    state = store.status(rid)
    body = store.body(rid)
    if state is None or body is None:
        raise _not_stored(rid)
    if state[0] != "cancelled":
        raise bad_request(f"response {rid} is {state[0] or 'completed'}; only a queued or in-progress background "
                          "response can be cancelled", "response_id", "invalid_state")
    return web.Response(body=body, content_type="application/json")


async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    await request.app[BACKGROUND_KEY].cancel(rid)  # a running background response stops first
    if not _store(request).delete(rid):
        raise _not_stored(rid)
    return web.Response(body=msgspec.json.encode(ResponseDeleted(rid)), content_type="application/json")


async def list_input_items(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    conversations.check_include_query(request)  # (as a conversation's items list reads `include`)
    items = _store(request).items(rid)
    if items is None:
        raise _not_stored(rid)
    q = request.query
    page, first, last, more = in_memory_page(items, q, newest_first(q), DEFAULT_PAGE, MAX_PAGE,
                                             "an item of this response")
    body = InputItemList(page, first, last, has_more=more)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    """Every Responses API route (one line in app.py)."""
    running = app[BACKGROUND_KEY] = Background()

    async def stop(app: web.Application) -> None:
        await running.close()

    app.on_shutdown.append(stop)
    r = app.router
    r.add_post(ROUTE, create_response)
    r.add_get(ROUTE + "/{response_id}", get_response)
    r.add_delete(ROUTE + "/{response_id}", delete_response)
    r.add_post(ROUTE + "/{response_id}/cancel", cancel_response)
    r.add_get(ROUTE + "/{response_id}/input_items", list_input_items)
    conversations.add_routes(app)
