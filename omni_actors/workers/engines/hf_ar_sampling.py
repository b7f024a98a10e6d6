"""Token sampling for HfAREngine: all rows of a step at once, on the logits' device.

Greedy rows (temperature 0) take one batched argmax; sampled rows are filtered
(temperature, top-k, top-p) together in sorted order, then each row with a
seed draws from its own generator (so a seeded request is reproducible on
its own), the others draw together. A seeded row's noise is one uniform draw of its
generator (rows that share one, a request's codebooks as Higgs-Audio-V2 draws them, one
draw for all of them), and all seeded rows take one batched Gumbel-max: a multinomial call
a row cost ~0.25 ms of host time each, 4 ms of a 16-row CSM step on an H200. The repetition penalty reads each
request's `seen` mask. `pick` returns ids on the device (no host sync, for
adapters that feed them straight back; its small host lists go to a GPU from pinned memory,
asynchronously); `sample_rows` syncs once, in `.tolist()`.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_adapter import ARSeq


def small_tensor(values: list[Any], dev: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A short host list as a tensor on `dev`. On CUDA it goes from pinned memory without
    blocking: a copy from pageable memory first waits for the stream's queued work (the step's
    forward), which would stall the host before it has queued the sampling kernels."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(dev).type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def _temperature(params: dict[str, Any]) -> float:
    return float(params.get("temperature", 0.0) or 0.0)


def _penalty(params: dict[str, Any]) -> float:
    return float(params.get("repetition_penalty") or 1.0)


def all_greedy(seqs: list[ARSeq]) -> bool:
    """True when every row's token is the argmax of its logits (temperature 0, no repetition
    penalty): then `sample_rows` would return exactly the rows' argmax."""
    return all(_temperature(s.params) <= 0.0 and _penalty(s.params) == 1.0 for s in seqs)


def sample_rows(logits: torch.Tensor, seqs: list[ARSeq]) -> list[int]:
    """One token per row of [batch, vocab] float32 logits, row i for seqs[i] (its own params);
    each sampled id is marked in `seen` of requests that use a repetition penalty."""
    return pick_rows(logits, seqs).tolist()


def pick_rows(logits: torch.Tensor, seqs: list[ARSeq]) -> torch.Tensor:
    """`sample_rows`' ids [batch], left on the logits' device (no host sync)."""
    params = [s.params for s in seqs]
    picked = pick(logits, params, [s.generator for s in seqs], [s.seen for s in seqs])
    _note_sampled(seqs, picked, logits.shape[1])
    return picked


def pick(
    logits: torch.Tensor,
    params: list[dict[str, Any]],
    generators: list[torch.Generator | None],
    seen: list[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """[batch] sampled ids on the logits' device, without a host sync (row i: params[i])."""
    dev = logits.device
    penalties = [_penalty(p) for p in params]
    if seen is not None and any(
        p != 1.0 and m is not None for p, m in zip(penalties, seen, strict=True)
    ):
        none = torch.zeros(logits.shape[1], dtype=torch.bool, device=dev)
        mask = torch.stack([m if m is not None else none for m in seen])
        pen = small_tensor(penalties, dev, logits.dtype)[:, None]
        logits = torch.where(mask, torch.where(logits > 0, logits / pen, logits * pen), logits)
    temps = [_temperature(p) for p in params]
    picked = torch.argmax(logits, dim=-1)
    rows = [i for i, t in enumerate(temps) if t > 0.0]
    if rows:
        index = small_tensor(rows, dev)
        drawn = _draw(
            logits[index], [params[i] for i in rows], [generators[i] for i in rows],
            [temps[i] for i in rows],
        )  # fmt: skip
        picked = picked.index_copy(0, index, drawn)
    return picked


def _draw(
    logits: torch.Tensor,
    params: list[dict[str, Any]],
    generators: list[torch.Generator | None],
    temps: list[float],
) -> torch.Tensor:
    """Sampled ids for rows that all have a temperature."""
    dev, vocab = logits.device, logits.shape[1]
    logits = logits / small_tensor(temps, dev, logits.dtype)[:, None]
    top_k = [int(p.get("top_k") or 0) for p in params]
    top_p = [float(p.get("top_p") or 1.0) for p in params]
    order = None
    ks = [k if 0 < k < vocab else vocab for k in top_k]
    width = max(ks)
    if width < vocab or any(p < 1.0 for p in top_p):
        if width < vocab:  # every row has a top-k: only the top `width` ranks can be drawn, so
            # only they are ranked (not a sort of the whole vocabulary: on a CPU most of a Higgs step)
            logits, order = torch.topk(logits, width, dim=-1)
        else:
            logits, order = torch.sort(logits, dim=-1, descending=True)
        ranks = torch.arange(width, device=dev)[None]
        logits = logits.masked_fill(ranks >= small_tensor(ks, dev)[:, None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ps = small_tensor(top_p, dev, probs.dtype)[:, None]
        logits = logits.masked_fill(probs.cumsum(-1) - probs > ps, float("-inf"))
    # Gumbel-max: argmax(logits + Gumbel noise) draws softmax(logits), masked ids never
    n = logits.shape[1]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(generators):
        if g is not None:
            groups.setdefault(id(g), []).append(i)
    u = _seeded_noise(groups, generators, len(params), vocab, dev)
    if u is not None:
        u = u[:, :n]
    else:
        free = any(g is None for g in generators)  # unseeded rows: noise for the ranks they kept
        u = torch.rand(len(params), n, device=dev) if free else torch.empty(len(params), n, device=dev)
        for rows in groups.values():  # a request's own noise (its rows: one, or its codebooks)
            index = rows[0] if len(rows) == 1 else small_tensor(rows, dev)
            u[index] = _uniform(generators[rows[0]], len(rows), vocab, dev)[:, :n].squeeze(0)
    out = torch.argmax(logits + gumbel_of(u), dim=-1)
    return out if order is None else order.gather(1, out[:, None])[:, 0]


def _seeded_noise(
    groups: dict[int, list[int]], generators: list[torch.Generator | None], batch: int, vocab: int,
    dev: torch.device,
) -> torch.Tensor | None:
    """[batch, vocab] noise when every row is seeded, each request's rows adjacent and its generator
    on `dev`: each request's draw is written in place (one call a request, not a draw, an index
    and a copy); the values are `_uniform`'s. None otherwise (the caller fills rows one by one)."""
    if sum(len(rows) for rows in groups.values()) != batch:
        return None
    for rows in groups.values():
        if rows[-1] - rows[0] + 1 != len(rows) or generators[rows[0]].device.type != dev.type:
            return None
    noise = torch.empty(batch, vocab, device=dev)
    for rows in groups.values():
        torch.rand((len(rows), vocab), generator=generators[rows[0]], device=dev, out=noise[rows[0] : rows[-1] + 1])
    return noise


def _uniform(generator: torch.Generator, rows: int, vocab: int, dev: torch.device) -> torch.Tensor:
    """[rows, vocab] uniform draws of one request's generator (its codebooks' rows, or its one row).
    The noise covers the whole vocabulary whatever the batch ranked, so a request's draws (and where
    its generator is left) do not depend on its batch mates; the sampled ids are distributed as
    multinomial draws of each row's filtered probabilities (Gumbel-max)."""
    return torch.rand((rows, vocab), generator=generator, device=generator.device).to(dev)


def fill_uniform(uniform: torch.Tensor, sampled: list[bool], generators: list[torch.Generator | None]) -> None:
    """Fill rows of a depth/predictor runner's [slots, ...] noise buffer for a frame: row i (sampled)
    from generators[i] when it has one (a seeded request's draws repeat alone or batched), the
    unseeded rows in one draw; rows not sampled are left as they are (their noise is zeroed later)."""
    shape, dev = uniform.shape[1:], uniform.device
    free = [i for i, (s, g) in enumerate(zip(sampled, generators, strict=True)) if s and g is None]
    if free and len(free) == len(sampled):  # every row: one draw into the first rows
        torch.rand(len(free), *shape, device=dev, out=uniform[: len(free)])
    elif free:
        uniform[free] = torch.rand(len(free), *shape, device=dev)
    for i, (s, g) in enumerate(zip(sampled, generators, strict=True)):
        if s and g is not None and g.device == dev:
            torch.rand(shape, generator=g, device=dev, out=uniform[i])
        elif s and g is not None:
            uniform[i].copy_(torch.rand(shape, generator=g, device=g.device))


def gumbel_of(uniform: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of uniform draws (clamped off 0 and 1): argmax(logits + it) samples softmax(logits)."""
    return -torch.log(-torch.log(uniform.clamp(1e-10, 1.0 - 1e-7)))


def _note_sampled(seqs: list[ARSeq], picked: torch.Tensor, vocab: int) -> None:
    """Mark sampled ids in `seen` (penalised requests), on the device: a host index would be
    one more transfer, which on a GPU shared with other processes waits for its time slice."""
    for i, seq in enumerate(seqs):
        if _penalty(seq.params) != 1.0:
            if seq.seen is None:
                seq.seen = torch.zeros(vocab, dtype=torch.bool, device=picked.device)
            seq.seen.index_fill_(0, picked[i : i + 1], True)


def sample(
    logits: torch.Tensor,
    params: dict[str, Any],
    history: list[int],
    generator: torch.Generator | None,
) -> int:
    """One token from a single [vocab] float32 row (for adapters' own small sampling loops)."""
    penalty = _penalty(params)
    if penalty != 1.0 and history:
        idx = torch.tensor(sorted(set(history)), device=logits.device)
        picked = logits[idx]
        logits = logits.clone()
        logits[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    temperature = _temperature(params)
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    top_k = int(params.get("top_k") or 0)
    if 0 < top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = float(params.get("top_p") or 1.0)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    if generator is not None and generator.device.type != probs.device.type:
        probs = probs.cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
