"""The OpenAI-Realtime-compatible WebSocket endpoint (/v1/realtime).

    client_events.py  client events (beta and GA shapes), decoded in one pass
    events.py     server events (beta and GA names), encoded
    session.py    session config: session.update applied, the session rendered
    conversation.py  conversation items, the input audio buffer
    client_items.py  the client's items made conversation items (item.create, response.create's input)
    audio.py      pcm16 / G.711, streaming resampler
    vad.py        silero server VAD
    response_request.py  a response's options and the pipeline request built from the conversation
    responses.py  one response through the orchestrator, streamed as deltas
    response_item.py  a response's message item: text, transcript and audio deltas
    function_calls.py  tools shown to the model, its calls as function_call items
    route.py      the /v1/realtime route: upgrade, session limit, one session per connection
    client_secrets.py  POST /v1/realtime/client_secrets: ephemeral keys, each presetting its sessions
    client_secret_store.py  the secrets in the data directory's store (hashes of their values)
    handler.py    the session: one receive loop per connection, events dispatched
    session_updates.py  session.update / transcription_session.update: checked, then taken
    input_audio.py  the session's input audio: appends, VAD turns, commits, live transcription
    transcription.py  a transcription session: each committed turn transcribed, no response
    duplex.py     the session on a full-duplex model (audio in and out at once, one long request)
    stats.py      counters per app (app[STATS_KEY].statistics())
    duplex_stats.py  duplex counters and their /metrics collector
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from omni_actors import logs
from omni_actors.api.realtime import client_secrets, vad
from omni_actors.api.realtime.client_secret_store import CLIENT_SECRET_KEY
from omni_actors.api.realtime.duplex_stats import DuplexCollector
from omni_actors.api.realtime.input_audio import VAD_EXECUTOR
from omni_actors.api.realtime.route import check_query, realtime_handler
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.orchestrator.core import Orchestrator

SESSIONS_KEY = web.AppKey("realtime_sessions", set)
STATS_KEY = web.AppKey("realtime_stats", RealtimeStats)


def session_pipeline(app: web.Application, name: str | None, param: str = "model") -> Orchestrator:
    """A session's pipeline: the one named `name` (404 naming `param` if unknown), else the first that writes
    text. With one pipeline any name reaches it, as it always has (realtime clients often send their own)."""
    from omni_actors.api.pipelines import PIPELINES_KEY  # (look it up late, as app.py does)

    pipelines = app[PIPELINES_KEY]
    if len(pipelines.all) == 1 or not name:
        return pipelines.first_making({"text"})
    return pipelines.find(name, set(), param)[0]


def add_routes(app: web.Application) -> None:
    """Register GET /v1/realtime and POST /v1/realtime/client_secrets on `app`; the orchestrator is read from
    the app at request time."""
    sessions: set = set()
    app[SESSIONS_KEY] = sessions
    app[STATS_KEY] = stats = RealtimeStats()
    from omni_actors.api.metrics import METRICS_KEY  # app.py imports this package; look it up late

    if METRICS_KEY in app:  # (the duplex session limit read at each scrape, not only when a client connects)
        app[METRICS_KEY].registry.register(DuplexCollector(stats.duplex, lambda: _duplex_limit(app)))

    async def route(request: web.Request) -> web.StreamResponse:
        check_query(request)  # (before the model's name is looked up or echoed)
        # A client secret's session names the model its sessions use, whatever the query says.
        secret = request.get(CLIENT_SECRET_KEY)
        name = (secret and client_secrets.session_model(secret.session)) or request.query.get("model")
        return await realtime_handler(request, session_pipeline(request.app, name), sessions, stats)

    async def warm_up(_app: web.Application) -> None:
        # Load the VAD model (seconds, once per process) on the VAD thread without holding up
        # startup; the first session's audio queues behind it on that same thread.
        fut = asyncio.get_running_loop().run_in_executor(VAD_EXECUTOR, vad.warm_up)
        fut.add_done_callback(_log_warm_up)

    async def close_all(_app: web.Application) -> None:
        await asyncio.gather(*(s.ws.close(code=1001, message=b"server shutting down") for s in list(sessions)),
                             return_exceptions=True)

    app.router.add_get("/v1/realtime", route)
    client_secrets.add_routes(app, stats, session_pipeline)
    app.on_startup.append(warm_up)
    app.on_shutdown.append(close_all)


def _duplex_limit(app: web.Application) -> int:
    """The duplex session limit now: every duplex pipeline's (0 when none is served)."""
    from omni_actors.api.pipelines import PIPELINES_KEY  # (as session_pipeline looks it up)
    from omni_actors.api.realtime.duplex import session_limit

    return sum(session_limit(o) for o in app[PIPELINES_KEY].all if o.pipeline.duplex) if PIPELINES_KEY in app else 0


def _log_warm_up(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logs.get(__name__).error("realtime.vad_unavailable", error=repr(fut.exception()))


__all__ = ["SESSIONS_KEY", "STATS_KEY", "add_routes", "session_pipeline"]
