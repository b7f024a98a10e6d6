"""POST /v1/realtime/client_secrets: an ephemeral key (`ek_...`) a browser opens realtime sessions with.

    client.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 600},
                                          session={"type": "realtime", "instructions": ...})
    -> {"value": "ek_...", "expires_at": <unix s>, "session": <the session, as session.created shows it>}

The server keeps its API key; a browser gets the value and opens `/v1/realtime` with it
(`Authorization: Bearer ek_...`, or the subprotocols `realtime` and
`openai-insecure-api-key.ek_...`). Each session so opened starts with the secret's `session`
(session.created shows it) and may still be changed with session.update. A secret opens sessions
until `expires_at`, as many as its holder likes (as OpenAI's do), on that route only
(middleware.py); it survives a restart (client_secret_store.py keeps a hash of it, never the
value). Making one needs the server's API key where the server has keys (a secret makes no
secrets); on a server without keys it is a way to preset sessions.

`session` is checked exactly as that session.update would be, by the same code on a session
that is never connected (handler.py `start_from`, a duplex model's checks too): anything a
session.update would answer with an `error` is a 400 here, naming the same field and code.
Unlike session.update, it must say its `type` ("realtime" or "transcription"), as OpenAI's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from msgspec import UNSET, Meta

from omni_actors.api.calls import ORCH_KEY
from omni_actors.api.errors import bad_request
from omni_actors.api.middleware import key_digest, presented_key
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime.client_secret_store import client_secret_store
from omni_actors.api.realtime.conversation import new_id
from omni_actors.api.realtime.duplex import DuplexSession
from omni_actors.api.realtime.handler import RealtimeSession
from omni_actors.api.realtime.session import render_session
from omni_actors.api.realtime.stats import RealtimeStats
from omni_actors.api.schemas import read_body
from omni_actors.orchestrator.core import Orchestrator

ROUTE = "/v1/realtime/client_secrets"
MIN_SECONDS, MAX_SECONDS, DEFAULT_SECONDS = 10, 7200, 600
"""`expires_after.seconds`: OpenAI's bounds (10 s to 2 h) and default (10 min)."""

PipelineFor = Callable[[web.Application, "str | None", str], Orchestrator]
"""The realtime route's choice of pipeline for a session's model name (realtime/__init__.py)."""


class ExpiresAfter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    anchor: Literal["created_at"] = "created_at"
    seconds: Annotated[int, Meta(ge=MIN_SECONDS, le=MAX_SECONDS)] = DEFAULT_SECONDS


class ClientSecretRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    expires_after: ExpiresAfter | None = None
    session: ce.SessionIn | None = None
    """The session every connection with the secret starts with (a session.update's `session`, GA shape)."""


class ClientSecret(msgspec.Struct, kw_only=True):
    value: str
    """`ek_...`: the key a client opens /v1/realtime with, until `expires_at`."""
    expires_at: int
    session: dict[str, Any]
    """The session a connection starts with (a RealtimeSessionCreateResponse, or a transcription one)."""


def session_model(session: ce.SessionIn | None) -> str | None:
    """The model a secret's session names, if any."""
    return None if session is None or session.model is UNSET else session.model


async def _checked_session(request: web.Request, orch: Orchestrator, stats: RealtimeStats,
                           session: ce.SessionIn | None) -> dict[str, Any]:
    """The session a connection with this secret would start with, rendered; a 400 for anything its
    session.update would refuse."""
    server = orch.deploy.server
    model = session_model(session) or server.served_model_name or orch.deploy.pipeline
    kind = DuplexSession if orch.pipeline.duplex else RealtimeSession
    probe = kind(None, request, orch, model, stats)  # type: ignore[arg-type]  # (never connected: it only checks)
    if probe.beta_transcription:  # (read from this POST's `?intent=`: not a connection's query, nor the secret's)
        probe.beta_transcription = False
        probe.cfg = replace(probe.cfg, type="realtime")
    if session is not None:
        if session.type is UNSET:
            raise bad_request("a client secret's session must say its `type`: 'realtime' or 'transcription'",
                              "session.type", "missing_required_parameter")
        try:
            await probe.start_from(session)
        except ce.BadEvent as err:
            raise bad_request(err.message, err.param, err.code) from None
    return render_session(probe.cfg, new_id("sess"), "ga")


def add_routes(app: web.Application, stats: RealtimeStats, pipeline_for: PipelineFor) -> None:
    async def create(request: web.Request) -> web.Response:
        body = await read_body(request, ClientSecretRequest)
        expires = body.expires_after or ExpiresAfter()
        orch = pipeline_for(request.app, session_model(body.session), "session.model")
        rendered = await _checked_session(request, orch, stats, body.session)
        # The key that made it (the auth middleware checked it), so that the secret dies with the key.
        given = presented_key(request) if request.app[ORCH_KEY].deploy.server.api_keys else None
        value, expires_at = client_secret_store(request.app).add(
            expires.seconds, None if given is None else key_digest(given), body.session)
        out = ClientSecret(value=value, expires_at=expires_at, session=rendered)
        return web.Response(body=msgspec.json.encode(out), content_type="application/json")

    app.router.add_post(ROUTE, create)
