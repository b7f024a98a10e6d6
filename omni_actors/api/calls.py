"""One route's call into the orchestrator: capability checks, submit, iterate, abort on exit.

    async with PipelineCall(request, "/v1/chat/completions", inputs, params, {"text"}) as call:
        async for chunk in call: ...

Every request into a pipeline goes through it: the REST routes (given their
request, it calls the pipeline `route_model` chose for it, pipelines.py) and each
realtime response (given the app and its session's orchestrator).

- The route says which output types it wants; the pipeline says which it can
  produce (`pipeline.output_types()`): a mismatch is a 400 naming `param`.
- Stages: a pipeline with a planner decides itself (stages=None, the planner
  reads `params["modalities"]` and the inputs); otherwise the stages are
  `pipeline.stages_for_outputs(wanted)`.
- Every call gets the deploy's `server.request_timeout_s` as its deadline (504).
- Leaving the block for any reason (client disconnect cancels the handler,
  a write to a closed socket fails, an error) aborts the request in every stage.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.metrics import METRICS_KEY, Timing
from omni_actors.api.pipelines import (  # noqa: F401 - re-exported for the routes
    PIPELINES_KEY,
    model_id,
    orchestrator,
    require_outputs,
    route_model,
    served_model_names,
)
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec, RequestStream, StageChunk, new_request_id

ORCH_KEY = web.AppKey("orchestrator", Orchestrator)
"""The server's first (default) pipeline; every pipeline is in app[PIPELINES_KEY]."""


def require_model(orch: Orchestrator, name: str | None, param: str = "model") -> str:
    """The model name to echo back; 404 for a name `orch` does not answer to (None: its own name)."""
    names = served_model_names(orch)
    if name is None or name == "":
        return names[0]
    if name not in names:
        raise ApiError(404, f"model {name!r} does not exist; this server serves {names}", param,
                       "model_not_found")
    return name


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class PipelineCall:
    """Submit on enter, abort on exit unless the stream ended; iterate StageChunks in between."""

    def __init__(self, request: web.Request | web.Application, route: str, inputs: dict[str, Any],
                 params: dict[str, Any], wanted: set[str], request_id: str | None = None,
                 streaming: bool = False, orch: Orchestrator | None = None) -> None:
        """`orch`: the pipeline to call (default: the one `route_model` chose for `request`, else the first)."""
        app = request.app if isinstance(request, web.Request) else request
        if orch is None:
            orch = orchestrator(request) if isinstance(request, web.Request) else app[PIPELINES_KEY].default
        self.orch = orch
        self.inputs = inputs
        self.params = params
        self.wanted = wanted
        self.streaming = streaming
        self.request_id = request_id or new_request_id()
        self.timing = Timing(app[METRICS_KEY], route, model_id(orch))
        self.stream: RequestStream | None = None
        self._first: StageChunk | None = None

    def _spec(self) -> RequestSpec:
        pipe = self.orch.pipeline
        stages = None if pipe.planner else pipe.stages_for_outputs(self.wanted)
        return RequestSpec(inputs=self.inputs, params=self.params, stages=stages,
                           deadline_s=self.orch.deploy.server.request_timeout_s, request_id=self.request_id,
                           streaming=self.streaming)

    async def __aenter__(self) -> PipelineCall:
        try:
            self.stream = self.orch.submit(self._spec())  # AdmissionError / StageUnavailable -> 429 / 503
        except ValueError as err:  # the pipeline's planner refused these inputs
            raise bad_request(str(err), None, "invalid_request") from None
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.stream is not None:
            self.stream.abort()  # a no-op once the stream has ended
            if exc_type is None and self.stream.terminal is None:
                self.timing.done()

    def feed(self, inputs: dict[str, Any], last: bool = False) -> bool:
        """More input for a `streaming` call's entry stages; False once the request has ended."""
        return self.stream is not None and self.orch.feed(self.request_id, inputs, last)

    async def started(self) -> None:
        """Wait for the first output before a streamed response sends its headers, so that an
        early end (a stage refusing the request, a dead worker, the deadline) is still answered
        with its own HTTP status. Iteration yields that first output again."""
        try:
            self._first = await self.__anext__()
        except StopAsyncIteration:
            pass

    def __aiter__(self) -> PipelineCall:
        return self

    async def __anext__(self) -> StageChunk:
        assert self.stream is not None
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        chunk = await self.stream.__anext__()  # raises the run's RequestError once
        self.timing.saw(chunk.output_type, chunk.output)
        return chunk
