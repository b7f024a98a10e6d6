"""CUDA graphs for HfAREngine's static decode: one graph per (batch, length) bucket.

The first step of a bucket runs eagerly (that is the step's result, and the
warm-up), then the same call is captured; later steps of that bucket replay
it. Inputs are the slot cache's static buffers, so a replay reads whatever the
engine wrote there. All graphs share one memory pool and their outputs stay
referenced, so graphs may replay in any order. A capture that fails turns
graphs off for the engine (one log line says why) and decoding goes on eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_actors import logs, progress

log = logs.get(__name__)


def cuda_graphs_wanted(ctx: Any) -> bool:
    """engine_extras["cuda_graphs"] (default: on CUDA), off with enforce_eager or off CUDA."""
    extras = ctx.engine_extras
    on_cuda = ctx.device == "cuda"
    return on_cuda and bool(extras.get("cuda_graphs", True)) and not extras.get("enforce_eager")


class DecodeGraphs:
    """Runs `forward(batch, length)`: eagerly, or by replaying its captured graph.

    `forward` returns a ForwardOut or any tensors (a tuple of them); a replay returns the
    captured call's result, whose tensors the replay overwrote.
    """

    def __init__(
        self,
        forward: Callable[[int, int], Any],
        enabled: bool,
        warmups: int = 0,
        buckets: int = 0,
        eager_first: bool = True,
    ) -> None:
        """`buckets`: how many (batch, length) buckets there are, for `hf_ar.cuda_graphs` progress lines.
        `eager_first` False: a new bucket (after the first) is captured and replayed at once, not
        run eagerly first (for a `forward` whose calls cost more than its capture)."""
        self.forward = forward
        self.eager_first = eager_first
        self.buckets = buckets
        self._progress: progress.Progress | None = None
        self.enabled = enabled
        self.warmups = warmups
        """Extra eager calls of a bucket before its capture (a compiled step may specialise again on
        its second call; compiling inside a capture is not allowed)."""
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Any]] = {}
        self.pool = torch.cuda.graph_pool_handle() if enabled else None

    def run(self, batch: int, length: int) -> Any:
        if not self.enabled:
            return self.forward(batch, length)
        hit = self.graphs.get((batch, length))
        if hit is None and not self.eager_first and self.graphs:
            self._capture(batch, length)  # lazy initialisation was done by the first bucket's eager run
            hit = self.graphs.get((batch, length))
            if hit is None:  # the capture failed: graphs are off
                return self.forward(batch, length)
        if hit is not None:
            hit[0].replay()
            return hit[1]
        out = self.forward(batch, length)
        self._capture(batch, length)
        return out

    def _capture(self, batch: int, length: int) -> None:
        try:
            for _ in range(self.warmups):  # the step is idempotent: it rewrites the same KV position
                self.forward(batch, length)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.forward(batch, length)
        except Exception as err:  # capture is an optimisation: any failure means eager
            self.enabled = False
            self.graphs.clear()
            log.warning(
                "hf_ar.cuda_graphs_off", batch=batch, length=length,
                reason=f"{type(err).__name__}: {err}"[:300],
            )  # fmt: skip
            return
        self.graphs[(batch, length)] = (graph, out)
        log.info("hf_ar.cuda_graph_captured", batch=batch, length=length)
        if self.buckets:  # captured as buckets are first used: done = buckets captured so far
            if self._progress is None:
                self._progress = progress.Progress("hf_ar.cuda_graphs", self.buckets)
            self._progress.update(len(self.graphs), batch=batch, length=length)
