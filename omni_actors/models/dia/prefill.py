"""Dia's prompt forward for every waiting request at once: one encoder + decoder-prefill pass over right-padded rows.

A request has two rows: its text, and an all-pad text of the same length (classifier-free
guidance), both fed its decoder prompt (bos, then a reference clip's delayed codes,
request.py). Rows are right-padded: texts to the longest text, with an attention mask
that hides the padding from the encoder's self-attention and from the decoder's
cross-attention (transformers' DiaModel gives the one mask to both); prompts to the
longest prompt, where the decoder's causal mask already keeps a row's real positions
from the padding after them. Real positions count from 0 in every row, as alone, so
nothing moves: each request then takes its own cut of the batch's cache (self K/V of its
prompt positions, cross K/V and encoder states of its text positions) and the hidden
state of its last real prompt position. A single request runs exactly the forward it
ran alone (no padding, all-ones mask).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.models.dia.request import DiaRequest, Tokens


def prefill(model: Any, reqs: list[DiaRequest], tok: Tokens, device: torch.device) -> torch.Tensor:
    """Run reqs' prompts in one forward; set each one's self_kv, cross_kv, encoded (and positions).

    Returns the [2 * len(reqs), hidden] decoder states of each row's last prompt position
    (rows 2i, 2i + 1: request i's conditioned and unconditioned rows).
    """
    prompts = [r.prompt(tok) for r in reqs]  # [known, channels] each; sets r.positions
    texts, known = [len(r.text_ids) for r in reqs], [len(p) for p in prompts]
    rows, width, longest = 2 * len(reqs), max(texts), max(known)
    ids = torch.zeros(rows, width, dtype=torch.long)  # unconditioned rows: all 0, as alone
    mask = torch.zeros(rows, width, dtype=torch.long)
    decoder = torch.full((rows, longest, prompts[0].shape[1]), tok.pad, dtype=torch.long)
    for i, (req, t, prompt) in enumerate(zip(reqs, texts, prompts, strict=True)):
        ids[2 * i, :t] = torch.tensor(req.text_ids, dtype=torch.long)
        mask[2 * i : 2 * i + 2, :t] = 1
        decoder[2 * i : 2 * i + 2, : len(prompt)] = torch.from_numpy(np.asarray(prompt))
    out = model.model(
        input_ids=ids.to(device), attention_mask=mask.to(device),
        decoder_input_ids=decoder.to(device), use_cache=True,
    )  # fmt: skip
    cache = out.past_key_values
    own = [(x.keys, x.values) for x in cache.self_attention_cache.layers]
    cross = [(x.keys, x.values) for x in cache.cross_attention_cache.layers]
    encoded = out.encoder_last_hidden_state
    for i, (req, t, n) in enumerate(zip(reqs, texts, known, strict=True)):
        r = slice(2 * i, 2 * i + 2)
        # copies: a request may outlive the batch's cache by far (the dynamic path keeps these)
        req.self_kv = [(k[r, :, :n].clone(), v[r, :, :n].clone()) for k, v in own]
        req.cross_kv = [(k[r, :, :t].clone(), v[r, :, :t].clone()) for k, v in cross]
        req.encoded = encoded[r, :t].clone()
    last = torch.tensor(known, device=device).repeat_interleave(2) - 1
    return out.last_hidden_state[torch.arange(rows, device=device), last]
