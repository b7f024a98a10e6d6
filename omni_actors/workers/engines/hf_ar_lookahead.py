"""Decode one step ahead: HfAREngine queues step N+1 on the GPU before the host takes step N.

Without it a static decode step is: write the inputs, replay the graph, wait for
the ids, then the host's share (the adapter's payloads, stop checks, the worker
sending them, the next step's inputs) while the GPU sits idle. At batch 1 on a
small model that host share is a tenth or more of a step. With lookahead
(`engine_extras["lookahead"]`, default on CUDA for adapters whose decode input is the
last token's embedding; on a CPU nothing would run while the host works), once step N is
queued the engine queues, behind it, the copies of N's ids and payload tensors
to pinned host memory, then N+1's inputs written on the device from N's ids
(ids, lengths + 1, positions + 1) and N+1's replay; only then does the host wait,
for N's copies alone, and do its share while N+1 runs. The next `step()` queues
N+2 from N+1 the same way and takes N+1. Outputs are the same tokens in the same
order as without it; a step is at most one GPU step "early", never late.

A step is queued ahead only when its outcome cannot depend on the host's share
of the step before: every row greedy with raw logits (the ids are the step's own
argmax), the step's input the embedding of those ids (embedded on the device, or
by the fused step itself), the same requests holding every
slot, no request waiting to be prefilled, no row at its max_tokens, room in
every row's KV, and (with graphs) the bucket already captured. Whatever changes the slots while a step is
ahead (a request finishing or aborted: its slot is given back and the last slot's
request moves into it) throws that step away before the move; its rows are
computed again from the host's state, which rewrites the same KV positions.

An adapter that draws its own steps (`draws_ahead`: Higgs-Audio-V2, whose sampler draws all
codebooks on the device with counter-based noise) takes part with sampled rows too: its
`queue_draw` queues a step's draw behind the step, `write_next` writes the next step's inputs
and its own sampling state from that draw on the device, and `take_draw` does the host's
share. A row's draws are a function of its key and step, so queued ahead or not they are
the same codes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_adapter import ARSeq, ForwardOut


@dataclass
class InFlight:
    """A decode step queued on the device whose ids the host has not taken yet."""

    seqs: list[ARSeq]
    """The rows, in order (row i is seqs[i], in slot rows[i])."""
    rows: torch.Tensor | slice
    cached: list[int]
    """Each row's KV positions once this step is taken (its write was at cached - 1)."""
    tokens: torch.Tensor | None
    """The step's ids [rows] on the device (the next step's inputs); None when the adapter drew them."""
    host: ForwardOut
    """The ids and the adapter's per-row tensors, copied to the host behind the step."""
    done: torch.cuda.Event | None
    """Recorded after those copies (None off CUDA: the copies were plain)."""
    drawn: Any = None
    """The adapter's queued draw of the step (`ARAdapter.queue_draw`), for an adapter that draws."""

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()


def queue(
    out: ForwardOut, seqs: list[ARSeq], rows: torch.Tensor | slice, cached: list[int], drawn: Any = None
) -> InFlight:
    """An InFlight for a step just queued (`out`: its rows' outputs; `drawn`: the adapter's queued
    draw of it, if it draws): its ids and per-row tensors go to pinned host memory without
    blocking, then an event marks them."""
    assert out.tokens is not None or drawn is not None
    cuda = out.logits.is_cuda
    host = ForwardOut(logits=None, hidden=_to_host(out.hidden), tokens=_to_host(out.tokens))  # type: ignore[arg-type]
    done = None
    if cuda:
        done = torch.cuda.Event()
        done.record()
    return InFlight(seqs, rows, cached, out.tokens, host, done, drawn)


def chain_next(engine: Any, fl: InFlight) -> InFlight | None:
    """Queue on HfAREngine `engine` the step after `fl` for the same rows, when nothing the host
    does with fl's ids can change it (see the module docstring); None otherwise."""
    slots, graphs, seqs = engine.slots, engine.graphs, fl.seqs
    if len(slots.owners) != len(seqs) or any(s.slot is None for s in seqs):
        return None  # another request holds a slot (waiting for input), or one was dropped
    if max(fl.cached) >= engine.max_len:  # the next write would be past a row's KV
        return None
    ready = engine.adapter.ready
    waiting = any(not s.prefilled and not s.finished and ready(s) for s in engine.seqs.values())
    if waiting and len(slots.owners) < max(1, engine.ctx.max_num_seqs):
        return None  # a prefill goes first
    ends = [len(s.tokens) + 1 >= int(s.params.get("max_tokens") or engine.default_max_tokens) for s in seqs]
    if any(ends):
        return None  # a row ends with fl: its slot goes back, which would throw the next step away
    if not all(s.input_done and ready(s) for s in seqs):
        return None  # (a request still fed input may take it at its next step)
    batch, length = slots.shape_for(max(fl.cached))
    if graphs.enabled and (batch, length) not in graphs.graphs:
        return None  # a capture syncs anyway; the host path captures it
    adapter = engine.adapter
    if fl.drawn is not None:  # the adapter writes the inputs its draw makes
        adapter.write_next(slots, fl.rows, fl.drawn)
    else:
        from_ids = engine.fused is not None and engine.fused.from_ids
        write_next_inputs(slots, fl, None if from_ids else adapter.embed_ids)
    _next_positions(slots, fl)
    out = graphs.run(batch, length).rows(fl.rows)
    drawn = None if fl.drawn is None else adapter.queue_draw(seqs, out, fl.drawn)
    return queue(out, seqs, fl.rows, [c + 1 for c in fl.cached], drawn)


def write_next_inputs(slots: Any, fl: InFlight, embed: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """The inputs of the step after `fl` for the same rows, on the device: its ids are fl's ids;
    `embed` (ids [rows, 1] -> embeddings) fills the step's embeddings, None when the step embeds
    the ids itself."""
    assert fl.tokens is not None
    slots.ids[fl.rows] = fl.tokens
    if embed is not None:
        slots.embeds[fl.rows] = embed(fl.tokens[:, None]).to(slots.embeds.dtype)


def _next_positions(slots: Any, fl: InFlight) -> None:
    """Each of fl's rows one KV position and one rotary position further."""
    slots.lengths[fl.rows] += 1
    slots.positions[:, fl.rows, 0] += 1


def _to_host(x: Any) -> Any:
    """Tensors (also inside tuples, lists, dicts) as host copies; queued without blocking on CUDA
    (the destination is pinned), cloned elsewhere (a later step may reuse the storage)."""
    if isinstance(x, torch.Tensor):
        return x.to("cpu", non_blocking=True) if x.is_cuda else x.clone()
    if isinstance(x, tuple | list):
        return type(x)(_to_host(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_host(v) for k, v in x.items()}
    return x
