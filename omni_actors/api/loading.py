"""While `omni-run` loads its models, the API already listens and says so.

`omni-run` binds the port before the workers load their weights (minutes for a large
model on a cold cache), so a browser, a probe or a client sees the server come up
instead of a refused connection. Until every stage is ready:

- `/health` is a 503 with status "loading" and the stages not ready yet;
- `/v1/status`, `/v1/models`, `/metrics`, `/openapi.json` and the playground answer as
  usual (the playground shows the load's progress from `/health`);
- every other route is a 503 with code "loading", the stages ready so far, and
  `Retry-After` (the OpenAI SDK retries a 503 by itself, honouring that header).

The in-process server of tests and embedders is built after its workers are ready:
there the state is never active.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from omni_actors.api.errors import ApiError
from omni_actors.api.middleware import PUBLIC_PREFIXES

RETRY_AFTER_S = 5
"""What a refused request is told to wait before trying again."""
OPEN_PATHS = frozenset({"/", "/health", "/metrics", "/openapi.json", "/v1/status", "/v1/models"})
"""Routes that answer while the models load (besides `/v1/models/{model}` and the playground's files)."""


class Loading:
    """Whether the server's pipelines are still loading (set by `omni-run` around their start)."""

    def __init__(self) -> None:
        self.active = False
        self.since = time.monotonic()
        self.ready = asyncio.Event()
        """Set while the server is not loading: what waits for its models (a resumed batch) waits on it."""
        self.ready.set()

    def begin(self) -> None:
        self.active, self.since = True, time.monotonic()
        self.ready.clear()

    def end(self) -> None:
        self.active = False
        self.ready.set()

    def seconds(self) -> float:
        return time.monotonic() - self.since


LOADING_KEY = web.AppKey("loading", Loading)


def stages_ready(orchs: Any) -> list[tuple[str, bool]]:
    """(stage name, ready) for every stage of every pipeline, in order."""
    out = []
    for orch in orchs:
        health = orch.health()
        out += [(s.model_stage, bool(health.get(s.stage_id))) for s in orch.pipeline.stages]
    return out


def loading_middleware(pipelines: Callable[[web.Request], Any]) -> Any:
    """Refuse what needs a loaded model while the server loads; `pipelines(request)` lists the orchestrators."""

    @web.middleware
    async def check_loading(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        loading = request.app[LOADING_KEY]
        path = request.path
        if not loading.active or path in OPEN_PATHS or path.startswith(("/v1/models/", *PUBLIC_PREFIXES)):
            return await handler(request)
        stages = stages_ready(pipelines(request))
        ready = sum(ok for _, ok in stages)
        waiting = ", ".join(name for name, ok in stages if not ok)
        raise ApiError(503, f"the server is loading its models ({ready} of {len(stages)} stages ready; "
                       f"loading {waiting}, {loading.seconds():.0f} s so far); retry shortly", None, "loading",
                       headers={"Retry-After": str(RETRY_AFTER_S)})

    return check_loading
