"""Every decode bucket's CUDA graph captured at start (engine_extras["warm_graphs"]).

DecodeGraphs captures a (batch, length) bucket the first time a step uses it: the step runs
eagerly, then is captured. Under load that happens mid-stream, inside a step of requests that
are already speaking, once per new bucket, and a served run meets many of them (batch sizes
come and go, prompts grow). With `warm_graphs`, at start the engine runs one request of the
adapter's `warmup_inputs` through a prefill and one decode step (that sizes the slot buffers),
captures every other bucket from the same static buffers, and drops the request. Rows past the warm-up request's hold zeros:
they compute and write at position 0 of slots no request holds yet, which a request's prompt
overwrites when it takes the slot (as unused rows of any bucket do).

Off by default, on for the speech LMs whose adapters say so (`ARAdapter.warm_graphs`: Higgs-Audio-V2;
served at 10 requests/s, first audio p95 142 -> 99 ms, start-up ~+5 s,
docs/benchmarks.md "Twenty-first session"). `warm_graphs: true` asks for it elsewhere (and false turns it off; with `compile_dynamic: false` each bucket is
compiled at start too, 3-6 s each cold for a 1.5B fused step; with the default symbolic compile,
`warm_compiled` below has compiled already and this only captures). On an H200 (Qwen2.5-Omni-3B-sized, thinker
and talker warmed, 24 buckets each) it added 4.1 s to start-up and changed nothing in a run that
had warmed up before measuring (docs/benchmarks.md, "Thirteenth H200 session"); what it buys is
the first requests after a start. An adapter without `warmup_inputs` (its inputs come from an
upstream stage and it cannot make them up) keeps the lazy captures.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors import logs
from omni_actors.workers.engine import timed

log = logs.get(__name__)

WARMUP_ID = "__warmup__"
WARMUP_PARAMS = {"seed": 0, "max_tokens": 4, "temperature": 1.0}
"""Sampled (a greedy step may be queued ahead, hf_ar_lookahead.py) and short."""


def warm_wanted(engine: Any) -> bool:
    """engine_extras["warm_graphs"] (default: the adapter's `warm_graphs`), checked; only where graphs are on."""
    value = engine.ctx.engine_extras.get("warm_graphs", engine.adapter.warm_graphs)
    if not isinstance(value, bool):
        raise ValueError(f"engine_extras.warm_graphs: expected true or false, got {value!r}")
    graphs = engine.graphs
    return value and graphs is not None and graphs.enabled


def warm_compiled(engine: Any) -> int:
    """The fused step's symbolic compiles done now (compile_dynamic): one warm-up request's prefill
    and decode size the slot buffers (and compile batch 1), then FusedDecoder.warm_compile runs the
    compiled layer at buckets that meet every recompile. The shapes run (0: no warm-up inputs, or it failed,
    logged: then the compiles happen at first use)."""
    inputs = engine.adapter.warmup_inputs()
    if inputs is None or engine.fused is None:
        return 0
    ran = 0
    # No duck sizing: a batch or a length that equals some other size at the first trace (2 KV
    # heads, a head dim of 64) would be tied to it and compiled again when they differ.
    from torch.fx.experimental import _config as shapes

    with timed(engine.ctx, "compile"), shapes.patch(use_duck_shape=False):
        engine.add(WARMUP_ID, inputs, dict(WARMUP_PARAMS))
        try:
            engine.step()  # its prefill (which allocates the slot buffers)
            engine.fused.mark_static_inputs()
            engine.step()  # one decode step
            ran = engine.fused.warm_compile()
        except Exception as err:  # an optimisation: what is not compiled now compiles at first use
            log.warning("hf_ar.warm_failed", reason=f"{type(err).__name__}: {err}"[:300])
        finally:
            engine.abort(WARMUP_ID)
            engine.ahead = None
    log.info("hf_ar.compiled_at_load", shapes=ran)
    return ran


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
            with torch.inference_mode():  # as in a step: the slot buffers are inference tensors
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
