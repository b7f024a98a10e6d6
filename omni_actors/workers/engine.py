"""The StageEngine interface every stage engine implements.

A worker owns exactly one engine and drives it from a single thread:

    engine = EngineClass(ctx)            # load weights; raise to fail stage start
    engine.add(rid, inputs, params, streaming=False)
    engine.feed(rid, inputs, last)       # only for streaming (async-chunk) requests
    while engine.has_work():
        for out in engine.step(): ...    # EngineOutput per request with news
    engine.abort(rid)                    # drop all state of rid; no more outputs for it
    engine.close()

Payloads are flat dicts of plain values (str, int, float, bool, bytes, lists)
and arrays (numpy arrays or torch tensors) at the top level. Arrays received
as inputs may be views of shared memory that is released after `add`/`feed`
returns: an engine copies whatever it keeps (`torch.tensor(x)`, `.to(device)`,
`np.array(x)`).

Errors: an exception from `add`/`feed` fails that request only. An engine that
knows which request failed inside `step` reports it as an EngineOutput with
`error` set; any other exception from `step` fails every request it holds.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_actors.errors import CONTEXT_LENGTH_EXCEEDED


class StartupClock:
    """Seconds per start-up phase that engine and model code time with `timed` (sent in Ready).

    Phases are disjoint: a `timed` block inside another one counts toward the outer phase only,
    so the phases never add up to more than the time they span.
    """

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._open = 0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._open:
            yield
            return
        self._open += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._open -= 1
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class EngineContext:
    """What an engine is told when it starts."""

    stage_id: int
    replica: int
    model_stage: str
    model_path: Path | None
    """The stage's weights folder (deploy `model` plus the stage's `subdir`)."""
    device: str
    """"cpu" or "cuda" (CUDA_VISIBLE_DEVICES is already set for the worker)."""
    max_num_seqs: int
    dtype: str
    gpu_memory_utilization: float
    tensor_parallel_size: int
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    sampling_constraints: dict[str, Any] = field(default_factory=dict)
    engine_extras: dict[str, Any] = field(default_factory=dict)
    tool_parser: str | None = None
    """The stage's `StageSpec.tool_parser` (LLM stages that read function calls out of their text)."""
    startup: StartupClock = field(default_factory=StartupClock, compare=False, repr=False)
    """Start-up phases the engine times (`timed`); the worker reports them in its Ready."""


class ContextLengthError(ValueError):
    """A request's prompt is longer than the stage's context: refused with its own code, so the
    caller hears OpenAI's `context_length_exceeded`, whatever words the engine's library used."""

    code = CONTEXT_LENGTH_EXCEEDED


@dataclass
class EngineOutput:
    """News for one request after a step: a delta of output, and whether it is the last."""

    request_id: str
    payload: dict[str, Any]
    finished: bool = False
    error: str | None = None
    rejected: bool = False
    """With `error`: the request asked for what the engine cannot do (e.g. more context than it
    holds), so the caller gets a 400 rather than a 500."""
    code: str | None = None
    """With `rejected`: which refusal (errors.REJECT_CODES), where the engine knows it."""


TORCH_PRELOAD = ("torch", "transformers.modeling_utils")
"""What an engine on torch and transformers has the worker zygote import before it forks it."""


class StageEngine(abc.ABC):
    """Base class of stage engines; see the module docstring for the contract."""

    ZYGOTE_PRELOAD: tuple[str, ...] = ()
    """Modules the worker zygote imports (once) before forking a worker of this engine: what its
    start imports anyway (workers/zygote.py). Empty: only the engine's own module."""

    capacity: int | None = None
    """Most requests this engine holds at once where it decided that itself at load (a duplex engine's
    slots, lowered to fit its frame budget): told to the orchestrator in Ready. None: the stage's
    max_num_seqs."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        """Start a request. With `streaming`, more input arrives through `feed`."""

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        """Give a streaming request more input; `last` marks the end of its input."""
        raise NotImplementedError(f"{type(self).__name__} does not take streamed input")

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Forget a request. Unknown ids are ignored."""

    @abc.abstractmethod
    def step(self) -> list[EngineOutput]:
        """Run one unit of work (a decode step, a denoising step, a chunk decode)."""

    @abc.abstractmethod
    def has_work(self) -> bool:
        """True when `step` would make progress now."""

    def first_output_next(self) -> bool:
        """True when the next `step` makes some request's first output. With deploy
        `first_output_priority` the worker says so, and the stages sharing its device hold their
        steps while it runs. Engines that can tell override this; the default never claims."""
        return False

    def gather_s(self, now: float) -> float:
        """Seconds the engine would rather wait for more requests before its next step (0: step
        now). The worker waits on its socket that long at most; a message ends the wait early."""
        return 0.0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at worker exit."""

    def make_adapter(self) -> Any:
        """The model adapter named by engine_extras["adapter"] ("module:Class"), built with ctx."""
        from omni_actors.config.pipeline import resolve

        ref = self.ctx.engine_extras.get("adapter")
        if not ref:
            raise ValueError(f"{type(self).__name__} needs engine_extras['adapter'] = 'module:Class'")
        return resolve(ref)(self.ctx)

    def merged_sampling(self, params: dict[str, Any]) -> dict[str, Any]:
        """Deploy defaults < request params < pipeline constraints."""
        return merge_params(self.ctx, params)


def merge_params(
    ctx: EngineContext,
    params: dict[str, Any],
    keys: tuple[str, ...] | None = None,
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Model `defaults` < deploy defaults < request params < pipeline constraints.

    With `keys`, only those request params count, and only the ones set (not None):
    a request's params reach every stage, and each stage takes its own.
    """
    if keys is not None:
        params = {k: params[k] for k in keys if params.get(k) is not None}
    return {**(defaults or {}), **ctx.default_sampling_params, **params, **ctx.sampling_constraints}


def timed(ctx: Any, phase: str) -> contextlib.AbstractContextManager[None]:
    """Count the block's seconds toward start-up phase `phase` ("weights", "config", "processors",
    "warmup", ...) of the engine's context; a context without a clock (a bare stand-in) times nothing."""
    clock = getattr(ctx, "startup", None)
    return clock.phase(phase) if isinstance(clock, StartupClock) else contextlib.nullcontext()


def direct_load(ctx: EngineContext) -> bool:
    """engine_extras["direct_load"] (default True): on an accelerator, load weights straight onto
    it rather than into host memory first and then `.to(device)` (false: the old way, a baseline)."""
    value = ctx.engine_extras.get("direct_load", True)
    if not isinstance(value, bool):
        raise ValueError(f"engine_extras.direct_load: expected true or false, got {value!r}")
    return value


def first_chunk_priority(extras: dict[str, Any]) -> bool:
    """engine_extras["first_chunk_priority"] (default True): whether a request's first output goes
    ahead of other requests' later work in this stage (each engine's docstring says how)."""
    value = extras.get("first_chunk_priority", True)
    if not isinstance(value, bool):
        raise ValueError(
            f"engine_extras.first_chunk_priority: expected true or false, got {value!r}"
        )
    return value
