"""Every decode bucket's CUDA graph captured at start (engine_extras["warm_graphs"]).

DecodeGraphs captures a (batch, length) bucket the first time a step uses it: the step runs
eagerly, then is captured. Under load that happens mid-stream, in the steps of requests that
are already speaking: a 3B model's eager step plus its capture held every stream for ~0.1 s,
once per new bucket, and a served run meets a dozen of them (batch sizes come and go, prompts
grow). So at start the engine runs one request of the adapter's `warmup_inputs` through a
prefill and one decode step (that sizes the slot buffers), captures every other bucket from
the same static buffers, and drops the request. Rows past the warm-up request's hold zeros:
they compute and write at position 0 of slots no request holds yet, which a request's prompt
overwrites when it takes the slot (as unused rows of any bucket do).

On by default where graphs are on and the step is not compiled (a compiled step compiles a
bucket before capturing it: seconds each); `warm_graphs: true` asks for it there too, `false`
turns it off (the lazy captures, a baseline). An adapter without `warmup_inputs` (its inputs
come from an upstream stage) keeps the lazy captures.
"""

from __future__ import annotations

from typing import Any

from omni_actors import logs
from omni_actors.workers.engine import timed

log = logs.get(__name__)

WARMUP_ID = "__warmup__"
WARMUP_PARAMS = {"seed": 0, "max_tokens": 4, "temperature": 1.0}
"""Sampled (a greedy step may be queued ahead, hf_ar_lookahead.py) and short."""


def warm_wanted(engine: Any, compiled: bool) -> bool:
    """engine_extras["warm_graphs"], checked; default: graphs on and the step not compiled."""
    value = engine.ctx.engine_extras.get("warm_graphs")
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"engine_extras.warm_graphs: expected true or false, got {value!r}")
    graphs = engine.graphs
    if graphs is None or not graphs.enabled:
        return False
    return (not compiled) if value is None else value


def warm_graphs(engine: Any) -> int:
    """Capture every (batch, length) bucket of `engine` (an HfAREngine) now; the number captured.
    Nothing when its adapter gives no warm-up inputs, or graphs went off on the way."""
    inputs = engine.adapter.warmup_inputs()
    if inputs is None:
        return 0
    slots, graphs = engine.slots, engine.graphs
    with timed(engine.ctx, "cuda_graphs"):
        engine.add(WARMUP_ID, inputs, dict(WARMUP_PARAMS))
        try:
            for _ in range(2):  # its prefill, then one decode step (which captures its bucket)
                engine.step()
            for batch in slots.batch_sizes:
                for length in slots.length_sizes:
                    if graphs.graphs and graphs.enabled and (batch, length) not in graphs.graphs:
                        graphs.run(batch, length)
        except Exception as err:  # an optimisation: the buckets left are captured when first used
            log.warning("hf_ar.warm_failed", reason=f"{type(err).__name__}: {err}"[:300])
        finally:
            engine.abort(WARMUP_ID)
            engine.ahead = None
    log.info("hf_ar.graphs_warmed", buckets=len(graphs.graphs), enabled=graphs.enabled)
    return len(graphs.graphs)
