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
- Sampling fields only the vLLM engine applies (VLLM_ONLY: `stop`, `presence_penalty`,
  `frequency_penalty`): `refuse_unapplied` is the 400 naming the one a pipeline's text stage
  would ignore (chat, /v1/completions). `stop` on another engine's text-only answer is applied
  here instead (a call given `stop`: StopCut), as vLLM applies it: the text ends before the first
  stop string (not included), finish_reason "stop", and the request is aborted in every stage.
- Leaving the block for any reason (client disconnect cancels the handler,
  a write to a closed socket fails, an error) aborts the request in every stage
  and drops the outputs left unread.
- A stage failing after it made output: the outputs come first, then the error
  (orchestrator/requests.py), so `started()` returns the first output and a
  streamed route has sent its headers when the error comes (in-band then).
- Memory held for slow readers goes back: each call notes the most output its stream held unread,
  and once calls that held TRIM_AFTER_BYTES between them have ended, the process's free heap is
  handed back to the OS (`HeapTrim`; glibc otherwise keeps it: 20 stalled streamed chats left the
  main process 360 MB larger after they had ended).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import dataclasses
from collections.abc import Callable
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
from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import TextOutput
from omni_actors.orchestrator.requests import RequestSpec, RequestStream, StageChunk, new_request_id

ORCH_KEY = web.AppKey("orchestrator", Orchestrator)
"""The server's first (default) pipeline; every pipeline is in app[PIPELINES_KEY]."""
VLLM_ONLY = ("stop", "presence_penalty", "frequency_penalty")
"""Sampling fields the vLLM engine applies and the transformers engine (and the synthetic one) would ignore."""
TRIM_AFTER_BYTES = 64 * 2**20
"""Output bytes held unread by calls that have since ended, past which the free heap is given back to the OS."""


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrim:
    """Gives the process's free heap back to the OS after calls that held much output have ended.

    glibc keeps the memory of freed small blocks (a stream's queued chunks) in its heap for reuse; after a
    burst of slow readers that is hundreds of MB resident for good. `malloc_trim` returns it; it runs in
    the loop's thread pool (it walks the heap), one at a time."""

    def __init__(self) -> None:
        self.held = 0
        """Bytes held unread by calls ended since the last trim."""
        self.trims = 0
        self._trim = _malloc_trim()
        self._running = False
        self._overflows: dict[int, int] = {}
        """Each orchestrator's (by id) stream overflows already counted."""

    def ended(self, orch: Orchestrator, held_bytes: int) -> None:
        """A call on `orch` has ended, its stream having held `held_bytes` unread at most; the streams `orch`
        dropped since for overflowing their bound (their reader stalled) count at that bound each."""
        overflows = orch.counters["stream_overflows"]
        dropped = max(overflows - self._overflows.get(id(orch), 0), 0)
        self._overflows[id(orch)] = overflows
        self.held += held_bytes + dropped * (orch.stream_max_bytes or 0)
        self._start()

    def _start(self) -> None:
        if self.held < TRIM_AFTER_BYTES or self._running or self._trim is None:
            return
        self.held = 0
        self._running = True
        asyncio.get_running_loop().run_in_executor(None, self._trim, 0).add_done_callback(self._done)

    def _done(self, _: asyncio.Future) -> None:
        self._running = False
        self.trims += 1
        self._start()  # (calls that ended meanwhile)


HEAP_TRIM = HeapTrim()


def text_stage_of(pipeline: PipelineConfig) -> StageSpec | None:
    """The autoregressive stage whose final output is the pipeline's text, if it has one."""
    return next((s for s in pipeline.stages if s.final_output and s.final_output_type == "text"
                 and s.execution_type == ExecutionType.LLM_AR), None)


def applies_vllm_sampling(stage: StageSpec | None) -> bool:
    """`stage` (a pipeline's text stage) runs on the vLLM engine, which applies every VLLM_ONLY field."""
    return stage is not None and stage.engine.partition(":")[0].endswith(".vllm_ar")


def refuse_unapplied(stage: StageSpec | None, values: dict[str, Any], why: dict[str, str] | None = None) -> None:
    """A 400 naming the first field of `values` (VLLM_ONLY names: what the client sent) that is set and that
    `stage`, the text stage, would ignore; `why` adds a reason for a field."""
    if applies_vllm_sampling(stage):
        return
    for name, value in values.items():
        if value:
            reason = (why or {}).get(name)
            raise bad_request(f"`{name}` is not applied by this model's engine{f' {reason}' if reason else ''}; "
                              "leave it out", name, "unsupported_parameter")


class StopCut:
    """`stop` applied to a streamed text as vLLM applies it: the text ends right before the first stop string
    found (not included). Text that may be the start of a stop string is held until the next delta says."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def feed(self, text: str, last: bool) -> str:
        """The text of this delta that can go out now (all that is held, at the `last`)."""
        buf = self.held + text
        found = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            self.hit, self.held = True, ""
            return buf[:min(found)]
        keep = 0 if last else max((k for s in self.stops for k in range(1, min(len(s), len(buf) + 1))
                                   if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]


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
                 streaming: bool = False, orch: Orchestrator | None = None, stop: list[str] | None = None) -> None:
        """`orch`: the pipeline to call (default: the one `route_model` chose for `request`, else the first).
        `stop`: stop strings to apply to the text here (for an engine that does not; see StopCut)."""
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
        self._cut = StopCut(stop) if stop else None
        self._text_sid = 0
        self._held = 0
        """The most output the stream held unread, seen at a read or at the end."""

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
            HEAP_TRIM.ended(self.orch, max(self._held, self.stream.queued_bytes))
            self.stream.close()  # aborts a stream still running; drops what was left unread
            if exc_type is None and (self.stream.terminal is None or self.stopped):
                self.timing.done()

    @property
    def stopped(self) -> bool:
        """The text reached a stop string applied here: the answer ended ("stop"), its request was aborted."""
        return self._cut is not None and self._cut.hit

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
        self._held = max(self._held, self.stream.queued_bytes)
        if self._cut is None:
            chunk = await self.stream.__anext__()  # raises the run's RequestError once
        else:
            chunk = await self._cut_next()
        self.timing.saw(chunk.output_type, chunk.output)
        return chunk

    async def _cut_next(self) -> StageChunk:
        """The next chunk, its text cut by the stop strings; the one that reached a stop string is the last
        (finish_reason "stop"), and its request is aborted in every stage."""
        assert self.stream is not None and self._cut is not None
        if self._cut.hit:
            raise StopAsyncIteration
        try:
            chunk = await self.stream.__anext__()
        except StopAsyncIteration:
            if not self._cut.held:
                raise
            chunk = StageChunk(self._text_sid, "text", {}, True, TextOutput("", 0))  # (what was held goes out)
        out = chunk.output
        if not isinstance(out, TextOutput):
            return chunk
        self._text_sid = chunk.stage_id
        text = self._cut.feed(out.text, chunk.finished or out.finish_reason is not None)
        if self._cut.hit:
            self.stream.close()  # (an end here, not the client's leaving: `stopped`)
            out = dataclasses.replace(out, text=text, finish_reason="stop", tool_calls=(), tool_parts=())
            return dataclasses.replace(chunk, data={**chunk.data, "text": text}, finished=True, output=out)
        if text == out.text:
            return chunk
        return dataclasses.replace(chunk, data={**chunk.data, "text": text}, output=dataclasses.replace(out, text=text))
