"""Token sampling for HfAREngine: all rows of a step at once, on the logits' device.

Greedy rows (temperature 0) take one batched argmax; sampled rows are filtered
(temperature, top-k, top-p) together in sorted order, then each row with a
seed draws from its own generator (so a seeded request is reproducible on
its own), the others draw together. The repetition penalty reads each
request's `seen` mask. One host sync per step: the final `.tolist()`.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_adapter import ARSeq


def _temperature(params: dict[str, Any]) -> float:
    return float(params.get("temperature", 0.0) or 0.0)


def _penalty(params: dict[str, Any]) -> float:
    return float(params.get("repetition_penalty") or 1.0)


def sample_rows(logits: torch.Tensor, seqs: list[ARSeq]) -> list[int]:
    """One token per row of [batch, vocab] float32 logits, row i for seqs[i]."""
    dev = logits.device
    params = [s.params for s in seqs]
    penalties = [_penalty(p) for p in params]
    if any(p != 1.0 and s.seen is not None for p, s in zip(penalties, seqs, strict=True)):
        none = torch.zeros(logits.shape[1], dtype=torch.bool, device=dev)
        seen = torch.stack([s.seen if s.seen is not None else none for s in seqs])
        pen = torch.tensor(penalties, device=dev, dtype=logits.dtype)[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / pen, logits * pen), logits)
    temps = [_temperature(p) for p in params]
    picked = torch.argmax(logits, dim=-1)
    rows = [i for i, t in enumerate(temps) if t > 0.0]
    if rows:
        index = torch.tensor(rows, device=dev)
        drawn = _draw(logits[index], [seqs[i] for i in rows], [temps[i] for i in rows])
        picked = picked.index_copy(0, index, drawn)
    return picked.tolist()


def _draw(logits: torch.Tensor, seqs: list[ARSeq], temps: list[float]) -> torch.Tensor:
    """Sampled ids for rows that all have a temperature."""
    dev, vocab = logits.device, logits.shape[1]
    logits = logits / torch.tensor(temps, device=dev, dtype=logits.dtype)[:, None]
    top_k = [int(s.params.get("top_k") or 0) for s in seqs]
    top_p = [float(s.params.get("top_p") or 1.0) for s in seqs]
    order = None
    if any(0 < k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        logits, order = torch.sort(logits, dim=-1, descending=True)
        ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=dev)
        ranks = torch.arange(vocab, device=dev)[None]
        logits = logits.masked_fill(ranks >= ks[:, None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ps = torch.tensor(top_p, device=dev, dtype=probs.dtype)[:, None]
        logits = logits.masked_fill(probs.cumsum(-1) - probs > ps, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    free = [i for i, s in enumerate(seqs) if s.generator is None]
    out = torch.empty(len(seqs), dtype=torch.long, device=dev)
    if free:
        index = torch.tensor(free, device=dev)
        out[index] = torch.multinomial(probs[index], 1)[:, 0]
    for i, s in enumerate(seqs):
        if s.generator is not None:
            out[i] = torch.multinomial(probs[i], 1, generator=s.generator)[0]
    return out if order is None else order.gather(1, out[:, None])[:, 0]


def note_sampled(seqs: list[ARSeq], tokens: list[int], vocab: int, device: Any) -> None:
    """Mark sampled ids in `seen` of requests that use a repetition penalty."""
    for seq, tok in zip(seqs, tokens, strict=True):
        if _penalty(seq.params) != 1.0:
            if seq.seen is None:
                seq.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            seq.seen[tok] = True


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
    if generator is not None and generator.device != probs.device:
        probs = probs.cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
