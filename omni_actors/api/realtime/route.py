"""The /v1/realtime route: the WebSocket upgrade, the session limits, one session per connection."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from omni_actors import logs
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.duplex import LIMIT_CLOSE_CODE, DuplexSession, session_limit
from omni_actors.api.realtime.handler import MAX_EVENT_BYTES, RealtimeSession
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.api.realtime.transcription import no_transcripts
from omni_actors.api.schemas import MAX_NAME_CHARS
from omni_actors.orchestrator.core import Orchestrator

log = logs.get(__name__)

MAX_FRAME_BYTES = 2 * MAX_EVENT_BYTES
"""aiohttp's limit; events between the two get an `error` event, larger ones close the socket (1009)."""
HEARTBEAT_S = 20.0
"""WebSocket ping interval; a client that stops answering is treated as gone."""
INTENTS = ("transcription",)
"""`?intent=` values: OpenAI's beta transcription API (a transcription session from the start)."""


def check_query(request: web.Request) -> None:
    """The upgrade request's `model` and `intent`, refused (a 400, before any upgrade) as REST refuses the
    same fields: a `model` past MAX_NAME_CHARS would be echoed in every session event."""
    model = request.query.get("model")
    if model is not None and len(model) > MAX_NAME_CHARS:
        raise bad_request(f"Expected `str` of length <= {MAX_NAME_CHARS}", "model", "string_above_max_length")
    intent = request.query.get("intent")
    if intent is not None and intent not in INTENTS:
        raise bad_request(f"unsupported intent {intent[:64]!r}; expected one of {list(INTENTS)}", "intent")


def _intent_refusal(request: web.Request, orch: Orchestrator) -> ApiError | None:
    """A transcription intent on a pipeline that makes no transcripts (as GA session.type's refusal)."""
    if request.query.get("intent") == "transcription" and (refusal := no_transcripts(orch.pipeline)) is not None:
        return bad_request(refusal, "intent", "unsupported_session_type")
    return None


def _refusal(orch: Orchestrator, sessions: set[Any], stats: RealtimeStats) -> str | None:
    """Why a new session cannot open now (the server's cap, or a duplex model's slots), else None."""
    cap = orch.deploy.server.max_realtime_sessions
    if len(sessions) >= cap:
        return f"this server holds {cap} realtime sessions at once; try again later"
    if orch.pipeline.duplex:
        stats.duplex.session_limit = limit = session_limit(orch)
        if stats.duplex.sessions_live >= limit:
            return f"this duplex model serves {limit} sessions at once; try again later"
    return None


async def _refuse(ws: web.WebSocketResponse, orch: Orchestrator, stats: RealtimeStats, message: str) -> None:
    """Every refusal alike: counted, an `error` event (code session_limit_reached), close code 1013."""
    stats.sessions_rejected += 1
    if orch.pipeline.duplex:
        stats.duplex.sessions_rejected += 1
    log.warning("realtime.session_limit", reason=message)
    error = ev.Error(error={"type": "invalid_request_error", "code": "session_limit_reached", "message": message,
                            "param": None, "event_id": None})
    with contextlib.suppress(ConnectionError):  # (a client already gone needs no answer)
        await ws.send_frame(ev.encode_server(error, "beta", f"event_{uuid.uuid4().hex[:12]}"), WSMsgType.TEXT)
    await ws.close(code=LIMIT_CLOSE_CODE, message=b"session limit reached")


async def realtime_handler(request: web.Request, orch: Orchestrator, sessions: set[Any],
                           stats: RealtimeStats) -> web.StreamResponse:
    server = orch.deploy.server  # (the API key was checked by the app's auth middleware, as for every route)
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, compress=False, heartbeat=HEARTBEAT_S,
                               protocols=("realtime",))
    if (refused := _intent_refusal(request, orch)) is not None:
        raise refused
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "/v1/realtime is a WebSocket endpoint: open it with a WebSocket upgrade request",
                       None, "websocket_upgrade_required")
    await ws.prepare(request)
    if (refusal := _refusal(orch, sessions, stats)) is not None:
        await _refuse(ws, orch, stats, refusal)
        return ws
    # No await from the check above until the session is counted (sessions.add here, a duplex
    # session's sessions_live at the top of its serve): two connections cannot both pass it.
    model = request.query.get("model") or server.served_model_name or orch.deploy.pipeline
    if orch.pipeline.duplex:  # full-duplex model: one long streaming request per session
        session: RealtimeSession = DuplexSession(ws, request, orch, model, stats)
    else:
        session = RealtimeSession(ws, request, orch, model, stats)
    sessions.add(session)
    stats.sessions_total += 1
    stats.sessions_open = len(sessions)
    log.info("realtime.session_open", session_id=session.id, sessions=len(sessions))
    try:
        await session.serve(server.realtime_idle_timeout_s)
    finally:
        sessions.discard(session)
        stats.sessions_open = len(sessions)
        if not ws.closed:
            await ws.close()
        log.info("realtime.session_closed", session_id=session.id, sessions=len(sessions))
    return ws
