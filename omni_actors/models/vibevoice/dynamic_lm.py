"""VibeVoice's LM over dynamic per-request KV (engine_extras.kv_cache "dynamic", the default on CPU).

Each request keeps both branches' K/V as tensors of its own length; a step left-pads
the rows' K/V to the longest, stacks them into one transformers DynamicCache with the
mask that says so (HfAREngine's CPU cache), runs one position through transformers'
Qwen2, and cuts each row's K/V back out.
"""

from __future__ import annotations

from typing import Any

import torch


def step_rows(lm: Any, kvs: list[list[tuple[torch.Tensor, torch.Tensor]]], embeds: torch.Tensor):
    """One position for rows with their own KV (left-padded and stacked); their last states and new KV."""
    from transformers import DynamicCache

    lengths = [kv[0][0].shape[2] if kv else 0 for kv in kvs]
    longest = max(lengths)
    cache = DynamicCache()
    if longest:
        ref = next(kv for kv in kvs if kv)
        for layer in range(len(ref)):
            keys = torch.cat(
                [_left(kv[layer][0] if kv else None, ref[layer][0], longest) for kv in kvs]
            )
            values = torch.cat(
                [_left(kv[layer][1] if kv else None, ref[layer][1], longest) for kv in kvs]
            )
            cache.update(keys, values, layer)
    rows = len(kvs)
    mask = torch.zeros(rows, longest + 1, dtype=torch.long, device=embeds.device)
    for row, n in enumerate(lengths):
        mask[row, longest - n :] = 1
    pos = torch.tensor(lengths, device=embeds.device)[:, None]
    out = lm(inputs_embeds=embeds[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache,
             use_cache=True)  # fmt: skip
    new = [
        [(x.keys[r : r + 1, :, longest - n :].clone(), x.values[r : r + 1, :, longest - n :].clone())
         for x in cache.layers]
        for r, n in enumerate(lengths)
    ]  # fmt: skip
    return out.last_hidden_state[:, -1], new


def _left(x: torch.Tensor | None, like: torch.Tensor, length: int) -> torch.Tensor:
    if x is None:
        return like.new_zeros(1, like.shape[1], length, like.shape[3])
    pad = length - x.shape[2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=2)
