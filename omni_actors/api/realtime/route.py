"""The /v1/realtime route: the WebSocket upgrade, the session limit, one session per connection."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni_actors import logs
from omni_actors.api.errors import ApiError
from omni_actors.api.realtime.duplex import DuplexSession
from omni_actors.api.realtime.handler import MAX_EVENT_BYTES, RealtimeSession
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.orchestrator.core import Orchestrator

log = logs.get(__name__)

MAX_FRAME_BYTES = 2 * MAX_EVENT_BYTES
"""aiohttp's limit; events between the two get an `error` event, larger ones close the socket (1009)."""
HEARTBEAT_S = 20.0
"""WebSocket ping interval; a client that stops answering is treated as gone."""


async def realtime_handler(request: web.Request, orch: Orchestrator, sessions: set[Any],
                           stats: RealtimeStats) -> web.StreamResponse:
    server = orch.deploy.server  # (the API key was checked by the app's auth middleware, as for every route)
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, compress=False, heartbeat=HEARTBEAT_S,
                               protocols=("realtime",))
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "/v1/realtime is a WebSocket endpoint: open it with a WebSocket upgrade request",
                       None, "websocket_upgrade_required")
    await ws.prepare(request)
    if len(sessions) >= server.max_realtime_sessions:
        stats.sessions_rejected += 1
        log.warning("realtime.session_limit", limit=server.max_realtime_sessions)
        await ws.close(code=1013, message=f"too many realtime sessions (limit {server.max_realtime_sessions})".encode())
        return ws
    model = request.query.get("model") or server.served_model_name or orch.deploy.pipeline
    if orch.pipeline.duplex:  # full-duplex model: one long streaming request per session
        session: RealtimeSession = DuplexSession(ws, request.app, orch, model, stats)
    else:
        session = RealtimeSession(ws, request.app, orch, model, stats)
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
