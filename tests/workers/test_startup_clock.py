"""workers.engine.timed: start-up phases add up per name and never overlap (an inner block counts
toward the outer phase only), so their sum fits in the time they span."""

from __future__ import annotations

import time
from types import SimpleNamespace

from omni_actors.workers.engine import EngineContext, timed

NAP_S = 0.02


def _ctx() -> EngineContext:
    return EngineContext(stage_id=0, replica=0, model_stage="x", model_path=None, device="cpu", max_num_seqs=1,
                         dtype="auto", gpu_memory_utilization=0.5, tensor_parallel_size=1)


def test_phases_add_up_by_name_and_nested_blocks_count_once() -> None:
    ctx = _ctx()
    t0 = time.perf_counter()
    with timed(ctx, "weights"):
        time.sleep(NAP_S)
        with timed(ctx, "config"):  # inside "weights": counted there, not again
            time.sleep(NAP_S)
    with timed(ctx, "weights"):
        time.sleep(NAP_S)
    span = time.perf_counter() - t0
    assert set(ctx.startup.phases) == {"weights"}
    assert 3 * NAP_S <= ctx.startup.phases["weights"] <= span


def test_a_failing_block_still_counts_and_contexts_do_not_share_clocks() -> None:
    ctx, other = _ctx(), _ctx()
    try:
        with timed(ctx, "weights"):
            raise ValueError("broken checkpoint")
    except ValueError:
        pass
    with timed(ctx, "config"):  # (the failed block left no phase open)
        pass
    assert set(ctx.startup.phases) == {"weights", "config"} and other.startup.phases == {}


def test_a_stand_in_context_without_a_clock_times_nothing() -> None:
    with timed(SimpleNamespace(device="cpu"), "weights"):
        pass
