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
5. a draw per channel: argmax when greedy, else a multinomial draw from the
   request's own generator (a seeded request gives the same audio alone or batched).

Forcing the other channels' end after channel 0's (the delay pattern) is the
request's business (request.py), as are the prompt positions the delay fixes.
"""

from __future__ import annotations

from typing import Any

import torch

NEG = float("-inf")


def draw(
    cond: torch.Tensor,
    uncond: torch.Tensor,
    params: list[dict[str, Any]],
    generators: list[torch.Generator | None],
    eos: int,
) -> torch.Tensor:
    """[n, channels, vocab] conditioned and unconditioned logits -> [n, channels] ids."""
    cond, uncond = cond.float(), uncond.float()
    rows = []
    for i, p in enumerate(params):
        scores = _guided(
            cond[i], uncond[i], float(p.get("guidance_scale") or 1.0), int(p.get("top_k") or 0)
        )
        temp = float(p.get("temperature") or 0.0)
        greedy = temp <= 0.0
        if not greedy and temp > 1.0:
            scores = scores / temp
        scores = _end_rule(scores, eos)
        if greedy:
            rows.append(scores.argmax(dim=-1))
            continue
        scores = _top_k(scores, int(p.get("top_k") or 0))
        scores = _top_p(scores, float(p.get("top_p") or 1.0))
        probs = torch.softmax(scores, dim=-1)
        g = generators[i]
        rows.append(
            torch.multinomial(probs, 1, generator=g)[:, 0]
            if g is not None
            else torch.multinomial(probs, 1)[:, 0]
        )
    return torch.stack(rows)


def _guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float, top_k: int) -> torch.Tensor:
    if scale <= 1.0:
        return cond
    guided = cond + (cond - uncond) * scale
    if top_k <= 0:
        return guided
    keep = torch.zeros_like(guided, dtype=torch.bool)
    keep.scatter_(-1, guided.topk(min(top_k, guided.shape[-1]), dim=-1).indices, True)
    return cond.masked_fill(~keep, NEG)


def _end_rule(scores: torch.Tensor, eos: int) -> torch.Tensor:
    scores = scores.clone()
    scores[1:, eos:] = NEG
    scores[0, eos + 1 :] = NEG
    best = scores.argmax(dim=-1)
    ends = best == eos
    scores[ends, :eos] = NEG
    scores[~ends, eos] = NEG
    return scores


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    floor = scores.topk(k, dim=-1).values[:, -1:]
    return scores.masked_fill(scores < floor, NEG)


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of best ids whose probability reaches top_p (at least one)."""
    if top_p >= 1.0:
        return scores
    ordered, order = scores.sort(dim=-1, descending=False)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= (1.0 - top_p)
    drop[:, -1] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), NEG)
