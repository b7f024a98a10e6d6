"""Dia's sampling rules for one decode position of a batch of requests: guidance, end-of-audio rules, draws.

Per request the logits are [channels, vocab] for the conditioned row and for the
unconditioned row (the same decoder fed an all-pad text). In the order transformers'
Dia generation applies them:

1. classifier-free guidance (guidance_scale > 1): the guided logits
   `cond + (cond - uncond) * scale` choose the top_k candidates, whose *conditioned*
   logits are kept;
2. temperature (Dia clamps a temperature below 1 to 1; 0 means greedy here);
3. the end-of-audio channel rule: only channel 0 may say end (`eos_token_id`), no
   channel may say pad or bos; where channel 0's best id is the end it is the only
   candidate, else it is ruled out;
4. top-k, then top-p (nucleus) when sampling;
5. a draw per channel: argmax when greedy, else a Gumbel-max draw (distributed as a
   multinomial one) whose noise comes from the request's own generator (a seeded request
   gives the same audio alone or batched).

All steps run batched over the requests (their settings as per-request columns); only
the seeded requests' noise is drawn one request at a time.

Forcing the other channels' end after channel 0's (the delay pattern) is the
request's business (request.py), as are the prompt positions the delay fixes.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_sampling import gumbel_of

NEG = float("-inf")


def draw(
    cond: torch.Tensor,
    uncond: torch.Tensor,
    params: list[dict[str, Any]],
    generators: list[torch.Generator | None],
    eos: int,
) -> torch.Tensor:
    """[n, channels, vocab] conditioned and unconditioned logits -> [n, channels] ids.

    The rules run on all n requests at once, each with its own settings as a column of
    per-request values (no host sync: a batch of any size is a fixed number of kernels);
    only the seeded requests' noise is drawn request by request, each from its own generator.
    """
    cond, uncond = cond.float(), uncond.float()
    n, _, vocab = cond.shape
    dev = cond.device

    def column(values: list[float] | list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True).view(n, 1, 1)

    scales = [float(p.get("guidance_scale") or 1.0) for p in params]
    top_ks = [int(p.get("top_k") or 0) for p in params]
    temps = [float(p.get("temperature") or 0.0) for p in params]
    top_ps = [float(p.get("top_p") or 1.0) for p in params]
    scores = _guided(cond, uncond, scales, top_ks, column)
    if any(t > 1.0 for t in temps):
        scores = scores / column([t if t > 1.0 else 1.0 for t in temps])
    scores = _end_rule(scores, eos)
    sampled = [i for i, t in enumerate(temps) if t > 0.0]
    ids = scores.argmax(dim=-1)
    if not sampled:
        return ids
    ks = [k if 0 < k < vocab else vocab for k in top_ks]
    if min(ks) < vocab:
        scores = _top_k(scores, column(ks, torch.long))
    if min(top_ps) < 1.0:
        floors = column([1.0 - p for p in top_ps])  # in double first, as a Python float would be
        scores = _top_p(scores, floors, column([p < 1.0 for p in top_ps], torch.bool))
    # Gumbel-max: argmax(scores + Gumbel noise) draws softmax(scores); a seeded request's noise
    # comes from its own generator (one draw a request, not a multinomial call a request: those
    # cost ~0.25 ms of host time each on a GPU)
    u = torch.rand(cond.shape, device=dev) if any(generators[i] is None for i in sampled) else torch.empty_like(cond)
    for i in sampled:
        g = generators[i]
        if g is not None:
            u[i] = torch.rand(cond.shape[1:], generator=g, device=g.device).to(dev)
    drawn = torch.argmax(scores + gumbel_of(u), dim=-1)
    return torch.where(column([t > 0.0 for t in temps], torch.bool).view(n, 1), drawn, ids)


def _guided(cond, uncond, scales, top_ks, column) -> torch.Tensor:
    """Per request: cond (scale <= 1), the guided logits (no top_k), or cond on the guided top_k."""
    guided_rows = [s > 1.0 for s in scales]
    if not any(guided_rows):
        return cond
    guided = cond + (cond - uncond) * column(scales)
    vocab = cond.shape[-1]
    ks = [min(k, vocab) if g and k > 0 else 0 for g, k in zip(guided_rows, top_ks, strict=True)]
    widest = max(ks)
    out = torch.where(column(guided_rows, torch.bool), guided, cond)
    if widest == 0:
        return out
    index = guided.topk(widest, dim=-1).indices
    keep = torch.zeros_like(guided, dtype=torch.bool)
    ranks = torch.arange(widest, device=cond.device) < column(ks, torch.long)  # [n, 1, widest]
    keep.scatter_(-1, index, ranks.expand(index.shape))
    on_top = cond.masked_fill(~keep, NEG)
    return torch.where(column([k > 0 for k in ks], torch.bool), on_top, out)


def _end_rule(scores: torch.Tensor, eos: int) -> torch.Tensor:
    scores = scores.clone()
    scores[:, 1:, eos:] = NEG
    scores[:, 0, eos + 1 :] = NEG
    ends = (scores.argmax(dim=-1) == eos)[..., None]  # [n, channels, 1]
    ids = torch.arange(scores.shape[-1], device=scores.device)
    scores = scores.masked_fill(ends & (ids < eos), NEG)
    return scores.masked_fill(~ends & (ids == eos), NEG)


def _top_k(scores: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """Keep each request's ks best ids (ks = vocab: all); ties with the k-th are kept."""
    ordered = scores.sort(dim=-1, descending=True).values
    floor = ordered.gather(-1, (ks - 1).expand(*scores.shape[:-1], 1))
    return scores.masked_fill(scores < floor, NEG)


def _top_p(scores: torch.Tensor, floors: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of best ids whose probability reaches top_p = 1 - floors (at least one), on `rows`."""
    ordered, order = scores.sort(dim=-1, descending=False)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = (mass <= floors) & rows
    drop[..., -1] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), NEG)
