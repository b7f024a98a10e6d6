"""OwnEngine: the request bookkeeping of a model's own stage engine (Dia, VibeVoice).

Such an engine keeps one state object per request (with `request_id` and a
`prefilled` flag), prefills new requests one by one and steps the prefilled ones
together. This base owns the table of requests, the admission order (running ones
first, new ones while fewer than `max_num_seqs` run), abort/close, and a failed
prompt's final output.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch

from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine
from omni_actors.workers.engines.torch_setup import one_cpu_thread


class _Request(Protocol):
    request_id: str

    @property
    def prefilled(self) -> bool: ...


R = TypeVar("R", bound=_Request)


class OwnEngine(StageEngine, Generic[R]):
    """A stage engine with a table of per-request states (see the module docstring)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        one_cpu_thread(ctx)
        self.device = torch.device(ctx.device)
        self.requests: dict[str, R] = {}

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_work(self) -> bool:
        return bool(self.requests)

    def close(self) -> None:
        self.requests.clear()

    def admit(self) -> tuple[list[R], list[R]]:
        """(running, new) for one step: prefilled requests first, up to max_num_seqs in all."""
        limit = max(1, self.ctx.max_num_seqs)
        running = [r for r in self.requests.values() if r.prefilled][:limit]
        new = [r for r in self.requests.values() if not r.prefilled][: max(0, limit - len(running))]
        return running, new

    def failed(self, request_id: str, err: Exception) -> EngineOutput:
        """Drop a request whose prompt failed; its final output carries the error."""
        self.requests.pop(request_id, None)
        return EngineOutput(request_id, {}, True, f"{type(err).__name__}: {err}")
