"""VibeVoice's Qwen2 LM over a static slot KV cache: one fixed-shape step per bucket and branch, a CUDA graph each on CUDA.

Every running request holds a slot, and a slot is two LM rows: row `slot` is its
conditioned branch (the prompt and everything since), row `slots + slot` its guidance
branch (audio bos, then the same audio inputs, no text). Per LM layer, preallocated
K/V buffers [2 * slots, kv_heads, max_len, head_dim] hold both; a prefill copies its
K/V into the conditioned row, and every step writes one position per row at the row's
own length (a scatter: no host sync).

The two branches step separately, as the engine needs: the conditioned branch of every
slot first (its last state picks the next token), then, once the tokens are known, the
guidance branch of every slot (read only for the requests making audio). Both read
their input from one buffer `embeds` [slots, hidden]: what the conditioned branch
consumes this step is what the guidance branch consumes on an audio step (a request
prefilled in this step has audio bos there, the guidance branch's first input). A
step runs the decoder layers of transformers' Qwen2 (its norms, projections, rotary
embedding, MLPs) over the first L positions of rows 0 .. B - 1 of its branch, masked
per row to its own length, and writes the final states into `states[branch]`. Its
shapes depend only on (branch, batch bucket B, window L), so on CUDA each is captured
once and replayed (DecodeGraphs; eager on CPU or with engine_extras.cuda_graphs false,
over the same buffers). Slots stay compact: a request that ends or is aborted gives
its slot back and the last slot's request moves into it. Rows of a bucket without a
request (and guidance rows of requests not making audio) still compute and are never
read: they write a position that a real step writes again before anything reads it.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.vibevoice.request import VibeVoiceRequest
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs
from omni_actors.workers.engines.hf_ar_slots import (
    additive_mask,
    attend_one,
    bucket_for,
    buckets,
    project_one,
    write_one,
)

MIN_WINDOW = 128
"""Shortest K/V window a step reads; windows double up to max_len."""
COND, GUIDE = 0, 1
"""The two branches (rows 0 .. slots - 1 and slots .. 2 * slots - 1)."""


class StaticLM:
    """Slot buffers, slot assignment and the fixed-shape LM step of both branches (module docstring)."""

    def __init__(
        self, lm: Any, slots: int, max_len: int, graphs: bool, device: torch.device
    ) -> None:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        cfg = lm.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(
                f"vibevoice static KV: only full attention layers, the LM has {sorted(kinds)}"
            )
        self.rotate, self.lm = apply_rotary_pos_emb, lm
        self.slots, self.max_len, self.device = slots, max_len, device
        attn = lm.layers[0].self_attn
        self.head_dim = attn.head_dim
        dt, kw = lm.dtype, {"dtype": lm.dtype, "device": device}
        shape = (2 * slots, cfg.num_key_value_heads, max_len, self.head_dim)
        self.keys = [torch.zeros(shape, **kw) for _ in lm.layers]
        self.values = [torch.zeros(shape, **kw) for _ in lm.layers]
        self.embeds = torch.zeros(slots, cfg.hidden_size, **kw)
        """Per slot: the next input of the conditioned branch (and of the guidance branch on an audio step)."""
        self.states = torch.zeros(2, slots, cfg.hidden_size, **kw)
        """Per branch and slot: the last step's final state (states[COND]: the diffusion head's condition)."""
        self.lengths = torch.zeros(2, slots, dtype=torch.long, device=device)
        """Per branch and slot: positions fed so far (the new position's id, where its K/V goes)."""
        pinned = device.type == "cuda"
        self.host = [torch.zeros(slots, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.owners: list[VibeVoiceRequest] = []
        """owners[i] holds slot i (compact)."""
        self.batch_sizes = buckets(slots, 1)
        self.windows = buckets(max_len, min(MIN_WINDOW, max_len))
        self.dtype = dt
        self.graphs = [
            DecodeGraphs(lambda batch, w, b=branch: self._forward(b, batch, self.windows[w]), graphs,
                         buckets=len(self.batch_sizes) * len(self.windows))
            for branch in (COND, GUIDE)
        ]  # fmt: skip

    # ---- slots -------------------------------------------------------------

    @torch.inference_mode()
    def store(self, req: VibeVoiceRequest, first: torch.Tensor) -> None:
        """Give req a slot: copy its prefill K/V (per layer [1, heads, n, dim]) and last state in;
        `first` [hidden] is the guidance branch's first input (audio bos)."""
        assert req.kv is not None and req.hidden is not None
        slot = len(self.owners)
        n = req.kv[0][0].shape[2]
        for i, (k, v) in enumerate(req.kv):
            self.keys[i][slot, :, :n] = k[0]
            self.values[i][slot, :, :n] = v[0]
        self.states[COND, slot] = req.hidden
        self.embeds[slot] = first
        req.kv = req.hidden = None  # the slot holds them now
        req.slot, req.length, req.neg_length = slot, n, 0
        self.owners.append(req)

    @torch.inference_mode()
    def release(self, req: VibeVoiceRequest) -> tuple[int, int] | None:
        """Give req's slot back; the last slot's request moves into it: (to, from), None if none moved."""
        if req.slot is None:
            return None
        hole, last = req.slot, len(self.owners) - 1
        moved = self.owners.pop()
        req.slot = None
        if hole == last:
            return None
        for src, dst, n in (
            (last, hole, moved.length),
            (self.slots + last, self.slots + hole, moved.neg_length),
        ):
            for buf in (*self.keys, *self.values):
                buf[dst, :, :n] = buf[src, :, :n]
        self.embeds[hole] = self.embeds[last]
        self.states[:, hole] = self.states[:, last]
        moved.slot = hole
        self.owners[hole] = moved
        return hole, last

    # ---- steps -------------------------------------------------------------

    def batch(self) -> int:
        """The batch bucket holding every slot in use."""
        return bucket_for(len(self.owners), self.batch_sizes)

    @torch.inference_mode()
    def step(self, branch: int, stepped: list[VibeVoiceRequest]) -> None:
        """One position of `branch` for every slot in use (read for `stepped` only, whose lengths advance);
        the states land in states[branch]."""
        batch, host = self.batch(), self.host[branch]
        host[:batch] = 0
        for req in self.owners:
            host[req.slot] = req.length if branch == COND else req.neg_length
        longest = int(host[:batch].max())
        self.lengths[branch, :batch].copy_(host[:batch], non_blocking=True)
        self.graphs[branch].run(batch, self.windows.index(bucket_for(longest + 1, self.windows)))
        for req in stepped:
            if branch == COND:
                req.length += 1
            else:
                req.neg_length += 1

    def _forward(self, branch: int, batch: int, span: int) -> None:
        """The fixed-shape step of `branch`'s rows 0 .. batch - 1 over `span` K/V positions."""
        lm, base = self.lm, branch * self.slots
        lengths = self.lengths[branch, :batch]
        hidden = self.embeds[:batch, None]  # [batch, 1, hidden]
        cos, sin = lm.rotary_emb(hidden, position_ids=lengths[:, None])
        mask = additive_mask(torch.arange(span, device=self.device)[None] > lengths[:, None], hidden.dtype)
        for i, layer in enumerate(lm.layers):
            attn = layer.self_attn
            q, k, v = project_one(attn, layer.input_layernorm(hidden), self.head_dim)
            q, k = self.rotate(q, k, cos, sin)
            keys = self.keys[i][base : base + batch, :, :span]
            values = self.values[i][base : base + batch, :, :span]
            write_one(keys, values, lengths, k, v)
            hidden = hidden + attn.o_proj(attend_one(q, keys, values, mask, attn.scaling))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.states[branch, :batch].copy_(lm.norm(hidden)[:, 0])
